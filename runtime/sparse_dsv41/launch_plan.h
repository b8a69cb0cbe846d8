#pragma once
// The DeepSeek-V4.1 decode's launch planner: the variant, the plan and the CTAs a split is dealt to,
// from the call's shapes and what the GPU is (its target, SM count and cluster residency, as
// sparse::sparse_device reads them). Pure: the launcher only launches what this returns; tests,
// the bench and the Python plan helper call it for any GPU.
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/runtime/cluster_residency.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_dsv41/planner.h"

namespace kiln::dsv41 {

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

// The variant `requested` names, checked for `arch` (an unknown name is invalid; "sm90" anywhere but
// sm_90a is not exported there); none when nothing is requested (choose_variant decides). An arch
// kiln has no kernel for is kUnsupported naming it, requested or not.
std::optional<Dsv41Variant> resolve_variant(std::string_view arch, int heads, std::optional<std::string_view> requested);
// The head tiles a variant reports: 1 for "default" (one 16-head tile per CTA), plan_head_tiles(H)
// for "sm90".
int variant_head_tiles(Dsv41Variant variant, int heads);
// kiln's variant for T tokens and H heads planned as `split` on `device`: "default" on sm_120a and
// for H < 32; on sm_90a "sm90" where it was measured faster (tools/bench/results/sparse_dsv41_h100.json):
// a split dealt to several of its CTAs that still do >= 2 chunks each, or 64-head blocks on more
// than a quarter of the SMs; "default" otherwise (few blocks: its 16-head CTAs are 4x as many).
Dsv41Variant choose_variant(const Dsv41Device& device, int tokens, int heads, const SplitPlan& split,
                            std::optional<bool> cluster = std::nullopt);
// CTAs that share one split per head group of a `plan` launch ("sm90": the NVFP4 sm90 launch's
// sparse_cluster_size, the split's chunks dealt to them and their rows combined in distributed
// shared memory); 1 for "default".
int dsv41_cluster_size(const Dsv41Device& device, int tokens, int heads, const Dsv41Plan& plan, std::optional<bool> cluster = std::nullopt);
// Whether an "sm90" launch of `runs` (dealt to `deal` CTAs per head group) runs the head groups of
// H > 64 unpaired (sparse::sparse_sm90_unpaired at V4.1's bound, kDsv41UnpairedChunks); false for "default".
bool dsv41_unpaired(const Dsv41Device& device, int tokens, int heads, const Dsv41Plan& runs, int deal);
// Plan resolution from shapes alone (the launcher's rule): num_splits = resolve_splits(override) or
// plan_splits with plan_head_tiles(H) whatever the variant, `ragged` when a length tensor is given;
// then the variant, `variant` or choose_variant.
Dsv41Plan resolve_dsv41_plan(int tokens, int heads, int topk, int extra_topk, const Dsv41Device& device,
                             std::optional<Dsv41Variant> variant = std::nullopt, std::optional<int> num_splits = std::nullopt,
                             int max_splits = 16, bool ragged = false, std::optional<bool> cluster = std::nullopt);
// The plan a launch of `plan` runs (`planned`: no num_splits override): for "sm90", where the call's
// scratch holds more splits than planned (split_stride S), the most splits up to min(S,
// max_splits, chunks) whose CTAs fit one wave, as the NVFP4 sm90 launch does
// (sparse::sparse_launch_plan); otherwise `plan`. The call still returns `plan`.
Dsv41Plan dsv41_launch_plan(const Dsv41Device& device, int tokens, int heads, int chunks, const Dsv41Plan& plan, bool planned,
                            std::optional<bool> cluster = std::nullopt, int split_stride = 0, int max_splits = 16);
// Whether a launch of `runs` runs the "default" variant's staged body on sm_90a (records gathered by
// bulk copies into raw stages in shared memory, SparseNvfp4Params::bulk_gather; its own kernel,
// kDsv41StagedEntry) instead of its compact one (records gathered into registers, the body every
// target has): `requested`, else the staged body wherever it exists, except with the extra pool
// where the grid is one wave of CTAs that run one chunk each. Requesting it for "sm90" or off sm_90a
// is kInvalidArgument naming bulk_gather.
bool dsv41_bulk_gather(const Dsv41Device& device, int tokens, int heads, bool has_extra, const Dsv41Plan& runs,
                       std::optional<bool> requested);
// Every variant the launcher picks on `arch` for H heads without an override (what a prebuild
// manifest needs for that target).
std::vector<Dsv41Variant> dsv41_variants_for(std::string_view arch, int heads);

// The policy (kernel key) a resolved plan launches.
Dsv41Policy dsv41_policy(int heads, bool has_extra, const Dsv41Plan& plan);

}  // namespace kiln::dsv41
