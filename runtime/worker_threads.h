#pragma once
// Running numbered items on several threads, without aborting when threads run out.
#include <cstddef>
#include <functional>
#include <thread>

namespace kiln {

using ThreadStarter = std::function<std::thread(const std::function<void()>&)>;

// Runs item(0) .. item(count - 1), each once, on up to `threads` threads that pull them in index
// order, and waits for them; with one thread (or one item) the calling thread runs them itself. An
// exception ends its item only: the first one is rethrown once every item has run. When the system
// refuses a thread (a container's pid limit, no memory for its stack), the threads already started
// do the rest, or the calling thread alone if none started: a std::thread that failed to start would
// otherwise leave the started ones joinable on unwind, and the process would end in std::terminate.
// `start` replaces std::thread's constructor in tests.
void run_items(std::size_t count, std::size_t threads, const std::function<void(std::size_t)>& item,
               const ThreadStarter& start = {});

}  // namespace kiln
