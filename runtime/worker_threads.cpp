#include "kiln/runtime/worker_threads.h"

#include <system_error>
#include <vector>

#include "kiln/jit/log.h"

namespace kiln {

void run_workers(std::size_t count, const std::function<void()>& worker, const ThreadStarter& start) {
  std::vector<std::thread> pool;
  pool.reserve(count);  // no reallocation below: a push_back cannot fail after its thread started
  try {
    for (std::size_t i = 0; i < count; ++i) pool.push_back(start ? start(worker) : std::thread(worker));
  } catch (const std::system_error& e) {
    log_warn("started {} of {} worker threads ({}); they share the rest of the work", pool.size(), count, e.what());
  }
  if (pool.empty()) worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace kiln
