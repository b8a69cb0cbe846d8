#include "kiln/runtime/mla_decode/family.h"

#include <string>
#include <vector>

#include "kiln/runtime/mla_decode/planner.h"

namespace kiln::mla {

namespace {

// The decode kernel alone (kMlaDecodeEntry); its combine is the companion key's module.
// The kernel variant is a pure function of the policy and the target arch (the device code picks it
// from the arch it is compiled for), so it needs no field of its own in the semantic key.
// Heads, query rows and the mask are run-time values of the kernel (decode_kernel_name renders what
// its machine code depends on), so keys that differ only in them share one cubin: one compile, one
// cache entry.
KernelSource render(const MlaDecodePolicy& p) {
  return KernelSource{"#include \"mla_decode/kernel.cuh\"\n", {decode_kernel_name(p)}};
}

std::vector<SemanticKey> companions(const MlaDecodePolicy& p, std::string_view arch) {
  return {MlaCombinePolicy{p.heads, p.max_seq_len_q, p.packed}.key(arch)};
}

// Two entry points in a fixed order (kMlaCombineEntry, kMlaCombineWideEntry; the launcher relies on it).
KernelSource render_combine(const MlaCombinePolicy& p) {
  return KernelSource{"#include \"mla_decode/combine.cuh\"\n",
                      {combine_kernel_name(p), combine_kernel_name(p, true)}};
}

std::string describe_dtype(std::int64_t v) { return std::string(dtype_name(static_cast<DType>(v))); }

constexpr std::int64_t value(DType t) { return static_cast<std::int64_t>(t); }
constexpr std::int64_t value(MaskType m) { return static_cast<std::int64_t>(m); }
constexpr std::int64_t value(MlaKernel k) { return static_cast<std::int64_t>(k); }
constexpr std::int64_t value(MlaPrecision p) { return static_cast<std::int64_t>(p); }

void cross_check(const MlaDecodePolicy& p) {
  if (p.kernel == MlaKernel::kWgmmaKv && p.dtype != DType::kBf16) {
    throw Error(ErrorCode::kUnsupported, "argument 'kernel': \"wgmma_kv\" takes dtype bf16 only; use \"auto\", "
                                         "\"mma_sync\" or \"wgmma\" for fp8_e4m3");
  }
  if (p.precision == MlaPrecision::kBf16 && p.dtype != DType::kBf16) {
    throw Error(ErrorCode::kUnsupported, "argument 'precision': \"bf16\" applies to bf16 pages only (fp8_e4m3 pages "
                                         "always run on one f16 P); use \"exact\" with dtype fp8_e4m3");
  }
}

const PolicySchema<MlaDecodePolicy>& schema() {
  // No default head count or length: no value fits every model, and a silently defaulted one would
  // build the wrong kernel.
  static const PolicySchema<MlaDecodePolicy> s(
      kMlaFamily,
      {int_field<&MlaDecodePolicy::heads>("heads", kHeadsRule),
       int_field<&MlaDecodePolicy::page_size>("page_size", kPageSizeRule, 64),
       int_field<&MlaDecodePolicy::max_seq_len>("max_seq_len", kMaxSeqLenRule),
       int_field<&MlaDecodePolicy::max_seq_len_q>("max_seq_len_q", kMaxSeqLenQRule, 1),
       bool_field<&MlaDecodePolicy::packed>("packed", false),
       enum_field<&MlaDecodePolicy::dtype>("dtype", {{"bf16", value(DType::kBf16)}, {"fp8_e4m3", value(DType::kE4m3)}},
                                           value(DType::kBf16), ErrorCode::kUnsupported, "bfloat16 or float8_e4m3fn",
                                           &describe_dtype),
       enum_field<&MlaDecodePolicy::out_dtype>("out_dtype", {{"bf16", value(DType::kBf16)}}, value(DType::kBf16),
                                               ErrorCode::kUnsupported, "bfloat16", &describe_dtype),
       enum_field<&MlaDecodePolicy::mask>("mask", {{"dense", value(MaskType::kDense)}, {"causal", value(MaskType::kCausal)}},
                                          value(MaskType::kCausal), ErrorCode::kInvalidArgument, "kDense or kCausal"),
       enum_field<&MlaDecodePolicy::kernel>("kernel",
                                            {{"auto", value(MlaKernel::kAuto)},
                                             {"mma_sync", value(MlaKernel::kMmaSync)},
                                             {"wgmma", value(MlaKernel::kWgmma)},
                                             {"wgmma_kv", value(MlaKernel::kWgmmaKv)}},
                                            value(MlaKernel::kAuto), ErrorCode::kInvalidArgument,
                                            "kAuto, kMmaSync, kWgmma or kWgmmaKv"),
       enum_field<&MlaDecodePolicy::precision>("precision",
                                               {{"exact", value(MlaPrecision::kExact)}, {"bf16", value(MlaPrecision::kBf16)}},
                                               value(MlaPrecision::kExact), ErrorCode::kInvalidArgument,
                                               "kExact or kBf16")},
      &render, &cross_check, &companions);
  return s;
}

const PolicySchema<MlaCombinePolicy>& combine_schema() {
  static const PolicySchema<MlaCombinePolicy> s(
      kMlaCombineFamily,
      {int_field<&MlaCombinePolicy::heads>("heads", kHeadsRule),
       int_field<&MlaCombinePolicy::max_seq_len_q>("max_seq_len_q", kMaxSeqLenQRule, 1),
       bool_field<&MlaCombinePolicy::packed>("packed", false)},
      &render_combine);
  return s;
}

}  // namespace

std::string_view mask_name(MaskType mask) { return mask == MaskType::kDense ? "dense" : "causal"; }

void MlaDecodePolicy::validate() const { schema().validate(*this); }

SemanticKey MlaDecodePolicy::key(std::string_view arch) const { return schema().key(*this, arch); }

std::uint64_t MlaDecodePolicy::fingerprint() const { return schema().fingerprint(*this); }

void MlaCombinePolicy::validate() const { combine_schema().validate(*this); }

SemanticKey MlaCombinePolicy::key(std::string_view arch) const { return combine_schema().key(*this, arch); }

void register_mla_family() {
  schema().register_family();
  combine_schema().register_family();
}

}  // namespace kiln::mla
