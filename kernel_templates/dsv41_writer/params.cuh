#pragma once
// Parameters of the DeepSeek-V4.1 cache writers (528 B FP8 main cache, 288 B FP4 extra cache);
// shared by the host launcher and the kernels. The record geometry is common/dsv41_format.cuh; lane
// l of a writing warp encodes dims 16l .. 16l + 15 (FP8: half of a 32-value group, FP4: one 16-value
// group), and the launch geometry is common/writer_geometry.cuh.

namespace kiln {

struct Dsv41WriterParams {
  const void* src;           // bf16 or fp16 rows of 512 values, 16-byte aligned
  long long src_row_stride;  // elements between consecutive source rows
  void* cache;               // first byte of page 0 (16-byte aligned)
  long long page_stride;     // bytes between pages (>= page_size * record bytes, multiple of 16)
  const void* slot_mapping;  // append: int32 or int64 destination slot per row; pack: null (row i -> slot i)
  int num_slots;             // pages * page_size; slots outside [0, num_slots) are skipped
  int page_size;             // rows per page (any value >= 1)
  int num_rows;
  int src_fp16;              // 1: the rows are fp16; 0: bf16
  int slot_i64;              // 1: slot_mapping is int64; 0: int32
};

// Element widths, the kernels' template argument: 8 = the 528 B FP8 cache, 4 = the 288 B FP4 cache.
inline constexpr int kDsv41Fp8Bits = 8;
inline constexpr int kDsv41Fp4Bits = 4;

}  // namespace kiln
