#pragma once
// The bf16 warpgroup-MMA (wgmma) peak of an sm_90a GPU, measured in the run: the ceiling for the
// Hopper kernels (the mma.sync peak of tools/bench_ceilings.h understates Hopper's tensor cores).
#include <cuda.h>

#include <memory>
#include <string>

#include "tools/bench_ceilings.h"

namespace kiln::tools {

class BenchWgmmaPeak {
 public:
  explicit BenchWgmmaPeak(int sm_count);  // compiles for sm_90a and loads in the current context
  ~BenchWgmmaPeak();
  BenchWgmmaPeak(const BenchWgmmaPeak&) = delete;
  BenchWgmmaPeak& operator=(const BenchWgmmaPeak&) = delete;
  // TFLOP/s, median of 7 launches after a warm-up; throws if the results are not finite and non-zero.
  double measure(CUstream stream) const;
  static std::string method();

 private:
  int blocks_;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::unique_ptr<BenchDeviceMemory> out_;
};

}  // namespace kiln::tools
