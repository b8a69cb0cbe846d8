#pragma once
// Engine API of the sparse DeepSeek-V4.1 MLA decode (seed: FlashInfer's
// cake_sparse_mla_sm120_dsv41_mixed_decode; contract: runtime/sparse_dsv41/README.md). Host
// validation, variant and plan resolution, key, launch.
#include <cuda.h>

#include <optional>
#include <string_view>
#include <vector>

#include "kiln/runtime/cluster_residency.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_dsv41/planner.h"
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
};

// The seed's returned dict {"variant", "head_tiles", "num_splits", "chunks_per_block", "precision"}.
struct Dsv41Plan {
  Dsv41Variant variant = Dsv41Variant::kDefault;
  int head_tiles = 1;  // the variant's tile count: 1 for "default", plan_head_tiles(H) for "sm90"
  int num_splits = 1;
  int chunks_per_block = 1;
  int precision = 0;  // 0 = bf16
  bool operator==(const Dsv41Plan&) const = default;
};

// What resolving a plan needs to know about the GPU.
struct Dsv41Device {
  std::string_view arch = "sm_90a";  // kiln's target for the device
  int sms = 132;
  bool unified_memory = false;  // CC 12.1 (GB10); kiln has no target for it, so the launcher passes false
  // Resident clusters of one-SM CTAs (sparse::SparseDevice::residency); all zero: no split is dealt
  // to a cluster unless forced.
  ClusterResidency residency;
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

// The variant `requested` names, checked for `arch` (an unknown name is invalid; "sm90" anywhere but
// sm_90a is not exported there); none when nothing is requested (choose_variant decides). An arch
// kiln has no kernel for is kUnsupported naming it, requested or not.
std::optional<Dsv41Variant> resolve_variant(std::string_view arch, int heads, std::optional<std::string_view> requested);
// The head tiles a variant reports: 1 for "default" (one 16-head tile per CTA), plan_head_tiles(H)
// for "sm90".
int variant_head_tiles(Dsv41Variant variant, int heads);
// kiln's variant for T tokens and H heads planned as `split` on `device`: "default" on sm_120a and
// for H < 32; on sm_90a "sm90" where it was measured faster (tools/bench/results/sparse_dsv41_h200.json):
// a split dealt to several of its CTAs that still do >= 2 chunks each, or 64-head blocks on at
// least a fifth of the SMs; "default" otherwise (few blocks: its 16-head CTAs are 4x as many).
Dsv41Variant choose_variant(const Dsv41Device& device, int tokens, int heads, const SplitPlan& split,
                            std::optional<bool> cluster = std::nullopt);
// CTAs that share one split per head group of a `plan` launch ("sm90": the NVFP4 sm90 launch's
// sparse_cluster_size, the split's chunks dealt to them and their rows combined in distributed
// shared memory); 1 for "default".
int dsv41_cluster_size(const Dsv41Device& device, int tokens, int heads, const Dsv41Plan& plan, std::optional<bool> cluster = std::nullopt);
// Plan resolution from shapes alone (the launcher's rule): num_splits = resolve_splits(override) or
// plan_splits with plan_head_tiles(H) whatever the variant, `ragged` when a length tensor is given;
// then the variant, `variant` or choose_variant.
Dsv41Plan resolve_dsv41_plan(int tokens, int heads, int topk, int extra_topk, const Dsv41Device& device,
                             std::optional<Dsv41Variant> variant = std::nullopt, std::optional<int> num_splits = std::nullopt,
                             int max_splits = 16, bool ragged = false, std::optional<bool> cluster = std::nullopt);
// The launcher's plan from shapes and `opt`'s plan overrides (variant; head_tiles, which on sm_90a
// names a variant: 2 "sm90", 1 for a two-tile H "default"; num_splits, max_splits, cluster), with
// `ragged` when a length tensor is given. A head_tiles the resolved variant does not use is invalid.
Dsv41Plan resolve_dsv41_plan(int tokens, int heads, int topk, int extra_topk, const Dsv41Device& device, const Dsv41Options& opt,
                             bool ragged);
// Every variant the launcher picks on `arch` for H heads without an override (what a prebuild
// manifest needs for that target).
std::vector<Dsv41Variant> dsv41_variants_for(std::string_view arch, int heads);

// The policy (kernel key) a resolved plan launches.
Dsv41Policy dsv41_policy(int heads, bool has_extra, const Dsv41Plan& plan);

// Compiles (or loads from cache) and loads `policy`'s module on each device (arch from the device).
void warm_sparse_dsv41(const Dsv41Policy& policy, const std::vector<int>& devices, KernelService& service = KernelService::global());

}  // namespace kiln::dsv41
