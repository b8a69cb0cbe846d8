#pragma once
// NVFP4 cache writer: packs bf16 latent rows into the 384-byte format (pack), or scatters them into an
// existing cache through a slot mapping (append).
//
// Duplicate slots in an append: the lowest input row wins (upstream keeps the first occurrence too).
// Small appends find an earlier row with the same slot by scanning the slots before their own; large
// ones run two kernels: the claim kernel leaves, in each target slot's 4 padding bytes, row + 1 of
// the lowest row that targets it, and the write kernel lets only that row write, its record
// clearing the padding again. Zero padding (what every writer leaves) is a free slot: one CAS claims
// it. The claim trusts nothing else a slot's padding held before (a cache written by someone else,
// or never written): a non-zero word is taken as a claim of this launch only if it names a row of
// this batch that targets this slot, so stale words and garbage lose to any row.
#include "common/numeric.cuh"
#include "common/nvfp4_encode.cuh"
#include "common/nvfp4_format.cuh"
#include "common/pdl.cuh"
#include "common/writer_geometry.cuh"
#include "nvfp4_writer/params.cuh"

namespace kiln {

#ifdef __CUDACC__

// Every writer kernel is launched as a programmatic dependent of the previous kernel on the stream
// (common/pdl.cuh): its blocks may start before that kernel finishes, and read nothing until it has
// (pdl_wait). The trigger lets the next dependent start early in turn.

// Before the wait a kernel may only warm L2 (coherent for every SM) with the lines it will read:
// nothing reaches registers or L1 until the previous kernel's writes are visible. In a chain of
// writer calls this overlaps the next call's source reads with the current call's tail.
__device__ __forceinline__ void nvfp4_prefetch_row(const Nvfp4WriterParams& p, int row) {
  if (row >= kWriterPrefetchRows || row >= p.num_rows) return;
  const u16* src = static_cast<const u16*>(p.src) + row * p.src_row_stride;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 1024;" ::"l"(src) : "memory");
}

struct Nvfp4WriterRow {
  uint4 a, b;             // this lane's 16 source values (lanes 28..31: RoPE, copied as they are)
  u32 lo = 0, hi = 0;     // lanes 0..27: the group's E2M1 codes
  u32 scale = 0;          // lanes 0..27: the group's E4M3 scale
};

__device__ __forceinline__ Nvfp4WriterRow nvfp4_writer_load(const Nvfp4WriterParams& p, int row, int lane) {
  Nvfp4WriterRow r;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.src) + row * p.src_row_stride);
  r.a = src[2 * lane];
  r.b = src[2 * lane + 1];
  return r;
}

__device__ __forceinline__ void nvfp4_writer_encode(Nvfp4WriterRow& r, int lane) {
  if (lane < kNvfp4Groups) r.scale = nvfp4_encode_group16(r.a, r.b, r.lo, r.hi);
}

// Slots reaching here are in [0, num_slots) and int32 (pack: the launcher caps the rows at 2^31 - 1).
template <int kPageSize>
__device__ __forceinline__ u8* nvfp4_page(const Nvfp4WriterParams& p, int slot) {
  return static_cast<u8*>(p.cache) + static_cast<long long>(static_cast<unsigned>(slot) / kPageSize) * p.page_stride;
}

template <int kPageSize>
__device__ __forceinline__ u8* nvfp4_scale_record(const Nvfp4WriterParams& p, int slot) {
  return nvfp4_page<kPageSize>(p, slot) + kPageSize * kNvfp4DataBytes + static_cast<unsigned>(slot) % kPageSize * kNvfp4ScaleBytes;
}

template <int kPageSize>
__device__ __forceinline__ void nvfp4_writer_store(const Nvfp4WriterParams& p, int slot, int lane, const Nvfp4WriterRow& r) {
  u8* data = nvfp4_page<kPageSize>(p, slot) + static_cast<unsigned>(slot) % kPageSize * kNvfp4DataBytes;
  u8* scales = nvfp4_scale_record<kPageSize>(p, slot);
  if (lane < kNvfp4Groups) {
    *reinterpret_cast<uint2*>(data + lane * 8) = make_uint2(r.lo, r.hi);
    scales[lane] = static_cast<u8>(r.scale);
  } else {
    uint4* rope = reinterpret_cast<uint4*>(data + kNvfp4CodeBytes + (lane - kNvfp4Groups) * 32);
    rope[0] = r.a;
    rope[1] = r.b;
    // The zero padding in one 4-byte store: append's owner word never shows a half-cleared value.
    if (lane == kNvfp4Groups) *reinterpret_cast<u32*>(scales + kNvfp4Groups) = 0u;
  }
}

// Row i -> slot i. Each warp loads its rows before encoding any, so their reads overlap.
template <int kPageSize>
__global__ void __launch_bounds__(kWriterThreads) nvfp4_pack_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  if (lane < kWriterRowsPerWarp) nvfp4_prefetch_row(p, row0 + lane);
  pdl_wait();
  pdl_launch_dependents();
  Nvfp4WriterRow r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = nvfp4_writer_load(p, row0 + i, lane);
  }
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i >= p.num_rows) return;
    nvfp4_writer_encode(r[i], lane);
    nvfp4_writer_store<kPageSize>(p, row0 + i, lane, r[i]);
  }
}

// Appends of at most kWriterAppendScanRows rows: a row yields if an earlier row targets its slot.
// The block stages the slots up to its last row in shared memory once.
template <int kPageSize>
__global__ void __launch_bounds__(kWriterThreads) nvfp4_append_scan_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  __shared__ int slots[kWriterAppendScanRows];
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32;  // one row per warp
  if (lane == 0) nvfp4_prefetch_row(p, row);
  pdl_wait();
  pdl_launch_dependents();
  const bool live = row < p.num_rows;
  Nvfp4WriterRow r;
  if (live) r = nvfp4_writer_load(p, row, lane);  // in flight during the staging
  const int staged = min(p.num_rows, (blockIdx.x + 1) * kWriterWarpsPerBlock);
#pragma unroll
  for (int k = 0; k < kWriterAppendScanRows / kWriterThreads; ++k) {
    const int j = k * kWriterThreads + threadIdx.x;
    if (j < staged) slots[j] = p.slot_mapping[j];
  }
  __syncthreads();
  if (!live) return;
  const int slot = slots[row];
  if (slot < 0 || slot >= p.num_slots) return;
  bool earlier = false;
  for (int j = lane; j < row; j += 32) earlier |= slots[j] == slot;
  if (__any_sync(0xffffffffu, earlier)) return;
  nvfp4_writer_encode(r, lane);
  nvfp4_writer_store<kPageSize>(p, slot, lane, r);
}

// One thread per row: the lowest row of each target slot ends up in the slot's padding word.
template <int kPageSize>
__global__ void __launch_bounds__(kWriterClaimThreads) nvfp4_append_claim_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterClaimThreads + threadIdx.x;
  // The owner word this row will probably claim: the slot read here (from L2, past L1) may still
  // change before the wait, so it only picks a line to warm. (Warming the write kernel's rows here
  // too delays this grid's completion, which the write kernel waits for.)
  if (row < p.num_rows && row < kWriterPrefetchRows) {
    int guess;
    asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(guess) : "l"(p.slot_mapping + row));
    if (guess >= 0 && guess < p.num_slots) asm volatile("prefetch.global.L2 [%0];" ::"l"(nvfp4_scale_record<kPageSize>(p, guess)) : "memory");
  }
  // After the wait, so that the write kernel, starting now, reads inputs that are complete: it reads
  // and encodes its rows, then waits for this whole grid before it reads an owner word.
  pdl_wait();
  pdl_launch_dependents();
  const int slot = row < p.num_rows ? p.slot_mapping[row] : -1;
  const bool valid = slot >= 0 && slot < p.num_slots;
  // Rows of this warp with the same slot: only the lowest (lowest lane) claims.
  const unsigned same = __match_any_sync(0xffffffffu, valid ? slot : -1 - lane);
  if (!valid || __ffs(same) - 1 != lane) return;
  unsigned* owner = reinterpret_cast<unsigned*>(nvfp4_scale_record<kPageSize>(p, slot) + kNvfp4Groups);
  const unsigned me = static_cast<unsigned>(row) + 1u;
  for (unsigned cur = atomicCAS(owner, 0u, me); cur != 0u;) {
    const bool claimed = cur - 1u < static_cast<unsigned>(p.num_rows) && p.slot_mapping[cur - 1u] == slot;
    if (claimed && cur <= me) return;
    const unsigned seen = atomicCAS(owner, cur, me);
    if (seen == cur) return;
    cur = seen;
  }
}

// After the claim kernel: only each slot's owner writes. Each warp loads and encodes its rows
// before it waits for the claims; then lane i reads row i's owner word, all in one round trip.
template <int kPageSize>
__global__ void __launch_bounds__(kWriterThreads) nvfp4_append_write_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  int slot = -1;  // lanes below kWriterRowsPerWarp: the target of row row0 + lane, -1 when skipped
  if (lane < kWriterRowsPerWarp && row0 + lane < p.num_rows) {
    const int s = p.slot_mapping[row0 + lane];
    if (s >= 0 && s < p.num_slots) slot = s;
  }
  Nvfp4WriterRow r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = nvfp4_writer_load(p, row0 + i, lane);
  }
  const unsigned live = __ballot_sync(0xffffffffu, slot >= 0);
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if ((live >> i) & 1u) nvfp4_writer_encode(r[i], lane);
  }
  pdl_wait();  // the claims
  bool owner = false;
  if (slot >= 0) {
    owner = *reinterpret_cast<const volatile unsigned*>(nvfp4_scale_record<kPageSize>(p, slot) + kNvfp4Groups) == static_cast<unsigned>(row0 + lane) + 1u;
  }
  const unsigned write = __ballot_sync(0xffffffffu, owner);
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    const int s = __shfl_sync(0xffffffffu, slot, i);
    if ((write >> i) & 1u) nvfp4_writer_store<kPageSize>(p, s, lane, r[i]);
  }
}

#endif  // __CUDACC__

}  // namespace kiln
