#include "kiln/runtime/sparse_nvfp4/launcher.h"

#include <fmt/format.h>

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

using Args = SparseFamilyArgs<SparseOptions>;

// Every rule that does not depend on the device (no driver call).
SparseCall check_static(const Args& a) {
  const SparseOptions& opt = a.opt;
  const SparseCall c = check_sparse_tensors(a, kNvfp4Format);

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
SplitPlanResult finish_plan(const Args& a, const SparseCall& c, int sms) {
  const SparseOptions& opt = a.opt;
  const int tokens = static_cast<int>(c.tokens);
  const SplitPlanResult plan = resolve_plan(tokens, c.heads, c.topk, c.extra_topk, sms, opt.num_splits, opt.max_splits, opt.head_tiles);
  require_sparse_scratch(a, c, plan.num_splits, "the planned num_splits is > 1 (pass num_splits = 1 to forbid splitting)");
  check_sparse_grid(c, plan.num_splits);
  return plan;
}

LaunchConfig decode_config(const SparsePolicy& policy, const SparseNvfp4Params& params, int cluster, bool unpaired) {
  LaunchConfig decode;
  switch (policy.kernel) {
    case SparseKernel::kSm90:
      return sparse_sm90_config(params, policy.heads, cluster, unpaired, sparse_sm90_smem_bytes());
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

void launch_sparse(const SparsePolicy& policy, const SparseNvfp4Params& params, const SparseLaunch& l, CUstream stream, int device,
                   KernelService& service) {
  const KernelHandle& handle = acquire(service, policy, stream, device);
  launch_sparse_decode(handle, decode_config(policy, params, l.cluster, l.unpaired), params, /*pdl=*/true, stream,
                       l.unpaired ? kSparseSm90UnpairedEntry : 0);
}

}  // namespace

SplitPlanResult plan_sparse_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                                   const TensorView& output, const TensorView& out_lse, double sm_scale,
                                   const SparseOptions& opt, int sms) {
  if (sms < 1) check::fail("sms", ">= 1", fmt::format("{}", sms));
  const Args a{q, kv_cache, indices, output, out_lse, sm_scale, opt};
  const SparseCall c = check_static(a);
  return finish_plan(a, c, c.tokens == 0 ? kZeroTokenSms : sms);
}

SplitPlanResult cake_sparse_mla_sm120_dsv4_nvfp4_decode(const TensorView& q, const TensorView& kv_cache,
                                                       const TensorView& indices, const TensorView& output,
                                                       const TensorView& out_lse, double sm_scale,
                                                       const SparseOptions& opt, CUstream stream,
                                                       KernelService& service) {
  const Args a{q, kv_cache, indices, output, out_lse, sm_scale, opt};
  const SparseCall c = check_static(a);
  if (c.tokens == 0) return finish_plan(a, c, kZeroTokenSms);
  const StreamDevice on(stream);
  check_sparse_devices(on, a);
  const SparseDevice device = sparse_device(service, on.device(), stream);
  const SplitPlanResult plan = finish_plan(a, c, device.sms);
  const SparseLaunch l = plan_sparse_launch(device, static_cast<int>(c.tokens), c.heads, num_chunks(c.topk, c.extra_topk), plan,
                                            !opt.num_splits, opt.kernel, opt.cluster, c.split_stride, opt.max_splits, opt.bulk_gather);
  SparseNvfp4Params params = sparse_params(a, c, l.runs.num_splits, l.runs.chunks_per_block);
  params.bulk_gather = l.bulk_gather;
  launch_sparse(sparse_policy(c.heads, c.has_extra, l.runs, l.kernel), params, l, stream, on.device(), service);
  return plan;
}

void warm_sparse(const SparsePolicy& policy, const std::vector<int>& devices, KernelService& service) {
  warm_policy(service, policy, devices);
}

}  // namespace kiln::sparse
