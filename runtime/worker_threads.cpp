#include "kiln/runtime/worker_threads.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <vector>

#include "kiln/jit/log.h"

namespace kiln {

void run_items(std::size_t count, std::size_t threads, const std::function<void(std::size_t)>& item,
               const ThreadStarter& start) {
  std::atomic<std::size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  const std::function<void()> worker = [&] {
    for (std::size_t i = next++; i < count; i = next++) {
      try {
        item(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  threads = std::min(threads, count);
  std::vector<std::thread> pool;
  if (threads > 1) {
    pool.reserve(threads);  // no reallocation below: a push_back cannot fail after its thread started
    try {
      for (std::size_t i = 0; i < threads; ++i) pool.push_back(start ? start(worker) : std::thread(worker));
    } catch (const std::system_error& e) {
      log_warn("started {} of {} worker threads ({}); they share the rest of the work", pool.size(), threads, e.what());
    }
  }
  if (pool.empty()) worker();
  for (std::thread& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kiln
