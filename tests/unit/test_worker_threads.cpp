// run_workers: every item is done once, however many of the requested threads the system grants.
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "kiln/runtime/worker_threads.h"

namespace {

// 1000 items pulled from a shared counter; records how often each item ran and on which threads.
struct Work {
  static constexpr int kItems = 1000;
  std::atomic<int> next{0};
  std::vector<std::atomic<int>> runs = std::vector<std::atomic<int>>(kItems);
  std::mutex mutex;
  std::set<std::thread::id> threads;

  void operator()() {
    for (int i = next++; i < kItems; i = next++) {
      ++runs[i];
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
    }
  }
  bool each_item_once() const {
    for (const auto& r : runs) {
      if (r.load() != 1) return false;
    }
    return true;
  }
};

// A starter that grants `granted` threads, then fails as pthread_create does when it runs out.
kiln::ThreadStarter granting(int granted, int& started) {
  return [granted, &started](const std::function<void()>& f) {
    if (started == granted) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    ++started;
    return std::thread(f);
  };
}

}  // namespace

TEST_CASE("run_workers: all requested threads", "[unit]") {
  Work work;
  int started = 0;
  kiln::run_workers(4, [&] { work(); }, granting(4, started));
  CHECK(started == 4);
  CHECK(work.each_item_once());
  CHECK(work.threads.count(std::this_thread::get_id()) == 0);  // the caller only waits
}

TEST_CASE("run_workers: the threads that started finish the work when the rest are refused", "[unit]") {
  Work work;
  int started = 0;
  kiln::run_workers(8, [&] { work(); }, granting(2, started));
  CHECK(started == 2);
  CHECK(work.each_item_once());
  CHECK(work.threads.size() <= 2);
  CHECK(work.threads.count(std::this_thread::get_id()) == 0);
}

TEST_CASE("run_workers: with no thread granted the caller does the work", "[unit]") {
  Work work;
  int started = 0;
  kiln::run_workers(8, [&] { work(); }, granting(0, started));
  CHECK(started == 0);
  CHECK(work.each_item_once());
  CHECK(work.threads == std::set<std::thread::id>{std::this_thread::get_id()});
}
