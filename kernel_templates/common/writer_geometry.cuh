#pragma once
// The launch geometry both cache writers share (nvfp4_writer, dsv41_writer). Host- and
// device-visible, no includes.

namespace kiln {

// A warp writes one token row at a time, each lane a 16-value slice. Pack and the append write
// kernel give each warp kWriterRowsPerWarp rows; the one-launch append gives it one.
inline constexpr int kWriterWarpsPerBlock = 8;
inline constexpr int kWriterThreads = 32 * kWriterWarpsPerBlock;
inline constexpr int kWriterRowsPerWarp = 2;

// Appends of at most this many rows resolve duplicate slots in one launch, each row comparing its
// slot with those of the rows before it (staged in shared memory). Larger appends claim slots first
// (one thread per row), then write.
inline constexpr int kWriterAppendScanRows = 1024;
inline constexpr int kWriterClaimThreads = 256;

// Rows whose source lines a kernel warms in L2 before it waits for the previous kernel: the first
// 16 MB of bf16 rows, a third of the H200's L2, so that a large call does not evict its own lines.
inline constexpr int kWriterPrefetchRows = 16384;

// Entry points of an append module, in KernelSource order.
inline constexpr int kWriterAppendScanEntry = 0;
inline constexpr int kWriterAppendClaimEntry = 1;
inline constexpr int kWriterAppendWriteEntry = 2;

}  // namespace kiln
