#pragma once
// The NVFP4 cache writer family: pack a bf16 latent tensor into the 384-byte format, or append rows
// into an existing cache through a slot mapping.
//
// Policy JSON: {"op": "pack"|"append" (default "append"), "page_size": 1..1024 (default 64)}.
#include <cuda.h>

#include <cstdint>
#include <vector>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::nvfp4 {

inline constexpr const char* kWriterFamily = "nvfp4_writer";

enum class WriterOp { kPack, kAppend };

struct WriterPolicy {
  WriterOp op = WriterOp::kAppend;
  int page_size = 64;

  // Throws kiln::Error naming the field.
  void validate() const;
  SemanticKey key(std::string_view arch) const;
  // Cheap identity for KernelService::acquire's fast path.
  std::uint64_t fingerprint() const;
};

// Registers the family with the JIT (idempotent). runtime/families.cpp calls it.
void register_writer_family();

// latent: bf16 [P, page, 512] (rows 16-byte aligned, last dim contiguous).
// cache: uint8 [P, page, 384], HND [P, 1, page, 384] or NHD [P, page, 1, 384], same P and page.
void pack(const TensorView& latent, const TensorView& cache, CUstream stream,
          KernelService& service = KernelService::global());

// rows: bf16 [N, 512]; slot_mapping: int32 [N] (slot = page * page_size + row; negative or
// >= P * page_size skipped; duplicates: the lowest input row wins). cache as above. One launch up to
// 1024 rows, two above (O(N) whatever the duplicates; no scratch: a target slot's 4 padding bytes
// carry its claim between them and are zero again afterwards).
void append(const TensorView& rows, const TensorView& slot_mapping, const TensorView& cache, CUstream stream,
            KernelService& service = KernelService::global());

// Compiles (or loads from cache) and loads the writer for `policy` on each device.
void warm(const WriterPolicy& policy, const std::vector<int>& devices, KernelService& service = KernelService::global());

}  // namespace kiln::nvfp4
