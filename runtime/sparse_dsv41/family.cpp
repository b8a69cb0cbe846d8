#include "kiln/runtime/sparse_dsv41/family.h"

#include <fmt/format.h>

#include <vector>

#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "kiln/runtime/validation.h"

namespace kiln::dsv41 {

namespace {

std::int64_t value(Dsv41Variant v) { return static_cast<std::int64_t>(v); }

// split and H are run-time values of the kernels (SparseNvfp4Params::split, ::heads), so they are not
// rendered: keys that differ only in them share one module, one compile and one cache entry (the
// sm90 kernel keeps its head groups, 1 or 2: a cluster pair is another kernel). A split plan's merge is the
// NVFP4 family's (it reads only mid_out/mid_lse, so it is format independent): the companion
// sparse_merge key, which one key warms with it. has_extra stays a template argument
// (sparse_nvfp4/family.cpp says why).
KernelSource render(const Dsv41Policy& p) {
  if (p.variant == Dsv41Variant::kSm90) {
    return KernelSource{"#include \"sparse_dsv41/kernel_sm90.cuh\"\n", sparse::sparse_sm90_entries("sparse_dsv41", p.heads, p.has_extra)};
  }
  // The compact kernel, then the staged one (kDsv41StagedEntry, empty off sm_90a).
  return KernelSource{"#include \"sparse_dsv41/kernel.cuh\"\n",
                      {fmt::format("kiln::sparse_dsv41_decode_kernel<{}>", p.has_extra),
                       fmt::format("kiln::sparse_dsv41_staged_kernel<{}>", p.has_extra)}};
}

std::vector<SemanticKey> companions(const Dsv41Policy& p, std::string_view arch) {
  return {sparse::SparseMergePolicy{p.heads}.key(arch)};
}

// The head counts are not an arithmetic range (no 24, 40, ...): the field's rule takes the multiples
// of 8 and this check the served ones.
void check_heads(const Dsv41Policy& p) {
  if (!dsv41_heads_supported(p.heads)) {
    check::fail("heads", "one of 8, 16, 32, 48, 64, 80, 96, 112, 128", fmt::format("{}", p.heads));
  }
}

std::string describe_variant(std::int64_t v) { return fmt::format("variant #{}", v); }

const PolicySchema<Dsv41Policy>& schema() {
  // No default head count: a key for the wrong H would warm a kernel the server never launches.
  static const PolicySchema<Dsv41Policy> s(
      kDsv41Family,
      {int_field<&Dsv41Policy::heads>("heads", {.expected = "one of 8, 16, 32, 48, 64, 80, 96, 112, 128", .min = 8, .max = 128,
                                                .multiple_of = 8}),
       bool_field<&Dsv41Policy::has_extra>("has_extra", false), bool_field<&Dsv41Policy::split>("split", false),
       enum_field<&Dsv41Policy::variant>("variant",
                                         {{"default", value(Dsv41Variant::kDefault)}, {"sm90", value(Dsv41Variant::kSm90)}},
                                         value(Dsv41Variant::kDefault), ErrorCode::kInvalidArgument, "\"default\" or \"sm90\"",
                                         &describe_variant)},
      &render, &check_heads, &companions, &sparse::read_sparse_device);  // the NVFP4 family's device facts
  return s;
}

}  // namespace

bool dsv41_heads_supported(std::int64_t heads) {
  for (int h : kDsv41Heads) {
    if (h == heads) return true;
  }
  return false;
}

const char* dsv41_variant_name(Dsv41Variant variant) {
  switch (variant) {
    case Dsv41Variant::kDefault: return "default";
    case Dsv41Variant::kSm90: return "sm90";
  }
  return "default";
}

std::optional<Dsv41Variant> parse_dsv41_variant(std::string_view name) {
  if (name == "default") return Dsv41Variant::kDefault;
  if (name == "sm90") return Dsv41Variant::kSm90;
  return std::nullopt;
}

void Dsv41Policy::validate() const { schema().validate(*this); }

SemanticKey Dsv41Policy::key(std::string_view arch) const {
  if (variant == Dsv41Variant::kSm90 && arch != "sm_90a") {
    check::unsupported("variant", "\"sm90\" on sm_90a only (warpgroup MMA)", fmt::format("\"sm90\" for {}", arch));
  }
  return schema().key(*this, arch);
}

std::uint64_t Dsv41Policy::fingerprint() const { return schema().fingerprint(*this); }

void register_dsv41_family() { schema().register_family(); }

}  // namespace kiln::dsv41
