#pragma once
// CPU references are the slow part of a GPU test case: they run over independent (token, head block)
// units on every core.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace kiln::testing {

// fn(t, h0, hn) for every token t and block of hn <= 16 heads starting at h0, on up to
// hardware_concurrency threads (the caller's among them); returns when all are done.
template <class Fn>
void parallel_head_blocks(int tokens, int heads, const Fn& fn) {
  constexpr int kHeadBlock = 16;
  const int blocks = (heads + kHeadBlock - 1) / kHeadBlock;
  const int units = tokens * blocks;
  std::atomic<int> next{0};
  const auto work = [&] {
    for (int u = next++; u < units; u = next++) {
      const int h0 = (u % blocks) * kHeadBlock;
      fn(u / blocks, h0, std::min(kHeadBlock, heads - h0));
    }
  };
  const int threads = std::max(1, std::min<int>(units, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
}

}  // namespace kiln::testing
