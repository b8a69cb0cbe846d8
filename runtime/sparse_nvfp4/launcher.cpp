#include "kiln/runtime/sparse_nvfp4/launcher.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
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

constexpr double kLog2e = 1.4426950408889634;
constexpr int kLatentDims = 512;
// At T == 0 both planners give the same plan for every SM count >= 3 (no CTA reaches any
// threshold), so the zero-token path resolves its plan with this stand-in and needs no driver.
constexpr int kZeroTokenSms = 132;

// int32 [T, k] or [T, 1, k] with unit stride along k; returns k.
std::int64_t check_indices(const TensorView& idx, const char* arg, std::int64_t tokens, std::int64_t min_topk) {
  {
    const auto phrase = [&] { return fmt::format("{} must be a [num_tokens, topk] or [num_tokens, 1, topk] int32 tensor", arg); };
    const check::Phrase upstream(phrase);
    check::dtype(idx, arg, {DType::kI32});
    check::rank(idx, arg, {2, 3});
    if (idx.rank == 3 && idx.size(1) != 1) {
      check::fail(arg, fmt::format("shape [T, topk] or [T, 1, topk] with T = {} (from q)", tokens), idx.shape_string());
    }
  }
  if (idx.size(0) != tokens) {
    check::fail_as(fmt::format("{} must have {} rows, got {}", arg, tokens, idx.size(0)), arg,
                   fmt::format("shape [T, topk] or [T, 1, topk] with T = {} (from q)", tokens), idx.shape_string());
  }
  const std::int64_t topk = idx.size(-1);
  if (topk < min_topk) {
    check::fail_as(fmt::format("{} must select at least one slot per token", arg), arg,
                   fmt::format("topk (last dimension) >= {}", min_topk), idx.shape_string());
  }
  if (topk > INT_MAX) check::unsupported(arg, fmt::format("topk up to {}", INT_MAX), fmt::format("topk {}", topk));
  check::unit_stride(idx, arg, -1);
  check::not_null(idx, arg);
  check::aligned(idx, arg, 4);
  return topk;
}

// 1-D, unit stride, at least `min_entries` entries of `type` (lengths, sink).
void check_vector(const TensorView& t, const char* arg, DType type, std::int64_t min_entries, const char* what) {
  const auto phrase = [&] {
    return fmt::format("{} must be a 1-D {} tensor with at least {} entries", arg, dtype_name(type), min_entries);
  };
  const check::Phrase upstream(phrase);
  check::dtype(t, arg, {type});
  check::rank(t, arg, {1});
  if (t.size(0) < min_entries) {
    check::fail(arg, fmt::format("at least {} = {} entries", what, min_entries), fmt::format("shape {}", t.shape_string()));
  }
  check::unit_stride(t, arg, 0);
  check::not_null(t, arg);
  check::aligned(t, arg, 4);
}

void check_dense(const TensorView& t, const char* arg, DType type, int rank, int alignment) {
  check::dtype(t, arg, {type});
  check::rank(t, arg, {rank});
  check::contiguous(t, arg);
  check::not_null(t, arg);
  check::aligned(t, arg, alignment);
}

// Everything a launch needs once the device-independent checks passed.
struct Checked {
  std::int64_t tokens = 0;
  int heads = 0;
  int topk = 0;
  int extra_topk = 0;
  bool has_extra = false;
  Nvfp4CacheGeometry main;
  Nvfp4CacheGeometry extra;
  int split_stride = 0;  // S of mid_out/mid_lse, 0 when absent
};

struct Args {
  const TensorView& q;
  const TensorView& kv_cache;
  const TensorView& indices;
  const TensorView& output;
  const TensorView& out_lse;
  double sm_scale;
  const SparseOptions& opt;
};

// Fails the call when mid_out/mid_lse cannot hold `num_splits` splits (T > 0: nothing is written at T == 0).
void require_scratch(const Args& a, const Checked& c, int num_splits, const char* why) {
  if (c.tokens == 0 || num_splits <= 1) return;
  if (!a.opt.mid_out) {
    check::fail_as(fmt::format("this shape splits into {} CTAs per head block; pass caller-owned mid_out / mid_lse scratch",
                               num_splits),
                   "mid_out", fmt::format("bf16 [T, H, S >= {}, 512] scratch because {}", num_splits, why), "none");
  }
  if (c.split_stride < num_splits) {
    check::fail("mid_out", fmt::format("S >= num_splits = {} in [T, H, S, 512] ({})", num_splits, why), a.opt.mid_out->shape_string());
  }
}

// Every rule that does not depend on the device (no driver call).
Checked check_static(const Args& a) {
  const SparseOptions& opt = a.opt;
  Checked c;

  {
    // Upstream checks the shape first, then dtype and layout.
    const auto shape_phrase = [&] { return fmt::format("q must be [T, H, {}], got {}", kLatentDims, a.q.shape_string()); };
    const check::Phrase upstream(shape_phrase);
    check::rank(a.q, "q", {3});
    check::dim(a.q, "q", -1, kLatentDims);
  }
  {
    const auto layout_phrase = [] { return std::string("q must be a contiguous CUDA bfloat16 tensor"); };
    const check::Phrase upstream(layout_phrase);
    check::dtype(a.q, "q", {DType::kBf16});
    check::contiguous(a.q, "q");
  }
  check_dense(a.q, "q", DType::kBf16, 3, 16);
  c.tokens = a.q.size(0);
  const std::int64_t heads = a.q.size(1);
  if (!kHeadsRule.valid(heads)) {
    // Upstream lists its instantiated head counts; kiln serves every multiple of 8 up to 128.
    const auto phrase = [&] {
      return fmt::format("Cake SM120 DSv4 NVFP4 sparse MLA supports (8, 16, 24, ..., 128) query heads, got {}", heads);
    };
    const check::Phrase upstream(phrase);
    check::unsupported("q", "head counts H that are multiples of 8 in [8, 128]", fmt::format("H = {} (shape {})", heads, a.q.shape_string()));
  }
  c.heads = static_cast<int>(heads);
  if (c.tokens > INT_MAX) check::unsupported("q", fmt::format("T up to {}", INT_MAX), fmt::format("T = {}", c.tokens));

  c.main = check_nvfp4_cache(a.kv_cache, "kv_cache");  // any page size: the decode reads it at run time
  c.topk = static_cast<int>(check_indices(a.indices, "indices", c.tokens, 1));

  {
    const auto phrase = [&] {
      return fmt::format("output must be a contiguous bfloat16 tensor of shape ({}, {}, {})", c.tokens, heads, kLatentDims);
    };
    const check::Phrase upstream(phrase);
    check_dense(a.output, "output", DType::kBf16, 3, 16);
    if (a.output.size(0) != c.tokens || a.output.size(1) != heads || a.output.size(2) != kLatentDims) {
      check::fail("output", fmt::format("shape [{}, {}, 512] matching q", c.tokens, heads), a.output.shape_string());
    }
  }
  {
    const auto phrase = [&] {
      return fmt::format("out_lse must be a contiguous float32 tensor of shape ({}, {})", c.tokens, heads);
    };
    const check::Phrase upstream(phrase);
    check_dense(a.out_lse, "out_lse", DType::kF32, 2, 4);
    if (a.out_lse.size(0) != c.tokens || a.out_lse.size(1) != heads) {
      check::fail("out_lse", fmt::format("shape [{}, {}] matching q", c.tokens, heads), a.out_lse.shape_string());
    }
  }

  check::positive_finite(a.sm_scale, "sm_scale");
  check::finite(opt.lse_scale, "lse_scale");

  if (opt.topk_length) check_vector(*opt.topk_length, "topk_length", DType::kI32, c.tokens, "T");
  if (opt.attn_sink) check_vector(*opt.attn_sink, "attn_sink", DType::kF32, heads, "H");

  if (opt.extra_kv_cache && !opt.extra_indices) {
    check::fail_as("extra_kv_cache and extra_indices must be provided together", "extra_indices",
                   "a tensor whenever extra_kv_cache is given", "none");
  }
  if (opt.extra_indices && !opt.extra_kv_cache) {
    check::fail_as("extra_kv_cache and extra_indices must be provided together", "extra_kv_cache",
                   "a tensor whenever extra_indices is given", "none");
  }
  if (opt.extra_topk_length && !opt.extra_indices) {
    check::fail_as("extra_topk_length requires extra_indices", "extra_topk_length", "extra_indices and extra_kv_cache alongside it", "extra_topk_length without extra_indices");
  }
  c.has_extra = opt.extra_kv_cache.has_value();
  if (c.has_extra) {
    c.extra = check_nvfp4_cache(*opt.extra_kv_cache, "extra_kv_cache");
    c.extra_topk = static_cast<int>(check_indices(*opt.extra_indices, "extra_indices", c.tokens, 0));
    if (opt.extra_topk_length) check_vector(*opt.extra_topk_length, "extra_topk_length", DType::kI32, c.tokens, "T");
  }

  if (opt.mid_out.has_value() != opt.mid_lse.has_value()) {
    const char* given = opt.mid_out ? "mid_out" : "mid_lse";
    check::fail(opt.mid_out ? "mid_lse" : "mid_out", "mid_out and mid_lse given together",
                fmt::format("only {}", given));
  }
  if (opt.mid_out) {
    const TensorView& mo = *opt.mid_out;
    const TensorView& ml = *opt.mid_lse;
    const auto mid_out_phrase = [] { return std::string("mid_out must be a contiguous bfloat16 [T, H, >= num_splits, 512] tensor"); };
    const check::Phrase upstream_mid_out(mid_out_phrase);
    check_dense(mo, "mid_out", DType::kBf16, 4, 16);
    if (mo.size(0) != c.tokens || mo.size(1) != heads || mo.size(3) != kLatentDims) {
      check::fail("mid_out", fmt::format("shape [{}, {}, S, 512] matching q", c.tokens, heads), mo.shape_string());
    }
    if (mo.size(2) > INT_MAX) check::unsupported("mid_out", fmt::format("S up to {}", INT_MAX), mo.shape_string());
    const auto mid_lse_phrase = [] { return std::string("mid_lse must be a contiguous float32 [T, H, S] tensor"); };
    const check::Phrase upstream_mid_lse(mid_lse_phrase);
    check_dense(ml, "mid_lse", DType::kF32, 3, 4);
    if (ml.size(0) != c.tokens || ml.size(1) != heads || ml.size(2) != mo.size(2)) {
      check::fail("mid_lse", fmt::format("shape [{}, {}, {}] matching q and mid_out [T, H, S, 512]", c.tokens, heads, mo.size(2)),
                  ml.shape_string());
    }
    c.split_stride = static_cast<int>(mo.size(2));
  }

  // Plan overrides and the parts of the plan the device cannot change.
  if (opt.head_tiles) {
    const auto phrase = [&] { return fmt::format("head_tiles={} is not valid for {} heads", *opt.head_tiles, c.heads); };
    const check::Phrase upstream(phrase);
    SparsePolicy{c.heads, *opt.head_tiles}.validate();
  }
  if (opt.max_splits < 1) check::fail("max_splits", ">= 1", fmt::format("{}", opt.max_splits));
  if (opt.num_splits) {
    const SplitPlan s = resolve_splits(c.topk, c.extra_topk, *opt.num_splits);
    require_scratch(a, c, s.num_splits, "num_splits makes the plan split");
  } else {
    require_scratch(a, c, min_splits(c.topk, c.extra_topk, opt.max_splits), "more than 16 chunks always split");
  }

  // Outputs are written while the inputs are read: no byte may be both.
  const TensorView* reads[8] = {&a.q, &a.kv_cache, &a.indices, nullptr, nullptr, nullptr, nullptr, nullptr};
  const char* read_names[8] = {"q", "kv_cache", "indices", "topk_length", "attn_sink", "extra_kv_cache", "extra_indices",
                               "extra_topk_length"};
  if (opt.topk_length) reads[3] = &*opt.topk_length;
  if (opt.attn_sink) reads[4] = &*opt.attn_sink;
  if (c.has_extra) {
    reads[5] = &*opt.extra_kv_cache;
    reads[6] = &*opt.extra_indices;
    if (opt.extra_topk_length) reads[7] = &*opt.extra_topk_length;
  }
  for (int i = 0; i < 8; ++i) {
    if (reads[i] == nullptr) continue;
    check::disjoint(a.output, "output", *reads[i], read_names[i]);
    check::disjoint(a.out_lse, "out_lse", *reads[i], read_names[i]);
  }
  check::disjoint(a.output, "output", a.out_lse, "out_lse");
  if (opt.mid_out) {
    // mid_out/mid_lse are written only by split plans, but an engine that passes them owns them
    // for the call, so they must not alias anything else either.
    for (int i = 0; i < 8; ++i) {
      if (reads[i] == nullptr) continue;
      check::disjoint(*opt.mid_out, "mid_out", *reads[i], read_names[i]);
      check::disjoint(*opt.mid_lse, "mid_lse", *reads[i], read_names[i]);
    }
    check::disjoint(*opt.mid_out, "mid_out", a.output, "output");
    check::disjoint(*opt.mid_out, "mid_out", a.out_lse, "out_lse");
    check::disjoint(*opt.mid_lse, "mid_lse", a.output, "output");
    check::disjoint(*opt.mid_lse, "mid_lse", a.out_lse, "out_lse");
    check::disjoint(*opt.mid_out, "mid_out", *opt.mid_lse, "mid_lse");
  }
  return c;
}

// The plan for `sms` SMs and the checks that depend on it (still no driver call).
SplitPlanResult finish_plan(const Args& a, const Checked& c, int sms) {
  const SparseOptions& opt = a.opt;
  const int tokens = static_cast<int>(c.tokens);
  const SplitPlanResult plan = resolve_plan(tokens, c.heads, c.topk, c.extra_topk, sms, opt.num_splits, opt.max_splits, opt.head_tiles);
  require_scratch(a, c, plan.num_splits, "the planned num_splits is > 1 (pass num_splits = 1 to forbid splitting)");
  // The 16-head kernels have the largest grid.
  if (sparse_decode_grid(tokens, c.heads, 1, plan.num_splits) > INT_MAX) {
    check::unsupported("q", fmt::format("at most {} decode blocks", INT_MAX),
                       fmt::format("T = {} with {} heads and {} splits", c.tokens, c.heads, plan.num_splits));
  }
  return plan;
}

SparseNvfp4Params make_params(const Args& a, const Checked& c, const SplitPlanResult& plan) {
  const SparseOptions& opt = a.opt;
  SparseNvfp4Params p{};
  p.q = a.q.data;
  p.kv = a.kv_cache.data;
  p.kv_page_stride = c.main.page_stride;
  p.kv_page_size = static_cast<int>(c.main.page_size);
  p.topk = c.topk;
  p.indices = a.indices.data;
  p.indices_row_stride = a.indices.stride(0);
  p.topk_length = opt.topk_length ? opt.topk_length->data : nullptr;
  if (c.has_extra) {
    p.extra_kv = opt.extra_kv_cache->data;
    p.extra_page_stride = c.extra.page_stride;
    p.extra_page_size = static_cast<int>(c.extra.page_size);
    p.extra_topk = c.extra_topk;
    p.extra_indices = opt.extra_indices->data;
    p.extra_indices_row_stride = opt.extra_indices->stride(0);
    p.extra_topk_length = opt.extra_topk_length ? opt.extra_topk_length->data : nullptr;
  }
  p.attn_sink = opt.attn_sink ? opt.attn_sink->data : nullptr;
  p.output = a.output.data;
  p.out_lse = a.out_lse.data;
  if (plan.num_splits > 1) {
    p.mid_out = opt.mid_out->data;
    p.mid_lse = opt.mid_lse->data;
    p.split_stride = c.split_stride;
  }
  p.sm_scale_log2 = static_cast<float>(a.sm_scale * kLog2e);
  p.lse_scale = static_cast<float>(opt.lse_scale);
  p.num_tokens = static_cast<int>(c.tokens);
  p.num_splits = plan.num_splits;
  p.chunks_per_block = plan.chunks_per_block;
  return p;
}

// Whether `device` is an sm_90a GPU, cached per device: after the first query one atomic load.
bool device_is_sm90(KernelService& service, int device) {
  static std::array<std::atomic<int>, 64> cache{};  // 0 unknown, 1 sm_90a, 2 another target
  const bool cacheable = device >= 0 && device < static_cast<int>(cache.size());
  if (cacheable) {
    if (const int v = cache[device].load(std::memory_order_acquire)) return v == 1;
  }
  const bool sm90 = service.device_arch(device) == "sm_90a";
  if (cacheable) cache[device].store(sm90 ? 1 : 2, std::memory_order_release);
  return sm90;
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
  // Both kernels are programmatic dependents of the kernel before them in the stream: their blocks
  // start during its tail and wait for it (griddepcontrol.wait) before reading any input.
  LaunchConfig decode = decode_config(policy, params, cluster);
  decode.pdl = true;
  launch(handle, decode, params, stream, 0);
  if (policy.split) {
    LaunchConfig merge;
    merge.grid[0] = static_cast<unsigned>(sparse_merge_grid(params.num_tokens, policy.heads));
    merge.block[0] = kSparseMergeThreads;
    merge.pdl = true;
    launch(handle, merge, params, stream, 1);
  }
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
  for (const auto& [view, arg] : {std::pair{&q, "q"}, {&kv_cache, "kv_cache"}, {&indices, "indices"}, {&output, "output"},
                                  {&out_lse, "out_lse"}}) {
    on.check(*view, arg);
  }
  for (const auto& [view, arg] : {std::pair{&opt.topk_length, "topk_length"}, {&opt.attn_sink, "attn_sink"},
                                  {&opt.extra_kv_cache, "extra_kv_cache"}, {&opt.extra_indices, "extra_indices"},
                                  {&opt.extra_topk_length, "extra_topk_length"}, {&opt.mid_out, "mid_out"},
                                  {&opt.mid_lse, "mid_lse"}}) {
    on.check(*view, arg);
  }
  const int sms = service.device_sm_count(on.device());
  const SplitPlanResult plan = finish_plan(a, c, sms);
  // kiln targets two archs; the cached check keeps device_arch's lock off the launch path.
  const SparseKernel kernel = choose_kernel(device_is_sm90(service, on.device()) ? "sm_90a" : "sm_120a", static_cast<int>(c.tokens),
                                            c.heads, plan, sms, opt.kernel);
  const SplitPlanResult runs = sparse_launch_plan(static_cast<int>(c.tokens), c.heads, num_chunks(c.topk, c.extra_topk), plan,
                                                  !opt.num_splits, sms, opt.cluster, kernel);
  const SparseNvfp4Params params = make_params(a, c, runs);
  const int cluster = sparse_cluster_size(static_cast<int>(c.tokens), c.heads, runs, sms, opt.cluster, kernel);
  launch_sparse(sparse_policy(c.heads, c.has_extra, runs, kernel), params, cluster, stream, on.device(), service);
  return plan;
}

void warm_sparse(const SparsePolicy& policy, const std::vector<int>& devices, KernelService& service) {
  warm_policy(service, policy, devices);
}

}  // namespace kiln::sparse
