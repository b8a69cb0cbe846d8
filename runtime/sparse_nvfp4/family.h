#pragma once
// The "sparse_nvfp4" family: sparse MLA decode over the 384-byte NVFP4 cache
// (runtime/sparse_nvfp4/README.md). The static policy names a launch's kernel: heads, head_tiles,
// has_extra and kernel are template arguments; split is a flag the kernel reads at run time (so keys
// differing only in it share one module), as are page sizes, page strides, topk and every length.
// The merge of a split plan depends on heads only: it is a module of its own (family "sparse_merge"),
// the companion of every sparse_nvfp4 and sparse_dsv41 key with that head count.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/policy_schema.h"

namespace kiln::sparse {

inline constexpr const char* kSparseFamily = "sparse_nvfp4";

// The head-count rule, shared by the policy, the planners and the launcher.
inline constexpr IntRule kHeadsRule{.expected = "a multiple of 8 in [8, 128]", .min = 8, .max = 128, .multiple_of = 8};

// Which decode kernel a key builds. Every one computes the same function; they differ in the GPUs
// they fit and in speed.
enum class SparseKernel {
  kMma,       // mma.sync, 16 or 32 heads per block, two decoded tiles: 206-227 KiB (sm_90a)
  kMmaSmall,  // mma.sync, 16 heads per block, one decoded tile, no raw staging: 87,600 B (fits sm_120's 99 KiB)
  kSm90,      // warpgroup MMA, 64 heads per block, decoded once per block (sm_90a only)
};
const char* sparse_kernel_name(SparseKernel kernel);  // "mma", "mma_small", "sm90": the policy field's values

struct SparsePolicy {
  int heads = 64;         // H: a multiple of 8 in [8, 128]
  int head_tiles = 1;     // 1 (16 heads per block) or 2 (32 heads share one gather; H % 32 == 0; kMma only)
  bool has_extra = false; // a second (extra) pool shares the softmax
  bool split = false;     // num_splits > 1: decode into mid_out/mid_lse, then the merge kernel
  SparseKernel kernel = SparseKernel::kMma;

  // Throws kiln::Error(kInvalidArgument) naming the field.
  void validate() const;
  SemanticKey key(std::string_view arch) const;
  // Cheap identity for KernelService::acquire (the arch follows from the device).
  std::uint64_t fingerprint() const;

  bool operator==(const SparsePolicy&) const = default;
};

// The merge's module: {"heads": a multiple of 8 in [8, 128]} (required).
inline constexpr const char* kSparseMergeFamily = "sparse_merge";

struct SparseMergePolicy {
  int heads = 0;

  void validate() const;
  SemanticKey key(std::string_view arch) const;
};

// Registers both families with the JIT (idempotent). runtime/families.cpp calls it.
void register_sparse_family();

// The name expressions of a sparse family's sm90 module (`family`: "sparse_nvfp4" or "sparse_dsv41"):
// its kernel for H's head groups, and for H > 64 also the one-group kernel that an unpaired launch
// runs (kSparseSm90UnpairedEntry).
std::vector<std::string> sparse_sm90_entries(std::string_view family, int heads, bool has_extra);

}  // namespace kiln::sparse
