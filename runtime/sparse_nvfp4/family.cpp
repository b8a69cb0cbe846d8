#include "runtime/sparse_nvfp4/family.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <memory>
#include <optional>
#include <string_view>

#include "jit/error.h"
#include "jit/family.h"

namespace kiln::sparse {

namespace {

using nlohmann::json;

std::optional<SparseKernel> parse_kernel(std::string_view name) {
  for (SparseKernel k : {SparseKernel::kMma, SparseKernel::kMmaSmall, SparseKernel::kSm90}) {
    if (name == sparse_kernel_name(k)) return k;
  }
  return std::nullopt;
}

[[noreturn]] void bad_field(std::string_view field, std::string_view expected, const json& given) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("sparse_nvfp4 policy field '{}' must be {}, got {}", field, expected, json_text(given)));
}

class SparseFamily final : public Family {
 public:
  std::string_view name() const override { return kSparseFamily; }

  json canonicalize(const json& policy) const override {
    if (!policy.is_object()) throw Error(ErrorCode::kInvalidArgument, "sparse_nvfp4 policy must be a JSON object");
    // No default head count: a key for the wrong H would warm a kernel the server never launches.
    json out = {{"head_tiles", 1}, {"has_extra", false}, {"split", false}, {"kernel", "mma"}};
    bool has_heads = false;
    for (const auto& [field, value] : policy.items()) {
      if (field == "heads") {
        if (!value.is_number_integer() || value.get<long long>() < 8 || value.get<long long>() > 128 ||
            value.get<long long>() % 8 != 0) {
          bad_field("heads", "a multiple of 8 in [8, 128]", value);
        }
        out["heads"] = value.get<long long>();
        has_heads = true;
      } else if (field == "head_tiles") {
        if (!value.is_number_integer() || (value.get<long long>() != 1 && value.get<long long>() != 2)) {
          bad_field("head_tiles", "1 or 2", value);
        }
        out["head_tiles"] = value.get<long long>();
      } else if (field == "has_extra" || field == "split") {
        if (!value.is_boolean()) bad_field(field, "true or false", value);
        out[field] = value.get<bool>();
      } else if (field == "kernel") {
        if (!value.is_string() || !parse_kernel(value.get<std::string>())) bad_field("kernel", "\"mma\", \"mma_small\" or \"sm90\"", value);
        out["kernel"] = value.get<std::string>();
      } else {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("sparse_nvfp4 policy has no field '{}'; fields: heads, head_tiles, has_extra, split, kernel", field));
      }
    }
    if (!has_heads) {
      throw Error(ErrorCode::kInvalidArgument, "sparse_nvfp4 policy needs field 'heads' (a multiple of 8 in [8, 128])");
    }
    if (out["head_tiles"] == 2 && out["heads"].get<long long>() % 32 != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("sparse_nvfp4 policy field 'head_tiles' is 2, which needs heads % 32 == 0, but heads is {}",
                              out["heads"].get<long long>()));
    }
    if (out["head_tiles"] == 2 && out["kernel"] != "mma") {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("sparse_nvfp4 policy field 'head_tiles' is 2, which only kernel \"mma\" has; kernel \"{}\" "
                              "maps every plan onto its own blocks, give head_tiles 1",
                              out["kernel"].get<std::string>()));
    }
    return out;
  }

  KernelSource render(const json& policy) const override {
    const int heads = policy["heads"].get<int>();
    const bool split = policy["split"].get<bool>();
    const char* extra = policy["has_extra"].get<bool>() ? "true" : "false";
    const SparseKernel kernel = *parse_kernel(policy["kernel"].get<std::string>());
    KernelSource source;
    if (kernel == SparseKernel::kSm90) {
      source.source = "#include \"sparse_nvfp4/kernel_sm90.cuh\"\n";
      source.name_expressions.push_back(fmt::format("kiln::sparse_nvfp4_sm90_kernel<{}, {}, {}>", heads, extra, split ? "true" : "false"));
    } else {
      source.source = "#include \"sparse_nvfp4/kernel.cuh\"\n";
      source.name_expressions.push_back(fmt::format("kiln::sparse_nvfp4_decode_kernel<{}, {}, {}, {}, {}>", heads,
                                                    policy["head_tiles"].get<int>(), extra, split ? "true" : "false",
                                                    kernel == SparseKernel::kMmaSmall ? "true" : "false"));
    }
    // Entry 1 of a split module is its merge kernel, so one key warms both launches of the plan.
    if (split) source.name_expressions.push_back(fmt::format("kiln::sparse_nvfp4_merge_kernel<{}>", heads));
    return source;
  }
};

}  // namespace

const char* sparse_kernel_name(SparseKernel kernel) {
  switch (kernel) {
    case SparseKernel::kMma: return "mma";
    case SparseKernel::kMmaSmall: return "mma_small";
    case SparseKernel::kSm90: return "sm90";
  }
  return "mma";
}

SemanticKey SparsePolicy::key(std::string_view arch) const {
  return SemanticKey(kSparseFamily,
                     json{{"heads", heads}, {"head_tiles", head_tiles}, {"has_extra", has_extra}, {"split", split},
                          {"kernel", sparse_kernel_name(kernel)}},
                     arch);
}

std::uint64_t SparsePolicy::fingerprint() const {
  const std::int32_t words[6] = {0x73706172 /* family tag */, heads, head_tiles, has_extra ? 1 : 0, split ? 1 : 0,
                                 static_cast<std::int32_t>(kernel)};
  return XXH3_64bits(words, sizeof words);
}

void register_sparse_family() { register_family(std::make_unique<SparseFamily>()); }

}  // namespace kiln::sparse
