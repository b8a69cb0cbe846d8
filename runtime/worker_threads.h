#pragma once
// Running a work-pulling function on several threads, without aborting when threads run out.
#include <cstddef>
#include <functional>
#include <thread>

namespace kiln {

using ThreadStarter = std::function<std::thread(const std::function<void()>&)>;

// Runs `worker` on `count` threads and waits for them. Each worker pulls items until none are left,
// so fewer threads only take longer: when the system refuses a thread (a container's pid limit, no
// memory for its stack) the threads already started finish the work, or the calling thread does it
// alone if none started. A std::thread that failed to start would otherwise leave the started ones
// joinable on unwind, and the process would end in std::terminate. `start` replaces std::thread's
// constructor in tests.
void run_workers(std::size_t count, const std::function<void()>& worker, const ThreadStarter& start = {});

}  // namespace kiln
