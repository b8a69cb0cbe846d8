#pragma once
// The "sparse_dsv41" family: sparse MLA decode over DeepSeek-V4.1's FOOTER caches (528-byte FP8 main
// records, optional 288-byte FP4 extra records; runtime/sparse_dsv41/README.md). The static policy
// names a launch's kernel: heads, has_extra and variant are template arguments; split is a flag the
// kernel reads at run time (so keys differing only in it share one module), as are page sizes, page
// strides, topk and every length.
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/policy_schema.h"

namespace kiln::dsv41 {

inline constexpr const char* kDsv41Family = "sparse_dsv41";

// The head counts served (FlashInfer's manifest `head_counts`), ascending.
inline constexpr int kDsv41Heads[] = {8, 16, 32, 48, 64, 80, 96, 112, 128};
bool dsv41_heads_supported(std::int64_t heads);

// Which decode kernel a key builds. Both compute the same attention; they differ in the GPUs they
// run on and in speed.
enum class Dsv41Variant {
  kDefault,  // mma.sync, one 16-head tile per CTA, fits sm_120's 99 KiB (sm_90a and sm_120a)
  kSm90,     // warpgroup MMA, 64 heads per CTA (sm_90a only)
};
// The policy field's and format_info()["variants"]'s spellings: "default", "sm90".
const char* dsv41_variant_name(Dsv41Variant variant);
// "default" / "sm90" -> the variant; anything else -> nullopt.
std::optional<Dsv41Variant> parse_dsv41_variant(std::string_view name);

struct Dsv41Policy {
  int heads = 64;          // H: one of kDsv41Heads
  bool has_extra = false;  // a 288-byte extra pool shares the softmax
  bool split = false;      // num_splits > 1: decode into mid_out/mid_lse, then the merge kernel
  Dsv41Variant variant = Dsv41Variant::kDefault;

  // Throws kiln::Error(kInvalidArgument) naming the field.
  void validate() const;
  // Also refuses (kUnsupported, naming variant) an "sm90" key for any arch but sm_90a.
  SemanticKey key(std::string_view arch) const;
  // Cheap identity for KernelService::acquire (the arch follows from the device).
  std::uint64_t fingerprint() const;

  bool operator==(const Dsv41Policy&) const = default;
};

// Registers the family with the JIT (idempotent). runtime/families.cpp calls it.
void register_dsv41_family();

}  // namespace kiln::dsv41
