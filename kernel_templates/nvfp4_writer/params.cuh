#pragma once
// Parameters of the NVFP4 cache writer; shared by the host launcher and the kernels. Lanes 0..27 of
// a writing warp own a 16-value group each, lanes 28..31 the RoPE tail; the launch geometry is
// common/writer_geometry.cuh.

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

}  // namespace kiln
