#pragma once
// The sparse decodes' launch planner: from a resolved split plan (planner.h, upstream's rules) and
// what the GPU is, every choice a launch makes — the decode kernel, the plan it runs, the CTAs a
// split is dealt to, whether the head groups of H > 64 pair up. Pure: the launchers read the device
// once (sparse_device) and only launch what this returns; tests and benches call it for any GPU.
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/runtime/cluster_residency.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_nvfp4/family.h"

namespace kiln::sparse {

// The seed's returned dict {"head_tiles", "num_splits", "chunks_per_block"}.
struct SplitPlanResult {
  int head_tiles = 1;
  int num_splits = 1;
  int chunks_per_block = 1;
  bool operator==(const SplitPlanResult&) const = default;
};

// What a launch plan depends on besides the call's shapes.
struct SparseDevice {
  std::string_view arch = "sm_90a";  // kiln's target for the GPU: "sm_90a" or "sm_120a"
  int sms = 132;
  // Resident clusters of one-SM CTAs by size (the sm90 and two-tile mma.sync CTAs fill an SM); all
  // zero: no split is dealt unless forced.
  ClusterResidency residency;
};

// `device`'s target, SM count and cluster residency (device_cluster_residency for the sm90 CTA's
// shape; read from the driver once per device, then one atomic load). A GPU kiln has no sparse
// decode kernel for is kUnsupported naming its arch. The first read loads a probe module, which
// would invalidate a CUDA graph capture, so with `stream` given and capturing it is refused
// (kNotWarm) instead; warming a sparse decode key on the device (any route: KernelService::warm
// runs read_sparse_device) reads it beforehand.
SparseDevice sparse_device(KernelService& service, int device, std::optional<CUstream> stream = std::nullopt);

// sparse_device as both sparse families' device-facts reader (device_facts.h).
void read_sparse_device(KernelService& service, int device);

// Refuses (kUnsupported, naming it) an arch kiln has no sparse decode kernel for.
void check_sparse_arch(std::string_view arch);

// Plan resolution from shapes alone: head_tiles = override or plan_head_tiles; then num_splits =
// resolve_splits(override) or plan_splits(..., max_splits, head_tiles).
SplitPlanResult resolve_plan(int tokens, int heads, int topk, int extra_topk, int sms, std::optional<int> num_splits = std::nullopt,
                             int max_splits = 16, std::optional<int> head_tiles = std::nullopt);

// A launch of a resolved plan: its kernel, the plan the kernel runs (see sparse_launch_plan) and the
// CTAs per head group that share one split (sparse_cluster_size).
struct SparseLaunch {
  SparseKernel kernel = SparseKernel::kMma;
  SplitPlanResult runs;
  int cluster = 1;
  bool unpaired = false;  // kSm90, H > 64: sparse_sm90_unpaired
  bool bulk_gather = false;  // kMma: sparse_bulk_gather
  bool operator==(const SparseLaunch&) const = default;
};

// The launch of `plan` (the planners' result for T tokens, H heads and `chunks` chunks; `planned`:
// no num_splits override) on `device`, with the overrides of SparseOptions (`kernel`, `cluster`,
// `bulk_gather`: only for a kMma launch, else kInvalidArgument naming it), the split stride S of the
// call's mid_out / mid_lse (0: none) and its max_splits. The kernel is choose_kernel's, except that a
// planned launch with neither override runs kMma where the kMma runs fit one wave and give each CTA
// at most two chunks, or three with bulk gathers (measured at T = 1 and at T = 8, H = 64).
SparseLaunch plan_sparse_launch(const SparseDevice& device, int tokens, int heads, int chunks, const SplitPlanResult& plan, bool planned,
                                std::optional<SparseKernel> kernel = std::nullopt, std::optional<bool> cluster = std::nullopt,
                                int split_stride = 0, int max_splits = 16, std::optional<bool> bulk_gather = std::nullopt);

// Whether a kMma launch of `runs` gathers each record's data with one bulk copy
// (SparseNvfp4Params::bulk_gather) instead of 16-byte cp.asyncs: with one head tile (four producer
// warps, one record item each per chunk). ptxas issues a bulk copy with per-lane operands as an
// 8-instruction loop per lane, where one cp.async moves 16 bytes for each of 32 lanes, so the two
// producer warps of two head tiles, with two items each, lose on it. H100, mma.sync forced, bulk
// against cp.async in one run: one head tile 1.04-1.19x faster at T 1-8 (H 16-128), 1.07x at T = 64
// and 1.02x at T = 512 (H = 16, eight waves); two head tiles 0.89-0.96x (T >= 8, H 32-128).
// `kiln bench sparse` times every row both ways (us_mma_other_gather).
bool sparse_bulk_gather(const SplitPlanResult& runs);

// Whether a kSm90 launch of H > 64 runs each 64-head group as a CTA of its own that decodes every
// candidate (the module's entry kSparseSm90UnpairedEntry) instead of cluster pairs that share each
// chunk's decode: where the split is not dealt (`deal` 1), each CTA has at most `max_chunks` chunks
// and the grid fits one wave.
bool sparse_sm90_unpaired(const SparseDevice& device, int tokens, int heads, const SplitPlanResult& runs, int deal, int max_chunks);

// Each format's `max_chunks`. A pair's CTAs each decode half of every chunk and exchange the halves;
// at few chunks per CTA that exchange and the pair's lockstep cost more than the decode they save
// (H100, same run, H = 128: T = 8 / 512 candidates 16.05 -> 14.71 us, T = 1 / 2048 16.21 -> 15.35;
// NVFP4 T = 8 / 2048 at 4 chunks 22.42 -> 21.94). With more chunks the pair is ahead (T = 64 /
// 128 + 512, 8 chunks: 32.2 against 34.3 us unpaired); V4.1's longer decode tips sooner (4 chunks:
// 0.976 of the pair's speed, 8: 33.7 against 40.7 us).
inline constexpr int kNvfp4UnpairedChunks = 4, kDsv41UnpairedChunks = 2;

// The decode kernel for a call of T tokens and H heads resolved to `plan` on `device` (kernel = an
// override, checked: kSm90 needs sm_90a).
// sm_120a: kMmaSmall, the one configuration that fits 99 KiB per block.
// sm_90a: kSm90 where it was measured faster (tools/bench/results/sparse_h200.json): H a multiple
// of 64 (no padded rows) or 32, and either a split dealt to several of its CTAs that still do >= 2
// chunks each (>= 4 for H = 32; sparse_cluster_size for kSm90), or dealt one chunk each where the
// kMma launch leaves its CTAs more (H a multiple of 64), or its 64-head blocks on at least a fifth of
// the SMs and no cluster for kMma (sparse_cluster_size 1); kMma otherwise.
SparseKernel choose_kernel(const SparseDevice& device, int tokens, int heads, const SplitPlanResult& plan,
                           std::optional<SparseKernel> kernel = std::nullopt);

// CTAs that share one split of a `kernel` launch of `plan` for T tokens and H heads on `device`
// (kMma: per head group; kSm90: per head group, so a cluster pair of H > 64 launches clusters of
// twice this size): a split's chunks_per_block chunks are dealt to them (ceil(cpb / size) each, in
// chunk order) and they combine their partial rows in distributed shared memory, so a split takes
// the time of its slice rather than of all its chunks. 1 (no dealing) for kMmaSmall or when
// `cluster` is false; else the size that gives each CTA the fewest chunks (clusters of at most
// kSparseMaxCluster CTAs, and only as many clusters as the device holds at once: more run as two
// waves) while the whole grid fits one wave (one decode CTA per SM) and each CTA does at least two
// chunks fewer than cpb, the smallest such, or 1 when none does (so always 1 for cpb <= 2: measured
// slower on the H200, tools/bench/results/README.md); `cluster` true drops these conditions (any
// cpb >= 2).
int sparse_cluster_size(const SparseDevice& device, int tokens, int heads, const SplitPlanResult& plan,
                        std::optional<bool> cluster = std::nullopt, SparseKernel kernel = SparseKernel::kMma);

// The plan a `kernel` launch runs for `plan`, the planners' result (which the call returns), when
// `planned` (no num_splits override):
// - kSm90 (H a multiple of 64) and kMma, `cluster` not forced: where the caller's scratch holds more
//   splits than planned (split_stride S, e.g. mid_out sized by scratch_bytes, which holds one per
//   chunk), the most splits up to min(S, max_splits, chunks) whose CTAs fit one wave: a grid of few
//   long splits (each dealt to a cluster, or not) is slower than one of many short ones and the
//   merge (H100, sm90, T = 8, 512 candidates: 16.8 -> 12.5 us at H = 64, 18.0 -> 16.0 at H = 128;
//   2048 at H = 128: 28.7 -> 22.1; mma.sync, T = 1, H = 64, 512 candidates: 8 splits of 1 chunk 8.4
//   us, one split dealt over a cluster of 8 10.8, 4 splits of 2 10.5).
// - kMma otherwise: a split of at most kSparseMaxCluster `chunks` in all, where one cluster per
//   (token, head block) can give each chunk a CTA of its own, runs as one split dealt over that
//   cluster: the splits combine in distributed shared memory, and neither mid_out nor the merge
//   launch is used (H200, T = 1, 512 candidates: 10.0 vs 11.1 us at H = 64, 10.1 vs 12.1 at H = 128).
//   Not with `cluster` false.
// Anything else runs as planned.
SplitPlanResult sparse_launch_plan(const SparseDevice& device, int tokens, int heads, int chunks, const SplitPlanResult& plan, bool planned,
                                   std::optional<bool> cluster, SparseKernel kernel, int split_stride = 0, int max_splits = 16);

// Every kernel choose_kernel can return on `arch` for H heads without an override (what a prebuild
// manifest needs for that target).
std::vector<SparseKernel> sparse_kernels_for(std::string_view arch, int heads);

// The policy (kernel key) a resolved plan launches with `kernel`. kMmaSmall and kSm90 map every plan
// onto their own blocks (16 and 64 heads), so their keys carry head_tiles 1.
SparsePolicy sparse_policy(int heads, bool has_extra, const SplitPlanResult& plan, SparseKernel kernel = SparseKernel::kMma);

}  // namespace kiln::sparse
