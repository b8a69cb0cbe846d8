#pragma once
// DeepSeek-V4.1 cache writers: quantize bf16/fp16 latent rows into the 528 B FP8 cache (kBits = 8)
// or the 288 B FP4 cache (kBits = 4), FOOTER layout: page p holds page_size data rows, then
// page_size scale rows. pack writes row i to slot i; append scatters rows through a slot mapping.
//
// Duplicate slots in an append: the lowest input row wins. Up to kWriterAppendScanRows rows, each
// row looks for an earlier row with its slot. Larger appends run a claim kernel, which leaves in the
// first 8 scale bytes of each target slot the claim word (row + 1) << 8 of the slot's lowest row,
// then a write kernel in which only that row writes. A claim's low byte is 0, a value no writer
// ever stores as a first scale byte (FP8 scales are 0x72..0xF7 or 0xFF, FP4 scales 0x01..0x7F),
// and the owner replaces the word with one 8-byte store: a row that reads the slot while or after
// it is written never takes the scales for its own claim. Nothing else a slot held before is
// trusted: a word counts as a claim only if it names a row of this batch that targets this slot.
#include "common/dsv41_format.cuh"
#include "common/numeric.cuh"
#include "common/pdl.cuh"
#include "common/writer_geometry.cuh"
#include "dsv41_writer/encode.cuh"
#include "dsv41_writer/params.cuh"

namespace kiln {

#ifdef __CUDACC__

template <int kBits>
struct Dsv41Record {
  static_assert(kBits == kDsv41Fp8Bits || kBits == kDsv41Fp4Bits, "8 (528 B cache) or 4 (288 B cache)");
  static constexpr int kData = kBits == kDsv41Fp8Bits ? kDsv41MainDataBytes : kDsv41ExtraDataBytes;
  static constexpr int kScale = kBits == kDsv41Fp8Bits ? kDsv41MainScaleBytes : kDsv41ExtraScaleBytes;
  static constexpr int kStoreLanes = kScale / 8;  // lanes that store 8 scale bytes each
};

// Every writer kernel is launched as a programmatic dependent of the previous kernel on the stream
// (common/pdl.cuh): it reads nothing before pdl_wait, but may warm L2 with the lines it will read.
__device__ __forceinline__ void dsv41_prefetch_row(const Dsv41WriterParams& p, int row) {
  if (row >= kWriterPrefetchRows || row >= p.num_rows) return;
  const u16* src = static_cast<const u16*>(p.src) + row * p.src_row_stride;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 1024;" ::"l"(src) : "memory");
}

struct Dsv41Row {
  uint4 a, b;          // this lane's 16 source values
  uint4 codes;         // FP8: 16 code bytes; FP4: 8 code bytes in x, y
  u64 scales = 0;      // lanes below kStoreLanes: 8 scale bytes of the record
};

__device__ __forceinline__ Dsv41Row dsv41_load(const Dsv41WriterParams& p, int row, int lane) {
  Dsv41Row r;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.src) + row * p.src_row_stride);
  r.a = src[2 * lane];
  r.b = src[2 * lane + 1];
  return r;
}

// Every lane of the warp calls this together (FP8 groups span two lanes; the scales are gathered
// into the storing lanes by shuffles).
template <int kBits>
__device__ __forceinline__ void dsv41_encode(const Dsv41WriterParams& p, Dsv41Row& r, int lane) {
  float x[16];
  dsv41_widen(r.a, r.b, p.src_fp16 != 0, x);
  u32 scale;
  int first;  // lane holding the scale that goes to byte k of this lane's 8: first + k * step
  int step;
  if constexpr (kBits == kDsv41Fp8Bits) {
    scale = dsv41_fp8_encode(x, r.codes);
    first = 16 * (lane & 1);  // scale g sits in lanes 2g and 2g + 1
    step = 2;
  } else {
    uint2 c;
    scale = dsv41_fp4_encode(x, c);
    r.codes = make_uint4(c.x, c.y, 0u, 0u);
    first = 8 * (lane & 3);
    step = 1;
  }
  u64 w = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) w |= u64(__shfl_sync(0xffffffffu, scale, first + k * step)) << (8 * k);
  r.scales = w;
}

__device__ __forceinline__ int dsv41_slot(const Dsv41WriterParams& p, int row) {
  const long long s = p.slot_i64 ? static_cast<const long long*>(p.slot_mapping)[row] : static_cast<const int*>(p.slot_mapping)[row];
  return s >= 0 && s < p.num_slots ? static_cast<int>(s) : -1;
}

template <int kBits>
__device__ __forceinline__ u8* dsv41_page(const Dsv41WriterParams& p, int slot) {
  return static_cast<u8*>(p.cache) + static_cast<long long>(static_cast<unsigned>(slot) / static_cast<unsigned>(p.page_size)) * p.page_stride;
}

// The first scale byte of a slot's record (8-byte aligned: pages are 16-byte aligned and every
// data and scale row is a multiple of 16 bytes).
template <int kBits>
__device__ __forceinline__ u8* dsv41_scales(const Dsv41WriterParams& p, int slot) {
  using R = Dsv41Record<kBits>;
  return dsv41_page<kBits>(p, slot) + static_cast<long long>(p.page_size) * R::kData +
         static_cast<long long>(static_cast<unsigned>(slot) % static_cast<unsigned>(p.page_size)) * R::kScale;
}

template <int kBits>
__device__ __forceinline__ void dsv41_store(const Dsv41WriterParams& p, int slot, int lane, const Dsv41Row& r) {
  using R = Dsv41Record<kBits>;
  u8* data = dsv41_page<kBits>(p, slot) + static_cast<long long>(static_cast<unsigned>(slot) % static_cast<unsigned>(p.page_size)) * R::kData;
  if constexpr (kBits == kDsv41Fp8Bits) {
    *reinterpret_cast<uint4*>(data + 16 * lane) = r.codes;
  } else {
    *reinterpret_cast<uint2*>(data + 8 * lane) = make_uint2(r.codes.x, r.codes.y);
  }
  // One 8-byte store per word: a claim word is never seen half replaced.
  if (lane < R::kStoreLanes) reinterpret_cast<u64*>(dsv41_scales<kBits>(p, slot))[lane] = r.scales;
}

// Row i -> slot i. Each warp loads its rows before encoding any, so that their reads overlap.
template <int kBits>
__global__ void __launch_bounds__(kWriterThreads) dsv41_pack_kernel(const __grid_constant__ Dsv41WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  if (lane < kWriterRowsPerWarp) dsv41_prefetch_row(p, row0 + lane);
  pdl_wait();
  pdl_launch_dependents();
  Dsv41Row r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = dsv41_load(p, row0 + i, lane);
  }
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i >= p.num_rows) return;
    dsv41_encode<kBits>(p, r[i], lane);
    dsv41_store<kBits>(p, row0 + i, lane, r[i]);
  }
}

// Appends of at most kWriterAppendScanRows rows: a row yields if an earlier row targets its slot.
// The block stages the (validated) slots up to its last row in shared memory once.
template <int kBits>
__global__ void __launch_bounds__(kWriterThreads) dsv41_append_scan_kernel(const __grid_constant__ Dsv41WriterParams p) {
  __shared__ int slots[kWriterAppendScanRows];
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32;  // one row per warp
  if (lane == 0) dsv41_prefetch_row(p, row);
  pdl_wait();
  pdl_launch_dependents();
  const bool live = row < p.num_rows;
  Dsv41Row r;
  if (live) r = dsv41_load(p, row, lane);  // in flight during the staging
  const int staged = min(p.num_rows, (blockIdx.x + 1) * kWriterWarpsPerBlock);
#pragma unroll
  for (int k = 0; k < kWriterAppendScanRows / kWriterThreads; ++k) {
    const int j = k * kWriterThreads + threadIdx.x;
    if (j < staged) slots[j] = dsv41_slot(p, j);
  }
  __syncthreads();
  if (!live) return;
  const int slot = slots[row];
  if (slot < 0) return;
  bool earlier = false;
  for (int j = lane; j < row; j += 32) earlier |= slots[j] == slot;
  if (__any_sync(0xffffffffu, earlier)) return;
  dsv41_encode<kBits>(p, r, lane);
  dsv41_store<kBits>(p, slot, lane, r);
}

// One thread per row: the lowest row of each target slot ends up in the slot's claim word.
template <int kBits>
__global__ void __launch_bounds__(kWriterClaimThreads) dsv41_append_claim_kernel(const __grid_constant__ Dsv41WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterClaimThreads + threadIdx.x;
  // After the wait, so that the write kernel, starting now, reads complete inputs: it loads and
  // encodes its rows, then waits for this whole grid before it reads a claim word.
  pdl_wait();
  pdl_launch_dependents();
  const int slot = row < p.num_rows ? dsv41_slot(p, row) : -1;
  // Rows of this warp with the same slot: only the lowest (lowest lane) claims.
  const unsigned same = __match_any_sync(0xffffffffu, slot >= 0 ? slot : -1 - lane);
  if (slot < 0 || __ffs(same) - 1 != lane) return;
  u64* owner = reinterpret_cast<u64*>(dsv41_scales<kBits>(p, slot));
  const u64 me = (u64(row) + 1u) << 8;
  u64 cur = *reinterpret_cast<volatile u64*>(owner);
  for (;;) {
    if ((cur & 0xffu) == 0u) {
      const u64 other = (cur >> 8) - 1u;  // the row a claim names (cur >> 8 == 0: none)
      if (other < u64(p.num_rows) && other <= u64(row) && dsv41_slot(p, static_cast<int>(other)) == slot) return;
    }
    const u64 seen = atomicCAS(reinterpret_cast<unsigned long long*>(owner), cur, me);
    if (seen == cur) return;
    cur = seen;
  }
}

// After the claim kernel: only each slot's owner writes. Each warp loads and encodes its rows
// before it waits for the claims; then lane i reads row i's claim word, all in one round trip.
template <int kBits>
__global__ void __launch_bounds__(kWriterThreads) dsv41_append_write_kernel(const __grid_constant__ Dsv41WriterParams p) {
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  int slot = -1;  // lanes below kWriterRowsPerWarp: the target of row row0 + lane, -1 when skipped
  if (lane < kWriterRowsPerWarp && row0 + lane < p.num_rows) slot = dsv41_slot(p, row0 + lane);
  Dsv41Row r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = dsv41_load(p, row0 + i, lane);
  }
  const unsigned live = __ballot_sync(0xffffffffu, slot >= 0);
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if ((live >> i) & 1u) dsv41_encode<kBits>(p, r[i], lane);
  }
  pdl_wait();  // the claims
  bool owner = false;
  if (slot >= 0) {
    owner = *reinterpret_cast<const volatile u64*>(dsv41_scales<kBits>(p, slot)) == (u64(row0 + lane) + 1u) << 8;
  }
  const unsigned write = __ballot_sync(0xffffffffu, owner);
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    const int s = __shfl_sync(0xffffffffu, slot, i);
    if ((write >> i) & 1u) dsv41_store<kBits>(p, s, lane, r[i]);
  }
}

#endif  // __CUDACC__

}  // namespace kiln
