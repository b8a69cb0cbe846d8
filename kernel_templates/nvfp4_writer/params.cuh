#pragma once
// Parameters of the NVFP4 cache writer; shared by the host launcher and the kernels.

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

// A warp writes token rows one at a time: lanes 0..27 own a 16-value group each, lanes 28..31 the
// RoPE tail. Pack and the append write kernel give each warp kNvfp4RowsPerWarp rows; the
// single-launch append gives it one.
inline constexpr int kNvfp4WarpsPerBlock = 8;
inline constexpr int kNvfp4WriterThreads = 32 * kNvfp4WarpsPerBlock;
inline constexpr int kNvfp4RowsPerWarp = 2;

// Appends of at most this many rows resolve duplicate slots in one launch, each row comparing its
// slot with those of the rows before it (staged in shared memory). Larger appends claim slots first
// (one thread per row), then write.
inline constexpr int kNvfp4AppendScanRows = 1024;
inline constexpr int kNvfp4ClaimThreads = 256;

// Rows whose source lines a kernel warms in L2 before it waits for the previous kernel: the first
// 16 MB of rows, a third of the H200's L2, so that a large call does not evict its own lines.
inline constexpr int kNvfp4PrefetchRows = 16384;

// Entry points of an append module, in KernelSource order.
inline constexpr int kNvfp4AppendScanEntry = 0;
inline constexpr int kNvfp4AppendClaimEntry = 1;
inline constexpr int kNvfp4AppendWriteEntry = 2;

}  // namespace kiln
