#pragma once
// The paged MLA decode family ("mla_decode"): the static policy an engine warms, its semantic key and
// the Family that renders the decode kernel's module. The two forms of the split-KV combine depend on
// heads, max_seq_len_q and packed only: they are a module of their own (family "mla_combine"), which
// every decode key with those three values shares and which warming a decode key warms too.
//
// Policy JSON (canonical, every field present):
//   {"heads": 1..128, "page_size": 16|32|64|128, "max_seq_len": 1..2^31-32768, "max_seq_len_q": 1..64,
//    "packed": bool, "dtype": "bf16"|"fp8_e4m3", "out_dtype": "bf16", "mask": "dense"|"causal",
//    "kernel": "auto"|"mma_sync"|"wgmma"|"wgmma_kv", "precision": "exact"|"bf16"}
// heads and max_seq_len have no default (no value is right for every model); the rest default to
// page_size 64, max_seq_len_q 1, packed false, dtype bf16, out_dtype bf16, mask causal, kernel auto,
// precision exact.
// kernel: auto lets the planner pick per GPU (on sm_90a: for bf16 the KV-on-M wgmma kernel up to 32
// rows per request, the wgmma kernel above; for fp8 the wgmma kernel; else the mma.sync kernel);
// mma_sync forces the mma.sync kernel in the configuration that fits ~99 KB of shared memory (what
// sm_120 runs); wgmma forces the Hopper kernel (sm_90a only); wgmma_kv forces the Hopper kernel with
// KV tokens on the MMA's M side (sm_90a and bf16 only).
// precision (bf16 pages; fp8_e4m3 takes exact only, its P is one f16): exact carries the softmax
// probabilities P into P V as bf16 hi + lo and meets the contract's tolerances on every input; bf16
// rounds P once to bf16 (FlashMLA's numerics), one MMA per V fragment instead of two.
#include <cstdint>
#include <string_view>

#include "kiln/jit/semantic_key.h"
#include "kiln/kernel_templates/mla_decode/params.cuh"
#include "kiln/runtime/policy_schema.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::mla {

inline constexpr const char* kMlaFamily = "mla_decode";

enum class MaskType { kDense, kCausal };

std::string_view mask_name(MaskType mask);

// The rules of the fields the launcher also reads from its arguments (heads and page_size from
// tensor shapes), so that both paths share one bound and one error code.
inline constexpr IntRule kHeadsRule{.expected = "1..128", .min = 1, .supported_max = 128};
inline constexpr IntRule kPageSizeRule{.expected = "16, 32, 64 or 128", .supported_values = {16, 32, 64, 128}};
inline constexpr IntRule kMaxSeqLenRule{.expected = "1..2147450880 (2^31 - 32768)", .min = 1,
                                        .max = (1LL << 31) - 32768};
inline constexpr IntRule kMaxSeqLenQRule{.expected = "1..64", .min = 1, .supported_max = 64};
// Requests per call: the decode grid's z and the combine grid's y carry the request index.
inline constexpr IntRule kBatchRule{.expected = "a batch of 0..65535 requests", .min = 0, .supported_max = 65535};

enum class MlaKernel {
  kAuto = kMlaKernelAuto,
  kMmaSync = kMlaKernelMmaSync,
  kWgmma = kMlaKernelWgmma,
  kWgmmaKv = kMlaKernelWgmmaKv
};

enum class MlaPrecision { kExact = kMlaPrecisionExact, kBf16 = kMlaPrecisionBf16 };

// The semantic-key fields of one MLA decode kernel (everything except the target arch); the planner
// and the launcher take it as it is.
struct MlaDecodePolicy {
  int heads = 0;
  int page_size = 64;
  long long max_seq_len = 0;
  int max_seq_len_q = 1;
  bool packed = false;
  DType dtype = DType::kBf16;      // query and cache: kBf16 or kE4m3
  DType out_dtype = DType::kBf16;  // kBf16 only
  MaskType mask = MaskType::kCausal;
  MlaKernel kernel = MlaKernel::kAuto;
  MlaPrecision precision = MlaPrecision::kExact;

  bool fp8() const { return dtype == DType::kE4m3; }
  bool causal() const { return mask == MaskType::kCausal; }

  // Throws kiln::Error naming the field: kInvalidArgument for values the contract forbids (heads 0,
  // max_seq_len 0), kUnsupported for valid requests kiln does not implement (heads 256, fp16 out).
  void validate() const;

  SemanticKey key(std::string_view arch) const;

  // Cheap identity for KernelService::acquire's fast path; hashes the fields, not a string.
  std::uint64_t fingerprint() const;
};

// The combine's module: {"heads": 1..128, "max_seq_len_q": 1..64, "packed": bool} (heads required,
// then 1 and false), the same rules as the decode policy's fields.
inline constexpr const char* kMlaCombineFamily = "mla_combine";

struct MlaCombinePolicy {
  int heads = 0;
  int max_seq_len_q = 1;
  bool packed = false;

  void validate() const;
  SemanticKey key(std::string_view arch) const;
};

// Registers both families with the JIT (idempotent). runtime/families.cpp calls it.
void register_mla_family();

}  // namespace kiln::mla
