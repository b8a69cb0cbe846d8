#include "kiln/runtime/sparse_dsv41/launcher.h"

#include <fmt/format.h>


#include "kiln/jit/error.h"
#include "kiln/kernel_templates/sparse_dsv41/params.cuh"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/paged_cache_view.h"
#include "kiln/runtime/sparse_dsv41/planner.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/validation.h"

namespace kiln::dsv41 {

namespace {

using sparse::SparseCall;

// At T == 0 the split planner gives the same plan for every SM count >= 4 (no CTA reaches any
// threshold), so the zero-token path resolves its plan with this stand-in and needs no driver.
constexpr int kZeroTokenSms = 132;

void check_heads(const TensorView& q, std::int64_t heads) {
  if (dsv41_heads_supported(heads)) return;
  check::fail_as(fmt::format("Cake SM120 DSv4.1 mixed sparse MLA supports (8, 16, 32, 48, 64, 80, 96, 112, 128) query heads, got {}", heads),
                 "q", "H one of 8, 16, 32, 48, 64, 80, 96, 112, 128", fmt::format("H = {} (shape {})", heads, q.shape_string()));
}

PagedCacheGeometry check_main(const TensorView& cache, std::string_view arg) {
  return check_record_cache(cache, arg, kDsv41MainRecordBytes);
}

PagedCacheGeometry check_extra(const TensorView& cache, std::string_view arg) {
  return check_record_cache(cache, arg, kDsv41ExtraRecordBytes);
}

constexpr sparse::SparseCallFormat kDsv41Format{&check_heads, &check_main, &check_extra, 1};

using Args = sparse::SparseFamilyArgs<Dsv41Options>;

// Every rule that does not depend on the device (no driver call).
SparseCall check_static(const Args& a) {
  const Dsv41Options& opt = a.opt;
  const SparseCall c = check_sparse_tensors(a, kDsv41Format);
  resolve_precision(opt.compute_precision);
  if (opt.variant) resolve_variant("sm_90a", c.heads, *opt.variant);  // the name alone; the device is checked later
  const int chunks = num_chunks(c.topk, c.extra_topk);
  if (opt.num_splits) {
    const SplitPlan s = sparse::resolve_splits_for_chunks(chunks, *opt.num_splits);
    require_sparse_scratch(a, c, s.num_splits, "num_splits makes the plan split");
  } else {
    require_sparse_scratch(a, c, sparse::min_splits_for_chunks(chunks, opt.max_splits), "more than 16 chunks always split");
  }
  check_sparse_aliasing(a, c);
  return c;
}

// The plan for `device` and the checks that depend on it (still no driver call).
Dsv41Plan finish_plan(const Args& a, const SparseCall& c, const Dsv41Device& device) {
  const Dsv41Options& opt = a.opt;
  const bool ragged = opt.topk_length.has_value() || opt.extra_topk_length.has_value();
  const Dsv41Plan plan = resolve_dsv41_plan(static_cast<int>(c.tokens), c.heads, c.topk, c.extra_topk, device, opt, ragged);
  require_sparse_scratch(a, c, plan.num_splits, "the planned num_splits is > 1 (pass num_splits = 1 to forbid splitting)");
  check_sparse_grid(c, plan.num_splits);
  return plan;
}

// Without a device (T == 0 asks none) the variant is the pinned one, else the one head_tiles implies
// ("sm90" is the only variant with two tiles), else "default", the one every target runs: a call
// that is valid with tokens stays valid without.
Dsv41Device zero_token_device(const Dsv41Options& opt) {
  const bool sm90 = opt.variant ? *opt.variant == dsv41_variant_name(Dsv41Variant::kSm90) : opt.head_tiles == 2;
  return Dsv41Device{sm90 ? "sm_90a" : "sm_120a", kZeroTokenSms, false};
}

// `cluster`: the CTAs dealt one split per head group (dsv41_cluster_size).
LaunchConfig decode_config(const Dsv41Policy& policy, const SparseNvfp4Params& params, int cluster, bool unpaired) {
  if (policy.variant == Dsv41Variant::kSm90) {
    return sparse::sparse_sm90_config(params, policy.heads, cluster, unpaired, sparse_dsv41_sm90_smem_bytes());
  }
  LaunchConfig decode;
  decode.grid[0] = static_cast<unsigned>(sparse_decode_grid(params.num_tokens, policy.heads, 1, params.num_splits));
  decode.block[0] = kDsv41SmallThreads;
  decode.smem_bytes = params.bulk_gather ? sparse_dsv41_staged_smem_bytes() : sparse_dsv41_small_smem_bytes();
  return decode;
}

}  // namespace

int resolve_precision(std::string_view compute_precision) {
  if (compute_precision == "default" || compute_precision == "bf16") return 0;
  if (compute_precision == "fp8") {
    check::unsupported_as("compute_precision='fp8' is not available in kiln; only (\"bf16\",) is available", "compute_precision",
                          "(\"bf16\",) (\"default\" selects it)", "'fp8'");
  }
  check::fail_as(fmt::format("compute_precision must be one of ('default', 'bf16', 'fp8'), got '{}'", compute_precision),
                 "compute_precision", "\"default\" or \"bf16\"", fmt::format("'{}'", compute_precision));
}

Dsv41Plan resolve_dsv41_plan(int tokens, int heads, int topk, int extra_topk, const Dsv41Device& device, const Dsv41Options& opt,
                             bool ragged) {
  std::optional<Dsv41Variant> variant = resolve_variant(device.arch, heads, opt.variant);
  // head_tiles names a variant on sm_90a: 2 only "sm90" has, 1 with a two-tile H only "default".
  if (!variant && opt.head_tiles && device.arch == "sm_90a") {
    if (*opt.head_tiles == 2) variant = Dsv41Variant::kSm90;
    else if (variant_head_tiles(Dsv41Variant::kSm90, heads) == 2) variant = Dsv41Variant::kDefault;
  }
  const Dsv41Plan plan = resolve_dsv41_plan(tokens, heads, topk, extra_topk, device, variant, opt.num_splits, opt.max_splits, ragged,
                                            opt.cluster);
  if (opt.head_tiles && *opt.head_tiles != plan.head_tiles) {
    check::fail_as(fmt::format("head_tiles={} does not match variant '{}', which uses {} for {} heads", *opt.head_tiles,
                               dsv41_variant_name(plan.variant), plan.head_tiles, heads),
                   "head_tiles", fmt::format("{} (or None)", plan.head_tiles), fmt::format("{}", *opt.head_tiles));
  }
  return plan;
}

Dsv41Plan plan_dsv41_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                            const TensorView& output, const TensorView& out_lse, double sm_scale, const Dsv41Options& opt,
                            const Dsv41Device& device) {
  if (device.sms < 1) check::fail("sms", ">= 1", fmt::format("{}", device.sms));
  const Args a{q, kv_cache, indices, output, out_lse, sm_scale, opt};
  const SparseCall c = check_static(a);
  return finish_plan(a, c, c.tokens == 0 ? zero_token_device(opt) : device);
}

Dsv41Plan cake_sparse_mla_sm120_dsv41_mixed_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& indices,
                                                   const TensorView& output, const TensorView& out_lse, double sm_scale,
                                                   const Dsv41Options& opt, CUstream stream, KernelService& service) {
  const Args a{q, kv_cache, indices, output, out_lse, sm_scale, opt};
  const SparseCall c = check_static(a);
  if (c.tokens == 0) return finish_plan(a, c, zero_token_device(opt));
  const StreamDevice on(stream);
  check_sparse_devices(on, a);
  const int device = on.device();
  // kiln has no target for CC 12.1 (device_arch refuses it), so no device it runs on shares host memory.
  const sparse::SparseDevice gpu = sparse::sparse_device(service, device, stream);
  const Dsv41Device target{gpu.arch, gpu.sms, false, gpu.residency};
  const Dsv41Plan plan = finish_plan(a, c, target);
  const Dsv41Plan runs = dsv41_launch_plan(target, static_cast<int>(c.tokens), c.heads, num_chunks(c.topk, c.extra_topk), plan,
                                           !opt.num_splits, opt.cluster, c.split_stride, opt.max_splits);
  SparseNvfp4Params params = sparse_params(a, c, runs.num_splits, runs.chunks_per_block);
  params.bulk_gather = dsv41_bulk_gather(target, static_cast<int>(c.tokens), c.heads, c.has_extra, runs, opt.bulk_gather);
  const Dsv41Policy policy = dsv41_policy(c.heads, c.has_extra, runs);
  const KernelHandle& handle = acquire(service, policy, stream, device);
  const int cluster = dsv41_cluster_size(target, static_cast<int>(c.tokens), c.heads, runs, opt.cluster);
  const bool unpaired = dsv41_unpaired(target, static_cast<int>(c.tokens), c.heads, runs, cluster);
  const int entry = unpaired ? kSparseSm90UnpairedEntry : params.bulk_gather ? kDsv41StagedEntry : 0;
  sparse::launch_sparse_decode(handle, decode_config(policy, params, cluster, unpaired), params, opt.enable_pdl.value_or(true), stream,
                               entry);
  return plan;
}

void warm_sparse_dsv41(const Dsv41Policy& policy, const std::vector<int>& devices, KernelService& service) {
  warm_policy(service, policy, devices);
}

}  // namespace kiln::dsv41
