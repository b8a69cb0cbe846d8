#pragma once
// The NVFP4 cache writer family: pack a bf16 latent tensor into the 384-byte format, or append rows
// into an existing cache through a slot mapping.
#include <cuda.h>

#include <vector>

#include "jit/semantic_key.h"
#include "runtime/tensor_view.h"

namespace kiln::nvfp4 {

inline constexpr const char* kWriterFamily = "nvfp4_writer";

enum class WriterOp { kPack, kAppend };

struct WriterPolicy {
  WriterOp op = WriterOp::kAppend;
  int page_size = 64;

  SemanticKey key(std::string_view arch) const;
};

void register_writer_family();

// latent: bf16 [P, page, 512] (rows 16-byte aligned, last dim contiguous).
// cache: uint8 [P, page, 384], HND [P, 1, page, 384] or NHD [P, page, 1, 384], same P and page.
void pack(const TensorView& latent, const TensorView& cache, CUstream stream);

// rows: bf16 [N, 512]; slot_mapping: int32 [N] (slot = page * page_size + row; negative or
// >= P * page_size skipped; duplicates: the lowest input row wins). cache as above.
void append(const TensorView& rows, const TensorView& slot_mapping, const TensorView& cache, CUstream stream);

// Compiles (or loads from cache) and loads the writer for `policy` on each device.
void warm(const WriterPolicy& policy, const std::vector<int>& devices);

}  // namespace kiln::nvfp4
