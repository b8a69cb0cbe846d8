#pragma once
#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/runtime/kernel_service.h"
#include "tools/bench/options.h"
#include "tools/bench/sparse_common.h"

namespace kiln::tools {

// `kiln bench sparse`: sparse NVFP4 MLA decode (runtime/sparse_nvfp4/README.md) over T in {1, 8, 64,
// 128, 512} x H in {64, 128} x candidates (topk 512; topk 2048; main 128 + extra 512), random
// indices over a >= 4 GB pool, L2-cold, against ceilings measured in the same run (copy bandwidth
// and an mma.sync bf16 peak, tools/bench/ceilings.h). Writes the JSON report to options.out (and
// stdout) and prints a compact table on stderr. --quick runs a 4-config subset.
int run_bench_sparse(const BenchOptions& options);

// One NVFP4 decode config timed as `kiln bench sparse` times it: its 4.5 GiB pool of 384-byte
// records (page 64), N calls with their own random indices in one CUDA graph, median replay / N,
// the launcher's own kernel and plan. For benches that put another decode beside it on the same
// configs (`kiln bench sparse_dsv41`).
struct SparseNvfp4Time {
  double us = 0, us_min = 0, us_max = 0;
  int calls = 0;
  std::string kernel;  // the launcher's pick ("mma", "mma_small", "sm90")
  int head_tiles = 1, num_splits = 1, chunks_per_block = 1;
};

class SparseNvfp4Timer {
 public:
  SparseNvfp4Timer(KernelService& service, CUstream stream);
  ~SparseNvfp4Timer();
  SparseNvfp4Timer(const SparseNvfp4Timer&) = delete;
  SparseNvfp4Timer& operator=(const SparseNvfp4Timer&) = delete;
  // Compiles and loads, in parallel, every key the calls of these configs launch.
  void warm(const std::vector<SparseShape>& configs);
  // The pool is made on the first call. Throws if the outputs are not finite after the warm-up replay.
  SparseNvfp4Time time(const SparseShape& config);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kiln::tools
