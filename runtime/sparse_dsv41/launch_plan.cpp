#include "kiln/runtime/sparse_dsv41/launch_plan.h"

#include <fmt/format.h>

#include "kiln/kernel_templates/sparse_dsv41/params.cuh"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "kiln/runtime/validation.h"

namespace kiln::dsv41 {

namespace {

sparse::SplitPlanResult split_result(const Dsv41Plan& plan) { return {plan.head_tiles, plan.num_splits, plan.chunks_per_block}; }

sparse::SparseDevice sparse_device_of(const Dsv41Device& device) { return {device.arch, device.sms, device.residency}; }

}  // namespace

std::optional<Dsv41Variant> resolve_variant(std::string_view arch, int heads, std::optional<std::string_view> requested) {
  sparse::check_sparse_arch(arch);
  const bool sm90 = arch == "sm_90a";
  if (!requested) return std::nullopt;
  const std::optional<Dsv41Variant> v = parse_dsv41_variant(*requested);
  if (!v) {
    check::fail_as(fmt::format("unknown exact variant '{}'; kiln's variants are ('default', 'sm90')", *requested), "variant",
                   "\"default\" or \"sm90\" (format_info()[\"variants\"]) or None", fmt::format("'{}'", *requested));
  }
  if (*v == Dsv41Variant::kSm90 && !sm90) {
    check::fail_as(fmt::format("variant 'sm90' is not exported for {} ({} heads); it needs sm_90a", arch, heads), "variant",
                   "\"default\" (or None) on this GPU", "'sm90'");
  }
  return v;
}

int variant_head_tiles(Dsv41Variant variant, int heads) {
  return variant == Dsv41Variant::kSm90 ? plan_head_tiles(0, heads, 1, 0, 1) : 1;
}

Dsv41Variant choose_variant(const Dsv41Device& device, int tokens, int heads, const SplitPlan& split, std::optional<bool> cluster) {
  sparse::check_sparse_arch(device.arch);
  if (device.arch != "sm_90a" || heads < 32) return Dsv41Variant::kDefault;
  const Dsv41Plan sm90{Dsv41Variant::kSm90, variant_head_tiles(Dsv41Variant::kSm90, heads), split.num_splits, split.chunks_per_block};
  const int deal = dsv41_cluster_size(device, tokens, heads, sm90, cluster);
  if (deal > 1 && (split.chunks_per_block + deal - 1) / deal >= 2) return Dsv41Variant::kSm90;
  // H100, 1 token, "default" (dsv41_bulk_gather's body) against sm90: 10-20 sm90 CTAs of one chunk
  // each 7.7-8.7 us against 10.7-11.8, and 32 CTAs of two chunks (H 128, 2048 candidates) 11.8 us
  // against 14.3; from 8 tokens (40+ CTAs) sm90 is ahead (14.9 vs 20.9 us at H 64, 128 + 512).
  const long long blocks = static_cast<long long>(tokens) * sparse_sm90_head_groups(heads) * split.num_splits;
  return 4 * blocks <= device.sms ? Dsv41Variant::kDefault : Dsv41Variant::kSm90;
}

int dsv41_cluster_size(const Dsv41Device& device, int tokens, int heads, const Dsv41Plan& plan, std::optional<bool> cluster) {
  if (plan.variant != Dsv41Variant::kSm90) return 1;
  return sparse::sparse_cluster_size(sparse_device_of(device), tokens, heads, split_result(plan), cluster, sparse::SparseKernel::kSm90);
}

Dsv41Plan resolve_dsv41_plan(int tokens, int heads, int topk, int extra_topk, const Dsv41Device& device,
                             std::optional<Dsv41Variant> variant, std::optional<int> num_splits, int max_splits, bool ragged,
                             std::optional<bool> cluster) {
  const SplitPlan s =
      num_splits ? resolve_splits(topk, extra_topk, *num_splits)
                 : plan_splits(tokens, heads, topk, extra_topk, device.sms,
                               SplitOptions{max_splits, plan_head_tiles(tokens, heads, topk, extra_topk, device.sms),
                                            device.unified_memory, ragged});
  Dsv41Plan r;
  r.variant = variant ? *variant : choose_variant(device, tokens, heads, s, cluster);
  r.head_tiles = variant_head_tiles(r.variant, heads);
  r.num_splits = s.num_splits;
  r.chunks_per_block = s.chunks_per_block;
  return r;
}

bool dsv41_unpaired(const Dsv41Device& device, int tokens, int heads, const Dsv41Plan& runs, int deal) {
  return runs.variant == Dsv41Variant::kSm90 &&
         sparse::sparse_sm90_unpaired(sparse_device_of(device), tokens, heads, split_result(runs), deal, sparse::kDsv41UnpairedChunks);
}

Dsv41Plan dsv41_launch_plan(const Dsv41Device& device, int tokens, int heads, int chunks, const Dsv41Plan& plan, bool planned,
                            std::optional<bool> cluster, int split_stride, int max_splits) {
  if (plan.variant != Dsv41Variant::kSm90) return plan;
  const sparse::SplitPlanResult runs = sparse::sparse_launch_plan(sparse_device_of(device), tokens, heads, chunks, split_result(plan),
                                                                 planned, cluster, sparse::SparseKernel::kSm90, split_stride, max_splits);
  Dsv41Plan r = plan;
  r.num_splits = runs.num_splits;
  r.chunks_per_block = runs.chunks_per_block;
  return r;
}

bool dsv41_bulk_gather(const Dsv41Device& device, int tokens, int heads, bool has_extra, const Dsv41Plan& runs,
                       std::optional<bool> requested) {
  const bool staged = device.arch == "sm_90a" && runs.variant == Dsv41Variant::kDefault;
  if (requested && *requested && !staged) {
    check::fail("bulk_gather", "only with the \"default\" variant on sm_90a (its staged body)",
                fmt::format("true with variant \"{}\" on {}", dsv41_variant_name(runs.variant), device.arch));
  }
  if (!staged) return false;
  if (requested) return *requested;
  // H100, one token, each body forced: the staged body 1.08-1.24x the speed of the compact one
  // without the extra pool; with it, where every CTA of a single wave runs one chunk (40 and 80
  // CTAs), the compact one is ahead (8.1 against 8.9 us at H 64, 8.7 against 8.9 at H 128). From 8
  // tokens (320 CTAs) the staged body leads again (20.8 against 21.3 us at H 64, 128 + 512).
  const bool one_wave_of_single_chunks =
      runs.chunks_per_block == 1 && sparse_decode_grid(tokens, heads, runs.head_tiles, runs.num_splits) <= device.sms;
  return !(has_extra && one_wave_of_single_chunks);
}

std::vector<Dsv41Variant> dsv41_variants_for(std::string_view arch, int heads) {
  sparse::check_sparse_arch(arch);
  if (arch == "sm_90a" && heads >= 32) return {Dsv41Variant::kDefault, Dsv41Variant::kSm90};
  return {Dsv41Variant::kDefault};
}

Dsv41Policy dsv41_policy(int heads, bool has_extra, const Dsv41Plan& plan) {
  return Dsv41Policy{heads, has_extra, plan.num_splits > 1, plan.variant};
}

}  // namespace kiln::dsv41
