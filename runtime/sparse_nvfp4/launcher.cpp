#include "kiln/runtime/sparse_nvfp4/launcher.h"

#include <fmt/format.h>

#include <climits>
#include <cmath>

#include "kiln/jit/error.h"
#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/nvfp4_cache_view.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/validation.h"

namespace kiln::sparse {

namespace {

// At T == 0 both planners give the same plan for every SM count >= 3 (no CTA reaches any
// threshold), so the zero-token path resolves its plan with this stand-in and needs no driver.
constexpr int kZeroTokenSms = 132;

void check_nvfp4_heads(const TensorView& q, std::int64_t heads) {
  if (kHeadsRule.valid(heads)) return;
  // Upstream lists its instantiated head counts; kiln serves every multiple of 8 up to 128.
  const auto phrase = [&] {
    return fmt::format("Cake SM120 DSv4 NVFP4 sparse MLA supports (8, 16, 24, ..., 128) query heads, got {}", heads);
  };
  const check::Phrase upstream(phrase);
  check::unsupported("q", "head counts H that are multiples of 8 in [8, 128]", fmt::format("H = {} (shape {})", heads, q.shape_string()));
}

PagedCacheGeometry check_nvfp4_pool(const TensorView& cache, std::string_view arg) { return check_nvfp4_cache(cache, arg); }

constexpr SparseCallFormat kNvfp4Format{&check_nvfp4_heads, &check_nvfp4_pool, &check_nvfp4_pool, 0};

using Checked = SparseCall;

struct Args : SparseCallArgs {
  const SparseOptions& opt;
  Args(const TensorView& q, const TensorView& kv, const TensorView& idx, const TensorView& out, const TensorView& lse,
       double sm_scale, const SparseOptions& o)
      : SparseCallArgs{q, kv, idx, out, lse, sm_scale, o}, opt(o) {}
};

// Every rule that does not depend on the device (no driver call).
Checked check_static(const Args& a) {
  const SparseOptions& opt = a.opt;
  const Checked c = check_sparse_tensors(a, kNvfp4Format);

  // Plan overrides and the parts of the plan the device cannot change.
  if (opt.head_tiles) {
    const auto phrase = [&] { return fmt::format("head_tiles={} is not valid for {} heads", *opt.head_tiles, c.heads); };
    const check::Phrase upstream(phrase);
    SparsePolicy{c.heads, *opt.head_tiles}.validate();
  }
  if (opt.max_splits < 1) check::fail("max_splits", ">= 1", fmt::format("{}", opt.max_splits));
  if (opt.num_splits) {
    const SplitPlan s = resolve_splits(c.topk, c.extra_topk, *opt.num_splits);
    require_sparse_scratch(a, c, s.num_splits, "num_splits makes the plan split");
  } else {
    require_sparse_scratch(a, c, min_splits(c.topk, c.extra_topk, opt.max_splits), "more than 16 chunks always split");
  }
  check_sparse_aliasing(a, c);
  return c;
}

// The plan for `sms` SMs and the checks that depend on it (still no driver call).
SplitPlanResult finish_plan(const Args& a, const Checked& c, int sms) {
  const SparseOptions& opt = a.opt;
  const int tokens = static_cast<int>(c.tokens);
  const SplitPlanResult plan = resolve_plan(tokens, c.heads, c.topk, c.extra_topk, sms, opt.num_splits, opt.max_splits, opt.head_tiles);
  require_sparse_scratch(a, c, plan.num_splits, "the planned num_splits is > 1 (pass num_splits = 1 to forbid splitting)");
  check_sparse_grid(c, plan.num_splits);
  return plan;
}

LaunchConfig decode_config(const SparsePolicy& policy, const SparseNvfp4Params& params, int cluster) {
  LaunchConfig decode;
  switch (policy.kernel) {
    case SparseKernel::kSm90: {
      const int ctas = sparse_sm90_cluster(policy.heads) * cluster;  // head-group pair x dealt slices
      decode.grid[0] = static_cast<unsigned>(sparse_sm90_grid(params.num_tokens, policy.heads, params.num_splits) * cluster);
      decode.block[0] = kSparseSm90Threads;
      decode.smem_bytes = sparse_sm90_smem_bytes();
      if (ctas > 1) decode.cluster[0] = static_cast<unsigned>(ctas);
      break;
    }
    case SparseKernel::kMmaSmall:
      decode.grid[0] = static_cast<unsigned>(sparse_decode_grid(params.num_tokens, policy.heads, 1, params.num_splits));
      decode.block[0] = static_cast<unsigned>(sparse_block_threads(1));
      decode.smem_bytes = sparse_decode_smem_bytes(1, true);
      break;
    case SparseKernel::kMma:
      decode.grid[0] = static_cast<unsigned>(sparse_decode_grid(params.num_tokens, policy.heads, policy.head_tiles, params.num_splits) * cluster);
      if (cluster > 1) decode.cluster[0] = static_cast<unsigned>(cluster);
      decode.block[0] = static_cast<unsigned>(sparse_block_threads(policy.head_tiles));
      decode.smem_bytes = sparse_decode_smem_bytes(policy.head_tiles);
      break;
  }
  return decode;
}

void launch_sparse(const SparsePolicy& policy, const SparseNvfp4Params& params, int cluster, CUstream stream, int device,
                   KernelService& service) {
  const KernelHandle& handle = acquire(service, policy, stream, device);
  launch_sparse_decode(handle, decode_config(policy, params, cluster), params, policy.heads, policy.split, /*pdl=*/true, stream);
}

}  // namespace

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

SparseKernel choose_kernel(std::string_view arch, int tokens, int heads, const SplitPlanResult& plan, int sms,
                           std::optional<SparseKernel> kernel) {
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
  const int deal = sparse_cluster_size(tokens, heads, plan, sms, std::nullopt, SparseKernel::kSm90);
  const int mma_cluster = sparse_cluster_size(tokens, heads, plan, sms);
  const int cpb = plan.chunks_per_block;
  const int slice_chunks = (cpb + deal - 1) / deal, mma_chunks = (cpb + mma_cluster - 1) / mma_cluster;
  if (deal > 1 && (heads == 32 ? slice_chunks >= 4 : (slice_chunks >= 2 || mma_chunks >= 2))) return SparseKernel::kSm90;
  if (5 * blocks < sms) return SparseKernel::kMma;
  // Where the mma.sync grid still leaves room for clusters that spare each CTA two or more chunks,
  // it finishes first (H200, T = 8, H = 128, 2048 candidates: 49.8 us on 64 pairs vs 63.8 us).
  return mma_cluster > 1 ? SparseKernel::kMma : SparseKernel::kSm90;
}

namespace {

// Clusters of one-SM CTAs (the sm90 and mma.sync CTAs take 200+ KB of shared memory) resident at
// once, by cluster size: a cluster must fit in one GPC, and the GPCs are uneven, so the count is not
// sms / size. Measured on the H200 (132 SMs, cuOccupancyMaxActiveClusters for 1..8 CTAs of 200 KB);
// other SM counts scale it. More clusters than this run as two waves (16 clusters of 8 sm90 CTAs
// took twice the time of 8; mma.sync, T = 1 / H = 64 / 2048 candidates on 4 splits, 16 clusters of 8:
// 20.2 us against 14.1 for 16 splits without clusters).
int resident_clusters(int size, int sms) {
  static constexpr int kH200[] = {0, 132, 66, 39, 30, 22, 17, 15, 15};
  return kH200[size] * sms / 132;
}

}  // namespace

int sparse_cluster_size(int tokens, int heads, const SplitPlanResult& plan, int sms, std::optional<bool> cluster, SparseKernel kernel) {
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
    if (!cluster && base / groups > resident_clusters(size * groups, sms)) continue;
    if (cluster || base * size <= sms) return size;
  }
  return 1;
}

SplitPlanResult sparse_launch_plan(int tokens, int heads, int chunks, const SplitPlanResult& plan, bool planned, int sms,
                                   std::optional<bool> cluster, SparseKernel kernel) {
  if (!planned || kernel != SparseKernel::kMma || plan.num_splits == 1 || (cluster && !*cluster) || chunks > kSparseMaxCluster) return plan;
  const SplitPlanResult whole{plan.head_tiles, 1, chunks};
  return sparse_cluster_size(tokens, heads, whole, sms, std::nullopt, kernel) == chunks ? whole : plan;
}

std::vector<SparseKernel> sparse_kernels_for(std::string_view arch, int heads) {
  if (arch != "sm_90a") return {SparseKernel::kMmaSmall};
  if (heads % 64 == 0 || heads == 32) return {SparseKernel::kMma, SparseKernel::kSm90};
  return {SparseKernel::kMma};
}

SparsePolicy sparse_policy(int heads, bool has_extra, const SplitPlanResult& plan, SparseKernel kernel) {
  return SparsePolicy{heads, kernel == SparseKernel::kMma ? plan.head_tiles : 1, has_extra, plan.num_splits > 1, kernel};
}

SplitPlanResult plan_sparse_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                                   const TensorView& output, const TensorView& out_lse, double sm_scale,
                                   const SparseOptions& opt, int sms) {
  if (sms < 1) check::fail("sms", ">= 1", fmt::format("{}", sms));
  const Args a{q, kv_cache, indices, output, out_lse, sm_scale, opt};
  const Checked c = check_static(a);
  return finish_plan(a, c, c.tokens == 0 ? kZeroTokenSms : sms);
}

SplitPlanResult cake_sparse_mla_sm120_dsv4_nvfp4_decode(const TensorView& q, const TensorView& kv_cache,
                                                       const TensorView& indices, const TensorView& output,
                                                       const TensorView& out_lse, double sm_scale,
                                                       const SparseOptions& opt, CUstream stream,
                                                       KernelService& service) {
  const Args a{q, kv_cache, indices, output, out_lse, sm_scale, opt};
  const Checked c = check_static(a);
  if (c.tokens == 0) return finish_plan(a, c, kZeroTokenSms);
  const StreamDevice on(stream);
  check_sparse_devices(on, a);
  const int sms = service.device_sm_count(on.device());
  const SplitPlanResult plan = finish_plan(a, c, sms);
  // kiln targets two archs; the cached check keeps device_arch's lock off the launch path.
  const SparseKernel kernel = choose_kernel(device_target(service, on.device()) == SparseTarget::kSm90a ? "sm_90a" : "sm_120a", static_cast<int>(c.tokens),
                                            c.heads, plan, sms, opt.kernel);
  const SplitPlanResult runs = sparse_launch_plan(static_cast<int>(c.tokens), c.heads, num_chunks(c.topk, c.extra_topk), plan,
                                                  !opt.num_splits, sms, opt.cluster, kernel);
  const SparseNvfp4Params params = sparse_params(a, c, runs.num_splits, runs.chunks_per_block);
  const int cluster = sparse_cluster_size(static_cast<int>(c.tokens), c.heads, runs, sms, opt.cluster, kernel);
  launch_sparse(sparse_policy(c.heads, c.has_extra, runs, kernel), params, cluster, stream, on.device(), service);
  return plan;
}

void warm_sparse(const SparsePolicy& policy, const std::vector<int>& devices, KernelService& service) {
  warm_policy(service, policy, devices);
}

}  // namespace kiln::sparse
