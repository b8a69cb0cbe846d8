// run_items: every item is done once, however many of the requested threads the system grants, and
// an item's exception reaches the caller only after every other item has run.
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "kiln/runtime/worker_threads.h"

namespace {

// Records how often each of 1000 items ran and on which threads.
struct Work {
  static constexpr std::size_t kItems = 1000;
  std::vector<std::atomic<int>> runs = std::vector<std::atomic<int>>(kItems);
  std::mutex mutex;
  std::set<std::thread::id> threads;

  void operator()(std::size_t i) {
    ++runs[i];
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
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

TEST_CASE("run_items: all requested threads", "[unit]") {
  Work work;
  int started = 0;
  kiln::run_items(Work::kItems, 4, [&](std::size_t i) { work(i); }, granting(4, started));
  CHECK(started == 4);
  CHECK(work.each_item_once());
  CHECK(work.threads.count(std::this_thread::get_id()) == 0);  // the caller only waits
}

TEST_CASE("run_items: the threads that started finish the work when the rest are refused", "[unit]") {
  Work work;
  int started = 0;
  kiln::run_items(Work::kItems, 8, [&](std::size_t i) { work(i); }, granting(2, started));
  CHECK(started == 2);
  CHECK(work.each_item_once());
  CHECK(work.threads.size() <= 2);
  CHECK(work.threads.count(std::this_thread::get_id()) == 0);
}

TEST_CASE("run_items: with no thread granted, or one asked for, the caller does the work", "[unit]") {
  for (const int granted : {0, 8}) {
    for (const std::size_t threads : {std::size_t{8}, std::size_t{1}}) {
      if (granted == 8 && threads == 8) continue;  // the first test case
      INFO("granted " << granted << ", threads " << threads);
      Work work;
      int started = 0;
      kiln::run_items(Work::kItems, threads, [&](std::size_t i) { work(i); }, granting(granted, started));
      CHECK(started == 0);
      CHECK(work.each_item_once());
      CHECK(work.threads == std::set<std::thread::id>{std::this_thread::get_id()});
    }
  }
}

TEST_CASE("run_items: a failing item ends only itself and the first failure is rethrown after all ran", "[unit]") {
  for (const std::size_t threads : {std::size_t{1}, std::size_t{4}}) {
    INFO("threads " << threads);
    Work work;
    try {
      kiln::run_items(Work::kItems, threads, [&](std::size_t i) {
        work(i);
        if (i % 100 == 7) throw std::runtime_error("item " + std::to_string(i));
      });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).rfind("item ", 0) == 0);
    }
    CHECK(work.each_item_once());
  }
  // Fewer items than threads: one thread per item at most.
  Work few;
  int started = 0;
  kiln::run_items(3, 8, [&](std::size_t i) { few(i); }, granting(8, started));
  CHECK(started == 3);
}
