#include "kiln/runtime/sparse_nvfp4/launch_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>

#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/sparse_nvfp4/decode_call.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/validation.h"

namespace kiln::sparse {

void check_sparse_arch(std::string_view arch) {
  if (arch != "sm_90a" && arch != "sm_120a") {
    check::unsupported("device", "an sm_90a or sm_120a GPU (the targets kiln has sparse decode kernels for)", fmt::format("arch {}", arch));
  }
}

namespace {

// The most splits, at most the scratch's and the caller's caps, whose CTAs (`per_split` for each)
// still fit one wave; each a normalised count (spec: cpb = ceil(chunks / splits), then splits =
// ceil(chunks / cpb)). `plan` where none is wider.
SplitPlanResult widest_one_wave(const SparseDevice& device, int chunks, const SplitPlanResult& plan, int split_stride, int max_splits,
                                long long per_split) {
  for (int s = std::min({split_stride, max_splits, chunks}); s > plan.num_splits; --s) {
    const int cpb = (chunks + s - 1) / s, splits = (chunks + cpb - 1) / cpb;
    if (splits > plan.num_splits && per_split * splits <= device.sms) return SplitPlanResult{plan.head_tiles, splits, cpb};
  }
  return plan;
}

// Where the mma.sync launch's own runs fit one wave and give each CTA at most two chunks, or three
// with bulk gathers (one head tile), its 16-head CTAs finish first. It deals no split there:
// sparse_cluster_size spares a CTA two chunks or none. H100, us per call against the sm90 launch:
// T = 1, 16 splits of 2, 13.2 against 14.8 (H = 64, 2048 candidates) and 13.9 against 15.1 (H = 128);
// T = 1, H = 64, 8 of 1, 8.4 against 12.3 (512 candidates); T = 8, H = 64, 4 of 2, 11.2 against 12.6
// (512 candidates), 4 of 3, 13.4 against 15.5 (128 + 512). At four and five chunks a CTA it lost:
// T = 8, H = 128, 2 of 4, 15.7 against 14.7 (512) and 2 of 5, 18.2 against 16.6 (128 + 512).
bool mma_runs_first(const SparseDevice& device, int tokens, int heads, int chunks, const SplitPlanResult& plan, int split_stride,
                    int max_splits) {
  const SplitPlanResult mma =
      sparse_launch_plan(device, tokens, heads, chunks, plan, true, std::nullopt, SparseKernel::kMma, split_stride, max_splits);
  return mma.chunks_per_block <= (sparse_bulk_gather(mma) ? 3 : 2) && sparse_decode_grid(tokens, heads, mma.head_tiles, mma.num_splits) <= device.sms;
}

void refuse_while_capturing(CUstream stream, int device) {
  Driver::get().require(fmt::format("read the sparse decode's facts of device {}", device));
  if (!stream_capturing(stream)) return;
  throw Error(ErrorCode::kNotWarm,
              fmt::format("the stream is capturing a CUDA graph and the sparse decode has not been warmed on device {}: "
                          "its cluster residency is read from the driver once, outside capture. Warm a sparse decode key "
                          "on the device before capture (warm_sparse, warm_sparse_dsv41 or kiln warm --manifest)",
                          device));
}

}  // namespace

SparseDevice sparse_device(KernelService& service, int device, std::optional<CUstream> stream) {
  // One entry per device, written once: later calls are one atomic load and allocate nothing.
  static std::array<std::atomic<const SparseDevice*>, 64> cache{};
  static std::mutex mutex;
  static std::vector<std::unique_ptr<const SparseDevice>> owned;
  const bool cacheable = device >= 0 && device < static_cast<int>(cache.size());
  if (cacheable) {
    if (const SparseDevice* d = cache[device].load(std::memory_order_acquire)) return *d;
  }
  if (stream) refuse_while_capturing(*stream, device);
  SparseDevice d;
  switch (device_target(service, device)) {
    case SparseTarget::kSm90a: d.arch = "sm_90a"; break;
    case SparseTarget::kSm120a: d.arch = "sm_120a"; break;
    case SparseTarget::kOther: check_sparse_arch(service.device_arch(device)); break;
  }
  d.sms = service.device_sm_count(device);
  // Only sm_90a launches clusters (kSm90, kMma); every such CTA has the sm90 CTA's shape or fills
  // an SM by its shared memory alone.
  if (d.arch == "sm_90a") d.residency = device_cluster_residency(device, kSparseSm90Threads, sparse_sm90_smem_bytes());
  if (!cacheable) return d;
  std::lock_guard<std::mutex> lock(mutex);
  if (const SparseDevice* known = cache[device].load(std::memory_order_acquire)) return *known;
  owned.push_back(std::make_unique<const SparseDevice>(d));
  cache[device].store(owned.back().get(), std::memory_order_release);
  return d;
}

void read_sparse_device(KernelService& service, int device) { sparse_device(service, device); }

SplitPlanResult resolve_plan(int tokens, int heads, int topk, int extra_topk, int sms, std::optional<int> num_splits,
                             int max_splits, std::optional<int> head_tiles) {
  SplitPlanResult r;
  r.head_tiles = head_tiles ? *head_tiles : plan_head_tiles(tokens, heads, topk, extra_topk, sms);
  const SplitPlan s = num_splits ? resolve_splits(topk, extra_topk, *num_splits)
                                 : plan_splits(tokens, heads, topk, extra_topk, sms, max_splits, r.head_tiles);
  r.num_splits = s.num_splits;
  r.chunks_per_block = s.chunks_per_block;
  return r;
}

SparseKernel choose_kernel(const SparseDevice& device, int tokens, int heads, const SplitPlanResult& plan, std::optional<SparseKernel> kernel) {
  check_sparse_arch(device.arch);
  const std::string_view arch = device.arch;
  const int sms = device.sms;
  if (kernel) {
    if (*kernel == SparseKernel::kSm90 && arch != "sm_90a") {
      check::unsupported("kernel", "\"sm90\" only on sm_90a", fmt::format("\"sm90\" on {}", arch));
    }
    return *kernel;
  }
  if (arch != "sm_90a") return SparseKernel::kMmaSmall;
  // With 64-head blocks on fewer than a fifth of the SMs the 16/32-head mma.sync grid, 2-4 times
  // as many blocks, finishes first (H200: 16 blocks ~20% slower than mma.sync, 32 blocks ~20%
  // faster). Padded rows cost the 64-row tiles MMA work; a block's time is set by its gather and
  // decode, so H = 32 (half the rows padded) still runs 1.5x faster than mma.sync from T = 64
  // (H200, 2048 candidates); H = 16 only ties, and other head counts were not measured.
  const long long blocks = static_cast<long long>(tokens) * sparse_sm90_head_groups(heads) * plan.num_splits;
  if (heads % 64 != 0 && heads != 32) return SparseKernel::kMma;
  // A split dealt to several 64-head CTAs beats the mma.sync grid where the slices still do >= 2
  // chunks each (H200: T = 8 / H = 128 / 512 candidates, 2 chunks per slice, 16.7 vs 20.5 us; T = 4 /
  // H = 64 / 2048 18.7 vs 22.8), and with one chunk each (their Q staging shared) where mma.sync CTAs
  // keep two or more (T = 8 / H = 64 / 512, 4 slices, 15.5 vs 16.4 us; T = 1 / H = 128 / 2048 16.4 vs
  // 16.9; T = 8 / H = 64 / 128 + 512 17.2 vs 18.8), except where topk_length leaves few chunks (T = 1
  // / H = 128 / 2048 at length 300: 16.4 vs 14.8), which the launcher cannot see. H = 32 pads half of
  // every 64-row tile and needs >= 4 per slice (T = 8 / H = 32 / 2048, 2 chunks: 33.5 vs 22.9 at
  // 190ded3).
  const int deal = sparse_cluster_size(device, tokens, heads, plan, std::nullopt, SparseKernel::kSm90);
  const int mma_cluster = sparse_cluster_size(device, tokens, heads, plan);
  const int cpb = plan.chunks_per_block;
  const int slice_chunks = (cpb + deal - 1) / deal, mma_chunks = (cpb + mma_cluster - 1) / mma_cluster;
  if (deal > 1 && (heads == 32 ? slice_chunks >= 4 : (slice_chunks >= 2 || mma_chunks >= 2))) return SparseKernel::kSm90;
  if (5 * blocks < sms) return SparseKernel::kMma;
  // Where the mma.sync grid still leaves room for clusters that spare each CTA two or more chunks,
  // it finishes first (H200, T = 8, H = 128, 2048 candidates: 49.8 us on 64 pairs vs 63.8 us).
  return mma_cluster > 1 ? SparseKernel::kMma : SparseKernel::kSm90;
}

int sparse_cluster_size(const SparseDevice& device, int tokens, int heads, const SplitPlanResult& plan, std::optional<bool> cluster,
                        SparseKernel kernel) {
  const int cpb = plan.chunks_per_block;
  if (kernel == SparseKernel::kMmaSmall || cpb < 2 || (cluster && !*cluster)) return 1;
  const bool sm90 = kernel == SparseKernel::kSm90;
  const long long base = sm90 ? sparse_sm90_grid(tokens, heads, plan.num_splits) : sparse_decode_grid(tokens, heads, plan.head_tiles, plan.num_splits);
  // A cluster pair of the sm90 kernel deals to pairs: its two head groups count against the size.
  const int groups = sm90 ? sparse_sm90_cluster(heads) : 1;
  const int max_size = kSparseMaxCluster / groups;
  // Unforced, a CTA must be spared at least two chunks in sequence: one chunk less did not pay for
  // the cluster (H200, T = 1, 2 chunks per split on 2 CTAs: 1.1-2.3 us slower per call).
  const int max_per_cta = cluster ? cpb - 1 : cpb - 2;
  for (int per_cta = 1; per_cta <= max_per_cta; ++per_cta) {
    const int size = (cpb + per_cta - 1) / per_cta;
    if (size > max_size || base * size > INT_MAX) continue;
    if (!cluster && base / groups > device.residency[size * groups]) continue;
    if (cluster || base * size <= device.sms) return size;
  }
  return 1;
}

SplitPlanResult sparse_launch_plan(const SparseDevice& device, int tokens, int heads, int chunks, const SplitPlanResult& plan, bool planned,
                                   std::optional<bool> cluster, SparseKernel kernel, int split_stride, int max_splits) {
  if (!planned) return plan;
  if (kernel == SparseKernel::kSm90) {
    if (cluster || heads % 64 != 0) return plan;
    return widest_one_wave(device, chunks, plan, split_stride, max_splits, static_cast<long long>(tokens) * sparse_sm90_head_groups(heads));
  }
  if (kernel != SparseKernel::kMma) return plan;
  if (!cluster) {
    const SplitPlanResult wider = widest_one_wave(device, chunks, plan, split_stride, max_splits,
                                                  sparse_decode_grid(tokens, heads, plan.head_tiles, 1));
    if (wider.num_splits > plan.num_splits) return wider;
  }
  if (plan.num_splits == 1 || (cluster && !*cluster) || chunks > kSparseMaxCluster) return plan;
  const SplitPlanResult whole{plan.head_tiles, 1, chunks};
  return sparse_cluster_size(device, tokens, heads, whole, std::nullopt, kernel) == chunks ? whole : plan;
}

SparseLaunch plan_sparse_launch(const SparseDevice& device, int tokens, int heads, int chunks, const SplitPlanResult& plan, bool planned,
                                std::optional<SparseKernel> kernel, std::optional<bool> cluster, int split_stride, int max_splits,
                                std::optional<bool> bulk_gather) {
  SparseLaunch l;
  l.kernel = choose_kernel(device, tokens, heads, plan, kernel);
  if (!kernel && !cluster && planned && l.kernel == SparseKernel::kSm90 && mma_runs_first(device, tokens, heads, chunks, plan, split_stride, max_splits)) {
    l.kernel = SparseKernel::kMma;
  }
  l.runs = sparse_launch_plan(device, tokens, heads, chunks, plan, planned, cluster, l.kernel, split_stride, max_splits);
  l.cluster = sparse_cluster_size(device, tokens, heads, l.runs, cluster, l.kernel);
  l.unpaired = l.kernel == SparseKernel::kSm90 && sparse_sm90_unpaired(device, tokens, heads, l.runs, l.cluster, kNvfp4UnpairedChunks);
  if (l.kernel != SparseKernel::kMma) {
    if (bulk_gather && *bulk_gather) {
      check::fail("bulk_gather", "only with the \"mma\" kernel (the staged mma.sync configuration of sm_90a)",
                  fmt::format("true with kernel \"{}\"", sparse_kernel_name(l.kernel)));
    }
  } else {
    l.bulk_gather = bulk_gather ? *bulk_gather : sparse_bulk_gather(l.runs);
  }
  return l;
}

bool sparse_bulk_gather(const SplitPlanResult& runs) { return runs.head_tiles == 1; }

bool sparse_sm90_unpaired(const SparseDevice& device, int tokens, int heads, const SplitPlanResult& runs, int deal, int max_chunks) {
  return sparse_sm90_cluster(heads) == 2 && deal == 1 && runs.chunks_per_block <= max_chunks &&
         sparse_sm90_grid(tokens, heads, runs.num_splits) <= device.sms;
}

std::vector<SparseKernel> sparse_kernels_for(std::string_view arch, int heads) {
  check_sparse_arch(arch);
  if (arch != "sm_90a") return {SparseKernel::kMmaSmall};
  if (heads % 64 == 0 || heads == 32) return {SparseKernel::kMma, SparseKernel::kSm90};
  return {SparseKernel::kMma};
}

SparsePolicy sparse_policy(int heads, bool has_extra, const SplitPlanResult& plan, SparseKernel kernel) {
  return SparsePolicy{heads, kernel == SparseKernel::kMma ? plan.head_tiles : 1, has_extra, plan.num_splits > 1, kernel};
}

}  // namespace kiln::sparse
