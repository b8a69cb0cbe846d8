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
#include "common/writer_rows.cuh"
#include "nvfp4_writer/params.cuh"

namespace kiln {

#ifdef __CUDACC__

struct Nvfp4WriterRow {
  uint4 a, b;             // this lane's 16 source values (lanes 28..31: RoPE, copied as they are)
  u32 lo = 0, hi = 0;     // lanes 0..27: the group's E2M1 codes
  u32 scale = 0;          // lanes 0..27: the group's E4M3 scale
};

// The 384-byte format for common/writer_rows.cuh. Slots reaching a page are in [0, num_slots) and
// int32 (pack: the launcher caps the rows at 2^31 - 1).
template <int kPageSize>
struct Nvfp4WriterFormat {
  using Params = Nvfp4WriterParams;
  using Row = Nvfp4WriterRow;

  static __device__ __forceinline__ void encode(const Params&, Row& r, int lane) {
    if (lane < kNvfp4Groups) r.scale = nvfp4_encode_group16(r.a, r.b, r.lo, r.hi);
  }

  static __device__ __forceinline__ u8* page(const Params& p, int slot) {
    return static_cast<u8*>(p.cache) + static_cast<long long>(static_cast<unsigned>(slot) / kPageSize) * p.page_stride;
  }

  static __device__ __forceinline__ u8* scale_record(const Params& p, int slot) {
    return page(p, slot) + kPageSize * kNvfp4DataBytes + static_cast<unsigned>(slot) % kPageSize * kNvfp4ScaleBytes;
  }

  // The slot's padding word, which holds a claim (row + 1) between the claim and write kernels.
  static __device__ __forceinline__ unsigned* owner_word(const Params& p, int slot) {
    return reinterpret_cast<unsigned*>(scale_record(p, slot) + kNvfp4Groups);
  }

  static __device__ __forceinline__ void store(const Params& p, int slot, int lane, const Row& r) {
    u8* data = page(p, slot) + static_cast<unsigned>(slot) % kPageSize * kNvfp4DataBytes;
    u8* scales = scale_record(p, slot);
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

  static __device__ __forceinline__ int staged_slot(const Params& p, int row) { return p.slot_mapping[row]; }
  static __device__ __forceinline__ bool target(const Params& p, int slot) { return slot >= 0 && slot < p.num_slots; }
  static __device__ __forceinline__ int slot(const Params& p, int row) {
    const int s = p.slot_mapping[row];
    return target(p, s) ? s : -1;
  }
  static __device__ __forceinline__ bool owns(const Params& p, int slot, int row) {
    return *reinterpret_cast<const volatile unsigned*>(owner_word(p, slot)) == static_cast<unsigned>(row) + 1u;
  }
};

// One thread per row: the lowest row of each target slot ends up in the slot's padding word.
template <int kPageSize>
__global__ void __launch_bounds__(kWriterClaimThreads) nvfp4_append_claim_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  using W = Nvfp4WriterFormat<kPageSize>;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWriterClaimThreads + threadIdx.x;
  // The owner word this row will probably claim: the slot read here (from L2, past L1) may still
  // change before the wait, so it only picks a line to warm. (Warming the write kernel's rows here
  // too delays this grid's completion, which the write kernel waits for.)
  if (row < p.num_rows && row < kWriterPrefetchRows) {
    int guess;
    asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(guess) : "l"(p.slot_mapping + row));
    if (guess >= 0 && guess < p.num_slots) asm volatile("prefetch.global.L2 [%0];" ::"l"(W::scale_record(p, guess)) : "memory");
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
  unsigned* owner = W::owner_word(p, slot);
  const unsigned me = static_cast<unsigned>(row) + 1u;
  for (unsigned cur = atomicCAS(owner, 0u, me); cur != 0u;) {
    const bool claimed = cur - 1u < static_cast<unsigned>(p.num_rows) && p.slot_mapping[cur - 1u] == slot;
    if (claimed && cur <= me) return;
    const unsigned seen = atomicCAS(owner, cur, me);
    if (seen == cur) return;
    cur = seen;
  }
}

#endif  // __CUDACC__

}  // namespace kiln
