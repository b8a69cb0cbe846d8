#pragma once
// The row loops of the cache writers' pack and append kernels, which both writer families share
// (nvfp4_writer, dsv41_writer): a warp per row, each lane a 16-value slice (writer_geometry.cuh).
// Every kernel is launched as a programmatic dependent of the previous kernel on the stream
// (common/pdl.cuh): before pdl_wait it may only warm L2 with the lines it will read.
//
// A format W supplies, for its Params (src, src_row_stride, num_rows, ...) and Row (a, b: the lane's
// 16 source values, ...) types:
//   encode(p, r, lane)           quantize the slice; every lane of the warp together
//   store(p, slot, lane, r)      write the slice's codes and scales to a slot
//   staged_slot(p, row)          the row's slot as the scan stages it (any int)
//   target(p, staged)            whether a staged slot is one to write
//   slot(p, row)                 the row's slot if it is one to write, else -1
//   owns(p, slot, row)           after the claims: whether `row` holds the slot's claim
// The claim kernel, which defines what a claim looks like, is each family's own.
#include "common/numeric.cuh"
#include "common/pdl.cuh"
#include "common/writer_geometry.cuh"

namespace kiln {

#ifdef __CUDACC__

// Before the wait a kernel may only warm L2 (coherent for every SM) with the lines it will read; in
// a chain of writer calls this overlaps the next call's source reads with the current call's tail.
template <class P>
__device__ __forceinline__ void writer_prefetch_row(const P& p, int row) {
  if (row >= kWriterPrefetchRows || row >= p.num_rows) return;
  const u16* src = static_cast<const u16*>(p.src) + row * p.src_row_stride;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 1024;" ::"l"(src) : "memory");
}

// The lane's 16 source values of a row.
template <class Row, class P>
__device__ __forceinline__ Row writer_load_row(const P& p, int row, int lane) {
  Row r;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.src) + row * p.src_row_stride);
  r.a = src[2 * lane];
  r.b = src[2 * lane + 1];
  return r;
}

// Row i -> slot i. Each warp loads its rows before encoding any, so that their reads overlap.
template <class W>
__global__ void __launch_bounds__(kWriterThreads) writer_pack_kernel(const __grid_constant__ typename W::Params p) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  if (lane < kWriterRowsPerWarp) writer_prefetch_row(p, row0 + lane);
  pdl_wait();
  pdl_launch_dependents();
  typename W::Row r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = writer_load_row<typename W::Row>(p, row0 + i, lane);
  }
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i >= p.num_rows) return;
    W::encode(p, r[i], lane);
    W::store(p, row0 + i, lane, r[i]);
  }
}

// Appends of at most kWriterAppendScanRows rows: a row yields if an earlier row targets its slot.
// The block stages the slots up to its last row in shared memory once.
template <class W>
__global__ void __launch_bounds__(kWriterThreads) writer_append_scan_kernel(const __grid_constant__ typename W::Params p) {
  __shared__ int slots[kWriterAppendScanRows];
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32;  // one row per warp
  if (lane == 0) writer_prefetch_row(p, row);
  pdl_wait();
  pdl_launch_dependents();
  const bool live = row < p.num_rows;
  typename W::Row r;
  if (live) r = writer_load_row<typename W::Row>(p, row, lane);  // in flight during the staging
  const int staged = min(p.num_rows, (blockIdx.x + 1) * kWriterWarpsPerBlock);
#pragma unroll
  for (int k = 0; k < kWriterAppendScanRows / kWriterThreads; ++k) {
    const int j = k * kWriterThreads + threadIdx.x;
    if (j < staged) slots[j] = W::staged_slot(p, j);
  }
  __syncthreads();
  if (!live) return;
  const int slot = slots[row];
  if (!W::target(p, slot)) return;
  bool earlier = false;
  for (int j = lane; j < row; j += 32) earlier |= slots[j] == slot;
  if (__any_sync(0xffffffffu, earlier)) return;
  W::encode(p, r, lane);
  W::store(p, slot, lane, r);
}

// After the claim kernel: only each slot's owner writes. Each warp loads and encodes its rows
// before it waits for the claims; then lane i reads row i's claim, all in one round trip.
template <class W>
__global__ void __launch_bounds__(kWriterThreads) writer_append_write_kernel(const __grid_constant__ typename W::Params p) {
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  int slot = -1;  // lanes below kWriterRowsPerWarp: the target of row row0 + lane, -1 when skipped
  if (lane < kWriterRowsPerWarp && row0 + lane < p.num_rows) slot = W::slot(p, row0 + lane);
  typename W::Row r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = writer_load_row<typename W::Row>(p, row0 + i, lane);
  }
  const unsigned live = __ballot_sync(0xffffffffu, slot >= 0);
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if ((live >> i) & 1u) W::encode(p, r[i], lane);
  }
  pdl_wait();  // the claims
  bool owner = false;
  if (slot >= 0) owner = W::owns(p, slot, row0 + lane);
  const unsigned write = __ballot_sync(0xffffffffu, owner);
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    const int s = __shfl_sync(0xffffffffu, slot, i);
    if ((write >> i) & 1u) W::store(p, s, lane, r[i]);
  }
}

#endif  // __CUDACC__

}  // namespace kiln
