#pragma once
// Engine API of the sparse DeepSeek-V4.1 MLA decode (seed: FlashInfer's
// cake_sparse_mla_sm120_dsv41_mixed_decode; contract: runtime/sparse_dsv41/README.md). Host
// validation, then the launch of what launch_plan.h decides.
#include <cuda.h>

#include <optional>
#include <string_view>
#include <vector>

#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_dsv41/launch_plan.h"
#include "kiln/runtime/sparse_nvfp4/decode_call.h"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::dsv41 {

// The seed's keyword arguments: the sparse decode's shared ones, then this entry's three.
struct Dsv41Options : sparse::SparseCallOptions {
  std::optional<std::string_view> variant;      // "default" or "sm90"; none: kiln's choice for the device
  std::string_view compute_precision = "bf16";  // "default" or "bf16" (upstream's "fp8" is not implemented)
  std::optional<bool> enable_pdl;               // programmatic dependent launch; none: on
  std::optional<bool> cluster;                  // "sm90": overrides dsv41_cluster_size's choice (tests, benchmarks)
  std::optional<bool> bulk_gather;              // "default" on sm_90a: overrides dsv41_bulk_gather's choice (tests, benchmarks)
};

// Writes output [T, H, 512] bf16 and out_lse [T, H] fp32 in place on `stream` and returns the
// resolved plan. Every argument is checked on the host before any driver call (kiln::Error naming
// the argument, with upstream's phrase); T == 0 returns the plan without touching the driver (the
// variant is then the pinned one, "sm90" for head_tiles = 2, else "default": the device is not
// asked). Allocates nothing and
// formats nothing unless it throws, so it can run inside CUDA graph capture once the plan's key is
// warm (warm_sparse_dsv41).
Dsv41Plan cake_sparse_mla_sm120_dsv41_mixed_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                                                   const TensorView& output, const TensorView& out_lse, double sm_scale,
                                                   const Dsv41Options& opt, CUstream stream,
                                                   KernelService& service = KernelService::global());

// The same checks and plan resolution as the launcher for `device`, without a driver and without
// launching: lets an engine (and the unit tests) validate a call and size mid_out/mid_lse. At T == 0
// it resolves as the launcher does (without the device).
Dsv41Plan plan_dsv41_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                            const TensorView& output, const TensorView& out_lse, double sm_scale, const Dsv41Options& opt,
                            const Dsv41Device& device);

// The precision code of compute_precision: 0 (bf16) for "default" and "bf16"; "fp8" is kUnsupported,
// anything else kInvalidArgument, both naming compute_precision.
int resolve_precision(std::string_view compute_precision);

// The launcher's plan from shapes and `opt`'s plan overrides (variant; head_tiles, which on sm_90a
// names a variant: 2 "sm90", 1 for a two-tile H "default"; num_splits, max_splits, cluster), with
// `ragged` when a length tensor is given. A head_tiles the resolved variant does not use is invalid.
Dsv41Plan resolve_dsv41_plan(int tokens, int heads, int topk, int extra_topk, const Dsv41Device& device, const Dsv41Options& opt,
                             bool ragged);
// Compiles (or loads from cache) and loads `policy`'s module on each device (arch from the device).
void warm_sparse_dsv41(const Dsv41Policy& policy, const std::vector<int>& devices, KernelService& service = KernelService::global());

}  // namespace kiln::dsv41
