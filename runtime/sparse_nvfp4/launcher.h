#pragma once
// Engine API of the sparse NVFP4 MLA decode (seed: flashinfer.mla.cake_sparse_mla_sm120_dsv4_nvfp4_decode;
// contract: runtime/sparse_nvfp4/README.md). Host validation, plan resolution, key, launch.
#include <cuda.h>

#include <optional>
#include <string_view>
#include <vector>

#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_nvfp4/decode_call.h"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::sparse {

// The seed's keyword arguments (the shared ones, then kiln's overrides of its own kernel choice).
struct SparseOptions : SparseCallOptions {
  std::optional<SparseKernel> kernel;           // overrides the launcher's choice of decode kernel (tests, benchmarks)
  std::optional<bool> cluster;                  // overrides sparse_cluster_size's choice (true: always when it can, false: never)
  std::optional<bool> bulk_gather;              // overrides sparse_bulk_gather's choice (a "mma" launch only)
};

// Writes output [T, H, 512] bf16 and out_lse [T, H] fp32 in place on `stream` (on the stream's
// device; every tensor must live there) and returns the resolved plan. Every argument is checked on the host before any
// driver call (kiln::Error naming the argument); T == 0 returns the plan without touching the driver.
// Allocates nothing and formats nothing unless it throws, so it can run inside CUDA graph capture
// once the plan's key is warm (warm_sparse).
SplitPlanResult cake_sparse_mla_sm120_dsv4_nvfp4_decode(const TensorView& q, const TensorView& kv_cache,
                                                       const TensorView& indices, const TensorView& output,
                                                       const TensorView& out_lse, double sm_scale,
                                                       const SparseOptions& opt, CUstream stream,
                                                       KernelService& service = KernelService::global());

// The same checks and plan resolution as the launcher for a device with `sms` SMs, without a driver
// and without launching: lets an engine (and the unit tests) validate a call and size mid_out/mid_lse.
SplitPlanResult plan_sparse_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                                   const TensorView& output, const TensorView& out_lse, double sm_scale,
                                   const SparseOptions& opt, int sms);

// Compiles (or loads from cache) and loads `policy`'s module on each device (arch from the device).
void warm_sparse(const SparsePolicy& policy, const std::vector<int>& devices,
                 KernelService& service = KernelService::global());

}  // namespace kiln::sparse
