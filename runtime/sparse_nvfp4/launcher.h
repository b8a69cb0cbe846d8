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
#include "kiln/runtime/tensor_view.h"

namespace kiln::sparse {

// The seed's keyword arguments (the shared ones, then kiln's overrides of its own kernel choice).
struct SparseOptions : SparseCallOptions {
  std::optional<SparseKernel> kernel;           // overrides the launcher's choice of decode kernel (tests, benchmarks)
  std::optional<bool> cluster;                  // overrides sparse_cluster_size's choice (true: always when it can, false: never)
};

// The seed's returned dict {"head_tiles", "num_splits", "chunks_per_block"}.
struct SplitPlanResult {
  int head_tiles = 1;
  int num_splits = 1;
  int chunks_per_block = 1;
  bool operator==(const SplitPlanResult&) const = default;
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

// Plan resolution from shapes alone (the launcher's rule): head_tiles = override or plan_head_tiles;
// then num_splits = resolve_splits(override) or plan_splits(..., max_splits, head_tiles).
SplitPlanResult resolve_plan(int tokens, int heads, int topk, int extra_topk, int sms,
                             std::optional<int> num_splits = std::nullopt, int max_splits = 16,
                             std::optional<int> head_tiles = std::nullopt);

// The decode kernel the launcher runs for a call of T tokens and H heads resolved to `plan` on a
// device of target `arch` with `sms` SMs (kernel = an override, checked: kSm90 needs sm_90a).
// sm_120a (and any target but sm_90a): kMmaSmall, the one configuration that fits 99 KiB per block.
// sm_90a: kSm90 where it was measured faster (tools/bench/results/sparse_h200.json): H a multiple
// of 64 (no padded rows) or 32, and either a split dealt to several of its CTAs that still do >= 2
// chunks each (>= 4 for H = 32; sparse_cluster_size for kSm90), or dealt one chunk each where the
// kMma launch leaves its CTAs more (H a multiple of 64), or its 64-head blocks on at least a fifth of
// the SMs and no cluster for kMma (sparse_cluster_size 1); kMma otherwise.
SparseKernel choose_kernel(std::string_view arch, int tokens, int heads, const SplitPlanResult& plan, int sms,
                           std::optional<SparseKernel> kernel = std::nullopt);

// CTAs that share one split of a `kernel` launch of `plan` for T tokens and H heads on `sms` SMs
// (kMma: per head group; kSm90: per head group, so a cluster pair of H > 64 launches clusters of
// twice this size): a split's chunks_per_block chunks are dealt to them (ceil(cpb / size) each, in
// chunk order) and they combine their partial rows in distributed shared memory, so a split takes
// the time of its slice rather than of all its chunks. 1 (no dealing) for kMmaSmall or when
// `cluster` is false; else the size that gives each CTA the fewest chunks (clusters of at most
// kSparseMaxCluster CTAs, and only as many clusters as fit the GPCs at once, as counted on the
// H200: every kMma and kSm90 CTA fills an SM) while the whole grid fits one wave (one decode CTA
// per SM) and each CTA does at least two chunks fewer than cpb, the smallest such, or 1 when none
// does (so always 1 for cpb <= 2: measured slower on the H200, tools/bench/results/README.md);
// `cluster` true drops these conditions (any cpb >= 2).
int sparse_cluster_size(int tokens, int heads, const SplitPlanResult& plan, int sms, std::optional<bool> cluster = std::nullopt,
                        SparseKernel kernel = SparseKernel::kMma);

// The plan a `kernel` launch runs for `plan`, the planners' result (which the call returns). A planned
// (`planned`: no num_splits override) kMma split of at most kSparseMaxCluster `chunks` in all, where
// one cluster per (token, head block) can give each chunk a CTA of its own, runs as one split dealt
// over that cluster: the splits combine in distributed shared memory, and neither mid_out nor the
// merge launch is used (H200, T = 1, 512 candidates: 10.0 vs 11.1 us at H = 64, 10.1 vs 12.1 at
// H = 128). Anything else (and `cluster` false) runs as planned.
SplitPlanResult sparse_launch_plan(int tokens, int heads, int chunks, const SplitPlanResult& plan, bool planned, int sms,
                                   std::optional<bool> cluster, SparseKernel kernel);

// Every kernel choose_kernel can return on `arch` for H heads without an override (what a prebuild
// manifest needs for that target).
std::vector<SparseKernel> sparse_kernels_for(std::string_view arch, int heads);

// The policy (kernel key) a resolved plan launches with `kernel`. kMmaSmall and kSm90 map every plan
// onto their own blocks (16 and 64 heads), so their keys carry head_tiles 1.
SparsePolicy sparse_policy(int heads, bool has_extra, const SplitPlanResult& plan, SparseKernel kernel = SparseKernel::kMma);

// Compiles (or loads from cache) and loads `policy`'s module on each device (arch from the device).
void warm_sparse(const SparsePolicy& policy, const std::vector<int>& devices,
                 KernelService& service = KernelService::global());

}  // namespace kiln::sparse
