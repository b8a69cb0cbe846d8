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
#include "common/writer_rows.cuh"
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

struct Dsv41Row {
  uint4 a, b;          // this lane's 16 source values
  uint4 codes;         // FP8: 16 code bytes; FP4: 8 code bytes in x, y
  u64 scales = 0;      // lanes below kStoreLanes: 8 scale bytes of the record
};

// The 528 B (kBits 8) or 288 B (kBits 4) format for common/writer_rows.cuh.
template <int kBits>
struct Dsv41WriterFormat {
  using Params = Dsv41WriterParams;
  using Row = Dsv41Row;
  using R = Dsv41Record<kBits>;

  // FP8 groups span two lanes; the scales are gathered into the storing lanes by shuffles.
  static __device__ __forceinline__ void encode(const Params& p, Row& r, int lane) {
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

  static __device__ __forceinline__ u8* page(const Params& p, int slot) {
    return static_cast<u8*>(p.cache) + static_cast<long long>(static_cast<unsigned>(slot) / static_cast<unsigned>(p.page_size)) * p.page_stride;
  }

  // The first scale byte of a slot's record, which also holds a claim between the claim and write
  // kernels (8-byte aligned: pages are 16-byte aligned and every data and scale row is a multiple
  // of 16 bytes).
  static __device__ __forceinline__ u8* scales(const Params& p, int slot) {
    return page(p, slot) + static_cast<long long>(p.page_size) * R::kData +
           static_cast<long long>(static_cast<unsigned>(slot) % static_cast<unsigned>(p.page_size)) * R::kScale;
  }

  static __device__ __forceinline__ void store(const Params& p, int slot, int lane, const Row& r) {
    u8* data = page(p, slot) + static_cast<long long>(static_cast<unsigned>(slot) % static_cast<unsigned>(p.page_size)) * R::kData;
    if constexpr (kBits == kDsv41Fp8Bits) {
      *reinterpret_cast<uint4*>(data + 16 * lane) = r.codes;
    } else {
      *reinterpret_cast<uint2*>(data + 8 * lane) = make_uint2(r.codes.x, r.codes.y);
    }
    // One 8-byte store per word: a claim word is never seen half replaced.
    if (lane < R::kStoreLanes) reinterpret_cast<u64*>(scales(p, slot))[lane] = r.scales;
  }

  static __device__ __forceinline__ int slot(const Params& p, int row) {
    const long long s = p.slot_i64 ? static_cast<const long long*>(p.slot_mapping)[row] : static_cast<const int*>(p.slot_mapping)[row];
    return s >= 0 && s < p.num_slots ? static_cast<int>(s) : -1;
  }
  static __device__ __forceinline__ int staged_slot(const Params& p, int row) { return slot(p, row); }
  static __device__ __forceinline__ bool target(const Params&, int slot) { return slot >= 0; }
  static __device__ __forceinline__ u64 claim(int row) { return (u64(row) + 1u) << 8; }
  static __device__ __forceinline__ bool owns(const Params& p, int slot, int row) {
    return *reinterpret_cast<const volatile u64*>(scales(p, slot)) == claim(row);
  }
};

// One thread per row: the lowest row of each target slot ends up in the slot's claim word.
template <int kBits>
__global__ void __launch_bounds__(kWriterClaimThreads) dsv41_append_claim_kernel(const __grid_constant__ Dsv41WriterParams p) {
  using W = Dsv41WriterFormat<kBits>;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterClaimThreads + threadIdx.x;
  // After the wait, so that the write kernel, starting now, reads complete inputs: it loads and
  // encodes its rows, then waits for this whole grid before it reads a claim word.
  pdl_wait();
  pdl_launch_dependents();
  const int slot = row < p.num_rows ? W::slot(p, row) : -1;
  // Rows of this warp with the same slot: only the lowest (lowest lane) claims.
  const unsigned same = __match_any_sync(0xffffffffu, slot >= 0 ? slot : -1 - lane);
  if (slot < 0 || __ffs(same) - 1 != lane) return;
  u64* owner = reinterpret_cast<u64*>(W::scales(p, slot));
  const u64 me = W::claim(row);
  u64 cur = *reinterpret_cast<volatile u64*>(owner);
  for (;;) {
    if ((cur & 0xffu) == 0u) {
      const u64 other = (cur >> 8) - 1u;  // the row a claim names (cur >> 8 == 0: none)
      if (other < u64(p.num_rows) && other <= u64(row) && W::slot(p, static_cast<int>(other)) == slot) return;
    }
    const u64 seen = atomicCAS(reinterpret_cast<unsigned long long*>(owner), cur, me);
    if (seen == cur) return;
    cur = seen;
  }
}

#endif  // __CUDACC__

}  // namespace kiln
