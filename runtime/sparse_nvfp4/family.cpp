#include "kiln/runtime/sparse_nvfp4/family.h"

#include <fmt/format.h>

#include <vector>

#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "kiln/runtime/validation.h"

namespace kiln::sparse {

namespace {

std::int64_t value(SparseKernel k) { return static_cast<std::int64_t>(k); }

// split and H are run-time values of the kernels (SparseNvfp4Params::split, ::heads), so they are not
// rendered: keys that differ only in them share one module, one compile and one cache entry (the
// sm90 kernel keeps its head groups, 1 or 2: a cluster pair is another kernel). The merge kernel a split plan
// runs is the companion key's module, so one key warms both launches of any plan. has_extra stays a
// template argument: as a run-time flag it costs the kernels without the extra pool registers and
// time (kernel_templates/sparse_nvfp4/NOTES.md).
KernelSource render(const SparsePolicy& p) {
  if (p.kernel == SparseKernel::kSm90) {
    return KernelSource{"#include \"sparse_nvfp4/kernel_sm90.cuh\"\n", sparse_sm90_entries("sparse_nvfp4", p.heads, p.has_extra)};
  }
  return KernelSource{"#include \"sparse_nvfp4/kernel.cuh\"\n",
                      {fmt::format("kiln::sparse_nvfp4_decode_kernel<{}, {}, {}>", p.head_tiles, p.has_extra,
                                   p.kernel == SparseKernel::kMmaSmall)}};
}

std::vector<SemanticKey> companions(const SparsePolicy& p, std::string_view arch) {
  return {SparseMergePolicy{p.heads}.key(arch)};
}

// One merge module per target: the head count is a run-time value (SparseNvfp4Params::heads).
KernelSource render_merge(const SparseMergePolicy&) {
  return KernelSource{"#include \"sparse_nvfp4/merge.cuh\"\n", {"kiln::sparse_nvfp4_merge_kernel"}};
}

void check_head_tiles(const SparsePolicy& p) {
  if (p.head_tiles == 2 && p.heads % 32 != 0) {
    check::fail("head_tiles", "1 when H % 32 != 0 (2 shares one gather among 32 heads, so it needs heads % 32 == 0)",
                fmt::format("2 with H = {}", p.heads));
  }
  if (p.head_tiles == 2 && p.kernel != SparseKernel::kMma) {
    check::fail("head_tiles", "1 with kernel \"mma_small\" or \"sm90\" (only kernel \"mma\" has two head tiles; the others map "
                              "every plan onto their own blocks)",
                fmt::format("2 with kernel \"{}\"", sparse_kernel_name(p.kernel)));
  }
}

std::string describe_kernel(std::int64_t v) { return fmt::format("kernel #{}", v); }

const PolicySchema<SparsePolicy>& schema() {
  // No default head count: a key for the wrong H would warm a kernel the server never launches.
  static const PolicySchema<SparsePolicy> s(
      kSparseFamily,
      {int_field<&SparsePolicy::heads>("heads", kHeadsRule),
       int_field<&SparsePolicy::head_tiles>("head_tiles", {.expected = "1 or 2", .min = 1, .max = 2}, 1),
       bool_field<&SparsePolicy::has_extra>("has_extra", false), bool_field<&SparsePolicy::split>("split", false),
       enum_field<&SparsePolicy::kernel>(
           "kernel",
           {{"mma", value(SparseKernel::kMma)}, {"mma_small", value(SparseKernel::kMmaSmall)}, {"sm90", value(SparseKernel::kSm90)}},
           value(SparseKernel::kMma), ErrorCode::kInvalidArgument, "\"mma\", \"mma_small\" or \"sm90\"", &describe_kernel)},
      &render, &check_head_tiles, &companions, &read_sparse_device);
  return s;
}

const PolicySchema<SparseMergePolicy>& merge_schema() {
  static const PolicySchema<SparseMergePolicy> s(kSparseMergeFamily, {int_field<&SparseMergePolicy::heads>("heads", kHeadsRule)},
                                                 &render_merge);
  return s;
}

}  // namespace

std::vector<std::string> sparse_sm90_entries(std::string_view family, int heads, bool has_extra) {
  const int groups = sparse_sm90_head_groups(heads);
  std::vector<std::string> names{fmt::format("kiln::{}_sm90_kernel<{}, {}>", family, groups, has_extra)};
  if (groups == 2) names.push_back(fmt::format("kiln::{}_sm90_kernel<1, {}, true>", family, has_extra));
  return names;
}

const char* sparse_kernel_name(SparseKernel kernel) {
  switch (kernel) {
    case SparseKernel::kMma: return "mma";
    case SparseKernel::kMmaSmall: return "mma_small";
    case SparseKernel::kSm90: return "sm90";
  }
  return "mma";
}

void SparsePolicy::validate() const { schema().validate(*this); }

SemanticKey SparsePolicy::key(std::string_view arch) const { return schema().key(*this, arch); }

std::uint64_t SparsePolicy::fingerprint() const { return schema().fingerprint(*this); }

void SparseMergePolicy::validate() const { merge_schema().validate(*this); }

SemanticKey SparseMergePolicy::key(std::string_view arch) const { return merge_schema().key(*this, arch); }

void register_sparse_family() {
  schema().register_family();
  merge_schema().register_family();
}

}  // namespace kiln::sparse
