#pragma once
// The DeepSeek-V4.1 cache writers: quantize bf16/fp16 latent rows into the 528 B FP8 main cache or
// the 288 B FP4 extra cache (FOOTER layout), whole pages at once (pack) or row by row through a slot
// mapping (append). Contract: runtime/dsv41_writer/README.md.
//
// Policy JSON: {"format": "fp8"|"fp4" (default "fp8"), "op": "pack"|"append" (default "append")}.
// Page size, page stride, the row dtype (bf16 or fp16) and the slot dtype (int32 or int64) are
// read at run time: four keys per arch serve every cache.
#include <cuda.h>

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::dsv41 {

inline constexpr const char* kWriterFamily = "dsv41_writer";

enum class CacheFormat { kFp8, kFp4 };  // 528 B main cache / 288 B extra cache
enum class WriterOp { kPack, kAppend };
enum class KvLayout { kHnd, kNhd };     // where pack's result puts its singleton head axis

struct WriterPolicy {
  CacheFormat format = CacheFormat::kFp8;
  WriterOp op = WriterOp::kAppend;

  // Throws kiln::Error naming the field.
  void validate() const;
  SemanticKey key(std::string_view arch) const;
  // Cheap identity for KernelService::acquire's fast path.
  std::uint64_t fingerprint() const;
};

// Registers the family with the JIT (idempotent). runtime/families.cpp calls it.
void register_writer_family();

// 528 (kFp8) or 288 (kFp4).
int record_bytes(CacheFormat format);

// "HND" or "NHD"; anything else throws kInvalidArgument naming kv_layout.
KvLayout parse_kv_layout(std::string_view kv_layout);

// The uint8 cache pack() fills for `latent_kv`: [P, 1, page, record] (HND) or [P, page, 1, record]
// (NHD). Checks latent_kv as pack() does, so a caller can allocate the result only for valid input.
std::array<std::int64_t, 4> pack_cache_shape(CacheFormat format, const TensorView& latent_kv, KvLayout layout);

// latent_kv: bf16 or fp16, contiguous, 16-byte aligned, [P, page, 512] or with a singleton head axis
// ([P, 1, page, 512] or [P, page, 1, 512]); a 2-D latent has no page dimension and is refused.
// cache: any accepted view of the format (runtime/paged_cache_view.h) with the same P and page.
// Writes every row's data and scale bytes; a padded page's padding is left untouched.
void pack(CacheFormat format, const TensorView& latent_kv, const TensorView& cache, CUstream stream,
          KernelService& service = KernelService::global());

// latent_kv: bf16 or fp16 [N, 512] (or [N, 1, 512]), contiguous; slot_mapping: int32 or int64 [N],
// contiguous (slot = page * page_size + row; negative or >= P * page_size skipped; a slot named
// twice keeps its lowest row). Writes only the addressed rows' data and scale bytes. N == 0
// launches nothing. One launch up to 1024 rows, two above (O(N) whatever the duplicates, no
// scratch: the target slot's first 8 scale bytes carry its claim between them).
void append(CacheFormat format, const TensorView& latent_kv, const TensorView& slot_mapping, const TensorView& cache,
            CUstream stream, KernelService& service = KernelService::global());

// Compiles (or loads from cache) and loads the writer for `policy` on each device.
void warm(const WriterPolicy& policy, const std::vector<int>& devices, KernelService& service = KernelService::global());

}  // namespace kiln::dsv41
