#include "runtime/mla_decode/family.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <memory>

#include "jit/error.h"
#include "jit/family.h"
#include "runtime/validation.h"

namespace kiln::mla {

namespace {

using nlohmann::json;

constexpr long long kMaxSeqLenLimit = (1LL << 31) - 32768;
constexpr const char* kFields = "heads, page_size, max_seq_len, max_seq_len_q, packed, dtype, out_dtype, mask";

std::string_view dtype_key_name(DType t) { return t == DType::kE4m3 ? "fp8_e4m3" : "bf16"; }

json policy_json(const MlaDecodePolicy& p) {
  return {{"heads", p.heads},
          {"page_size", p.page_size},
          {"max_seq_len", p.max_seq_len},
          {"max_seq_len_q", p.max_seq_len_q},
          {"packed", p.packed},
          {"dtype", dtype_key_name(p.dtype)},
          {"out_dtype", dtype_key_name(p.out_dtype)},
          {"mask", mask_name(p.mask)}};
}

[[noreturn]] void bad_field(std::string_view field, std::string_view expected, const json& given) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("mla_decode policy field '{}' must be {}, got {}", field, expected, json_text(given)));
}

long long integer_field(std::string_view field, const json& v) {
  if (!v.is_number_integer()) bad_field(field, "an integer", v);
  return v.get<long long>();
}

int int_field(std::string_view field, const json& v) {
  const long long x = integer_field(field, v);
  if (x < INT32_MIN || x > INT32_MAX) bad_field(field, "a 32-bit integer", v);
  return static_cast<int>(x);
}

MlaDecodePolicy from_json(const json& policy) {
  if (!policy.is_object()) throw Error(ErrorCode::kInvalidArgument, "mla_decode policy must be a JSON object");
  MlaDecodePolicy p;
  bool has_heads = false, has_max_seq_len = false;
  for (const auto& [field, v] : policy.items()) {
    if (field == "heads") {
      p.heads = int_field(field, v);
      has_heads = true;
    } else if (field == "page_size") {
      p.page_size = int_field(field, v);
    } else if (field == "max_seq_len") {
      p.max_seq_len = integer_field(field, v);
      has_max_seq_len = true;
    } else if (field == "max_seq_len_q") {
      p.max_seq_len_q = int_field(field, v);
    } else if (field == "packed") {
      if (!v.is_boolean()) bad_field(field, "true or false", v);
      p.packed = v.get<bool>();
    } else if (field == "dtype") {
      if (v == "bf16") p.dtype = DType::kBf16;
      else if (v == "fp8_e4m3") p.dtype = DType::kE4m3;
      else bad_field(field, "\"bf16\" or \"fp8_e4m3\"", v);
    } else if (field == "out_dtype") {
      if (v != "bf16") bad_field(field, "\"bf16\"", v);
      p.out_dtype = DType::kBf16;
    } else if (field == "mask") {
      if (v == "dense") p.mask = MaskType::kDense;
      else if (v == "causal") p.mask = MaskType::kCausal;
      else bad_field(field, "\"dense\" or \"causal\"", v);
    } else {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("mla_decode policy has no field '{}'; fields: {}", field, kFields));
    }
  }
  // No default fits every model, and a silently defaulted head count would build the wrong kernel.
  if (!has_heads) throw Error(ErrorCode::kInvalidArgument, "mla_decode policy needs field 'heads' (1..128)");
  if (!has_max_seq_len) {
    throw Error(ErrorCode::kInvalidArgument, "mla_decode policy needs field 'max_seq_len' (1..2147450880)");
  }
  return p;
}

class MlaFamily final : public Family {
 public:
  std::string_view name() const override { return kMlaFamily; }

  json canonicalize(const json& policy) const override {
    const MlaDecodePolicy p = from_json(policy);
    try {
      p.validate();
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("mla_decode policy: {}", e.what()));
    }
    return policy_json(p);  // nlohmann::json objects keep keys sorted
  }

  // One module, two entry points in a fixed order: 0 = decode, 1 = combine (the launcher relies on it).
  // The tile configuration is a pure function of the policy, so it rides in the template arguments and
  // thus in the cache key, not in the semantic key.
  KernelSource render(const json& policy) const override {
    const MlaPolicy p = from_json(policy).planner_policy();
    return KernelSource{"#include \"mla_decode/kernel.cuh\"\n", {decode_kernel_name(p), combine_kernel_name(p)}};
  }
};

}  // namespace

std::string_view mask_name(MaskType mask) { return mask == MaskType::kDense ? "dense" : "causal"; }

void MlaDecodePolicy::validate() const {
  if (heads < 1) check::fail("heads", "1..128", fmt::format("{}", heads));
  if (heads > 128) check::unsupported("heads", "1..128", fmt::format("{}", heads));
  if (page_size != 16 && page_size != 32 && page_size != 64 && page_size != 128) {
    check::unsupported("page_size", "16, 32, 64 or 128", fmt::format("{}", page_size));
  }
  if (max_seq_len < 1 || max_seq_len > kMaxSeqLenLimit) {
    check::fail("max_seq_len", "1..2147450880 (2^31 - 32768)", fmt::format("{}", max_seq_len));
  }
  if (max_seq_len_q < 1) check::fail("max_seq_len_q", "1..8", fmt::format("{}", max_seq_len_q));
  if (max_seq_len_q > 8) check::unsupported("max_seq_len_q", "1..8", fmt::format("{}", max_seq_len_q));
  if (dtype != DType::kBf16 && dtype != DType::kE4m3) {
    check::unsupported("dtype", "bfloat16 or float8_e4m3fn", dtype_name(dtype));
  }
  if (out_dtype != DType::kBf16) check::unsupported("out_dtype", "bfloat16", dtype_name(out_dtype));
  if (mask != MaskType::kDense && mask != MaskType::kCausal) {
    check::fail("mask", "kDense or kCausal", fmt::format("{}", static_cast<int>(mask)));
  }
}

MlaPolicy MlaDecodePolicy::planner_policy() const {
  MlaPolicy p;
  p.heads = heads;
  p.page_size = page_size;
  p.max_seq_len = max_seq_len;
  p.max_seq_len_q = max_seq_len_q;
  p.packed = packed;
  p.fp8 = dtype == DType::kE4m3;
  p.causal = mask == MaskType::kCausal;
  return p;
}

SemanticKey MlaDecodePolicy::key(std::string_view arch) const { return SemanticKey(kMlaFamily, policy_json(*this), arch); }

std::uint64_t MlaDecodePolicy::fingerprint() const {
  const std::int32_t words[10] = {0x6d6c6164 /* family tag "mlad" */,
                                  heads,
                                  page_size,
                                  static_cast<std::int32_t>(max_seq_len & 0xffffffff),
                                  static_cast<std::int32_t>(max_seq_len >> 32),
                                  max_seq_len_q,
                                  packed ? 1 : 0,
                                  static_cast<std::int32_t>(dtype),
                                  static_cast<std::int32_t>(out_dtype),
                                  static_cast<std::int32_t>(mask)};
  return XXH3_64bits(words, sizeof words);
}

void register_mla_family() { register_family(std::make_unique<MlaFamily>()); }

}  // namespace kiln::mla
