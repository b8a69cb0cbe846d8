#include "kiln/runtime/sparse_nvfp4/decode_call.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <climits>
#include <string>

#include "kiln/jit/error.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/validation.h"

namespace kiln::sparse {

namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr int kLatentDims = 512;

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

}  // namespace

SparseCall check_sparse_tensors(const SparseCallArgs& a, const SparseCallFormat& format) {
  const SparseCallOptions& opt = a.opt;
  SparseCall c;

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
  format.check_heads(a.q, heads);
  c.heads = static_cast<int>(heads);
  if (c.tokens > INT_MAX) check::unsupported("q", fmt::format("T up to {}", INT_MAX), fmt::format("T = {}", c.tokens));

  c.main = format.check_main_cache(a.kv_cache, "kv_cache");  // any page size: the decode reads it at run time
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
    c.extra = format.check_extra_cache(*opt.extra_kv_cache, "extra_kv_cache");
    c.extra_topk = static_cast<int>(check_indices(*opt.extra_indices, "extra_indices", c.tokens, format.min_extra_topk));
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
  return c;
}

void check_sparse_aliasing(const SparseCallArgs& a, const SparseCall& c) {
  const SparseCallOptions& opt = a.opt;
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
}

void require_sparse_scratch(const SparseCallArgs& a, const SparseCall& c, int num_splits, const char* why) {
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

void check_sparse_grid(const SparseCall& c, int num_splits) {
  // The 16-head kernels have the largest grid.
  if (sparse_decode_grid(static_cast<int>(c.tokens), c.heads, 1, num_splits) > INT_MAX) {
    check::unsupported("q", fmt::format("at most {} decode blocks", INT_MAX),
                       fmt::format("T = {} with {} heads and {} splits", c.tokens, c.heads, num_splits));
  }
}

void check_sparse_devices(const StreamDevice& on, const SparseCallArgs& a) {
  const SparseCallOptions& opt = a.opt;
  for (const auto& [view, arg] : {std::pair{&a.q, "q"}, {&a.kv_cache, "kv_cache"}, {&a.indices, "indices"}, {&a.output, "output"},
                                  {&a.out_lse, "out_lse"}}) {
    on.check(*view, arg);
  }
  for (const auto& [view, arg] : {std::pair{&opt.topk_length, "topk_length"}, {&opt.attn_sink, "attn_sink"},
                                  {&opt.extra_kv_cache, "extra_kv_cache"}, {&opt.extra_indices, "extra_indices"},
                                  {&opt.extra_topk_length, "extra_topk_length"}, {&opt.mid_out, "mid_out"},
                                  {&opt.mid_lse, "mid_lse"}}) {
    on.check(*view, arg);
  }
}

SparseNvfp4Params sparse_params(const SparseCallArgs& a, const SparseCall& c, int num_splits, int chunks_per_block) {
  const SparseCallOptions& opt = a.opt;
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
  if (num_splits > 1) {
    p.mid_out = opt.mid_out->data;
    p.mid_lse = opt.mid_lse->data;
    p.split_stride = c.split_stride;
  }
  p.sm_scale_log2 = static_cast<float>(a.sm_scale * kLog2e);
  p.lse_scale = static_cast<float>(opt.lse_scale);
  p.num_tokens = static_cast<int>(c.tokens);
  p.heads = c.heads;
  p.num_splits = num_splits;
  p.chunks_per_block = chunks_per_block;
  // The same rule as the policy's split field (sparse_policy, dsv41_policy), so the key and the flag agree.
  p.split = num_splits > 1;
  return p;
}

LaunchConfig sparse_sm90_config(const SparseNvfp4Params& params, int heads, int cluster, bool unpaired, std::size_t smem_bytes) {
  LaunchConfig decode;
  const int ctas = (unpaired ? 1 : sparse_sm90_cluster(heads)) * cluster;  // head-group pair x dealt slices
  decode.grid[0] = static_cast<unsigned>(sparse_sm90_grid(params.num_tokens, heads, params.num_splits) * cluster);
  decode.block[0] = kSparseSm90Threads;
  decode.smem_bytes = smem_bytes;
  if (ctas > 1) decode.cluster[0] = static_cast<unsigned>(ctas);
  return decode;
}

void launch_sparse_decode(const KernelHandle& handle, LaunchConfig decode, const SparseNvfp4Params& params, bool pdl,
                          CUstream stream, int entry) {
  decode.pdl = pdl;
  launch(handle, decode, params, stream, entry);
  if (params.split) {
    LaunchConfig merge;
    merge.grid[0] = static_cast<unsigned>(sparse_merge_grid(params.num_tokens, params.heads));
    merge.block[0] = static_cast<unsigned>(sparse_merge_rows_per_block(params.num_tokens, params.heads) * kSparseMergeThreadsPerRow);
    merge.pdl = pdl;
    launch(handle.companion(0), merge, params, stream, 0);
  }
}

SparseTarget device_target(KernelService& service, int device) {
  static std::array<std::atomic<int>, 64> cache{};  // 0 unknown, else 1 + SparseTarget
  const bool cacheable = device >= 0 && device < static_cast<int>(cache.size());
  if (cacheable) {
    if (const int v = cache[device].load(std::memory_order_acquire)) return static_cast<SparseTarget>(v - 1);
  }
  const std::string arch = service.device_arch(device);
  const SparseTarget t = arch == "sm_90a" ? SparseTarget::kSm90a : arch == "sm_120a" ? SparseTarget::kSm120a : SparseTarget::kOther;
  if (cacheable) cache[device].store(static_cast<int>(t) + 1, std::memory_order_release);
  return t;
}

}  // namespace kiln::sparse
