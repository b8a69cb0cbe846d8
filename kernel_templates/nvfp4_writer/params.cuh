#pragma once
// Parameters of the NVFP4 cache writer; shared by the host launcher and the kernel.

namespace kiln {

struct Nvfp4WriterParams {
  const void* src;           // bf16 rows of 512 values, 16-byte aligned
  long long src_row_stride;  // elements between consecutive source rows
  void* cache;               // first byte of page 0
  long long page_stride;     // bytes between pages (>= page_size * 384, multiple of 16)
  const int* slot_mapping;   // append: destination slot per row; pack: null (row i -> slot i)
  long long num_slots;       // pages * page_size; slots outside [0, num_slots) are skipped
  int num_rows;
};

// One warp quantizes one token row: lanes 0..27 own a 16-value group each, lanes 28..31 the RoPE tail.
inline constexpr int kNvfp4WriterRowsPerBlock = 4;
inline constexpr int kNvfp4WriterThreads = 32 * kNvfp4WriterRowsPerBlock;

}  // namespace kiln
