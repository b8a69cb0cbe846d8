#pragma once
#include <cuda.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/tensor_view.h"
#include "tools/bench/ceilings.h"
#include "tools/bench/options.h"

namespace kiln::tools {

// One decode call's shape: T tokens, H heads, topk main and extra_topk extra candidates.
struct SparseNvfp4Config {
  int tokens = 1, heads = 64, topk = 512, extra_topk = 0;
};

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

// The per-call buffers of a timed sparse decode (NVFP4 or DeepSeek-V4.1: the same Q, output, LSE and
// split scratch): Q filled with bf16 values, output and out_lse poisoned with NaN, mid_out/mid_lse
// for `splits` > 1.
class SparseCallBuffers {
 public:
  SparseCallBuffers(int tokens, int heads, int topk, int splits, const std::string& where);
  TensorView q() const;
  TensorView output() const;
  TensorView out_lse() const;
  std::optional<TensorView> mid_out() const;
  std::optional<TensorView> mid_lse() const;
  // NaN/Inf values among the outputs and LSEs (none when every row had a valid candidate).
  std::size_t nonfinite(const std::string& where) const;

 private:
  int tokens_, heads_, splits_;
  BenchDeviceMemory q_, out_, lse_;
  std::optional<BenchDeviceMemory> mid_out_, mid_lse_;
};

class SparseNvfp4Timer {
 public:
  SparseNvfp4Timer(KernelService& service, CUstream stream);
  ~SparseNvfp4Timer();
  SparseNvfp4Timer(const SparseNvfp4Timer&) = delete;
  SparseNvfp4Timer& operator=(const SparseNvfp4Timer&) = delete;
  // Compiles and loads, in parallel, every key the calls of these configs launch.
  void warm(const std::vector<SparseNvfp4Config>& configs);
  // The pool is made on the first call. Throws if the outputs are not finite after the warm-up replay.
  SparseNvfp4Time time(const SparseNvfp4Config& config);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kiln::tools
