#pragma once
// Pieces of the paged MLA decode kernels on Hopper warpgroup MMAs (sm_90a): the heads-on-M seesaw
// (kernel_seesaw.cuh) and fp8 (kernel_wgmma_fp8.cuh) kernels and the KV-on-M kernel (kernel_kv.cuh).
// A CTA holds 64 query rows (row = i * H + h) or 64 KV tokens; tiles are 64 tokens x 576 columns in
// 128-byte-swizzled 64-column blocks (8 KB each), so the same shared K tile serves S = Q K^T and,
// read MN-major, P V (V is never loaded twice).
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled column block.
__device__ __forceinline__ u32 sw128(int row, int chunk) {
  return static_cast<u32>(row * kMlaWgLineBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ u32 ld_u32_if(const void* p, bool pred) {
  u32 v = 0;
  if (pred) v = __ldg(static_cast<const u32*>(p));
  return v;
}

// Q's 512 latent columns of the CTA's 64 rows (row0 + r, r < 64, of the request's rows_b; the rest
// zero-filled) into the swizzled Q tile: warpgroup wg copies columns [256 wg, 256 wg + 256), and
// every thread's completions arrive on bar_q.
__device__ __forceinline__ void mla_wg_load_q(u32 q_smem, const unsigned char* q_rows, int row0, int rows_b, int wg, int wt,
                                              u32 bar_q) {
  constexpr int kRowBytes = kMlaDimQk * 2;
#pragma unroll 4
  for (int i = 0; i < kMlaWgRows * 32 / 128; ++i) {
    const int idx = i * 128 + wt;
    const int r = idx >> 5;
    const int ch = 32 * wg + (idx & 31);
    const bool valid = row0 + r < rows_b;
    cp_async_16_addr(q_smem + (ch >> 3) * kMlaWgBlockBytes + sw128(r, ch & 7), valid ? q_rows + r * kRowBytes + ch * 16 : q_rows,
                     valid ? 16u : 0u);
  }
  cp_async_mbar_arrive(bar_q);
}

// Per-CTA pipeline counters, identical in every thread.
struct MlaWgState {
  u32 tiles;   // KV tiles consumed so far: stage = tiles % 2, its phase = (tiles / 2) % 2
  u32 pieces;  // pieces with a Q load so far: the Q barrier's phase
  u32 zeroings = 0;  // the seesaw kernel's zeroings of stale rows by this thread's warpgroup so far
};

// The cp.async mapping the bf16 wgmma kernels fill a 64-token KV stage with: each warp instruction
// copies 4 token rows x 8 chunks (one 128-byte swizzled row of one 64-column block each):
// conflict-free shared stores and 128-byte global segments. Thread (warp w of its warpgroup, lane l)
// owns tokens 16 q + 4 w + l / 8 (q = 0..3) and chunk l % 8 of the column blocks it is given.
// Block-table entries are read a tile ahead (pages_of), off the issue path.
template <int kPageSize>
struct MlaTileLoader {
  const unsigned char* kv;
  const int* bt_row;  // the request's block-table row
  int t0, t1;         // the piece's tokens [t0, t1)
  int n_tiles;
  int ld_tok;         // + 16 q
  int ld_chunk;
  u32 ld_dst;

  __device__ __forceinline__ MlaTileLoader(const void* kv_base, const int* bt, int first, int end, int tiles, int warp,
                                           int lane)
      : kv(static_cast<const unsigned char*>(kv_base)), bt_row(bt), t0(first), t1(end), n_tiles(tiles),
        ld_tok(4 * warp + (lane >> 3)), ld_chunk(lane & 7),
        ld_dst(sw128(ld_tok, ld_chunk)) {}

  __device__ __forceinline__ void pages_of(int j, int (&pages)[4]) const {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
      pages[q] = j < n_tiles && t < t1 ? __ldg(bt_row + t / kPageSize) : -1;  // -1: zero-filled
    }
  }

  // Tile j, all 9 column blocks, into the stage at shared address `stage_base`.
  __device__ __forceinline__ void load(int j, const int (&pages)[4], u32 stage_base) const {
    const u32 dst0 = stage_base + ld_dst;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
      // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
      const bool valid = pages[q] >= 0;
      const unsigned char* src =
          valid ? kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kMlaDimQk * 2 + ld_chunk * 16 : kv;
      const u32 bytes = valid ? 16u : 0u;
#pragma unroll
      for (int blk = 0; blk < 9; ++blk) {
        cp_async_16_addr(dst0 + blk * kMlaWgBlockBytes + q * kMlaWgMnStepBytes, src + blk * kMlaWgLineBytes, bytes);
      }
    }
  }
};

// ---- Steps of the heads-on-M kernels' two consumer warpgroups, thread (warpgroup wg, lane with
// g = lane / 4, c4 = lane % 4) holding rows r_lo and r_hi = r_lo + 8. ----

// Masks and scales kN of a warpgroup's S registers (register i: token tok_base + 8 (i / 4) + i % 2,
// row r_hi when (i / 2) % 2 else r_lo) and returns each row's max over this thread's quad.
template <int kN>
__device__ __forceinline__ void mla_wg_mask_max(float (&s)[kN], int tok_base, int last_lo, int last_hi, float scale,
                                                float& mx_lo, float& mx_hi) {
  mx_lo = neg_inf();
  mx_hi = neg_inf();
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int t = tok_base + 8 * (i >> 2) + (i & 1);
    const bool hi = (i >> 1) & 1;
    const float x = t <= (hi ? last_hi : last_lo) ? s[i] * scale : neg_inf();
    s[i] = x;
    if (hi) mx_hi = fmaxf(mx_hi, x);
    else mx_lo = fmaxf(mx_lo, x);
  }
  mx_lo = quad_max(mx_lo);
  mx_hi = quad_max(mx_hi);
}

// The fp8 kernel's row max: masks and scales this warpgroup's S (mla_wg_mask_max), takes each row's
// max over both warpgroups' tokens (through `red` and kMlaBarRowExchange) and moves the running max m.
// muse: the max to subtract (0 while a row has seen nothing, so exp2 gives 0, not NaN); alpha: the
// factor for O and l.
__device__ __forceinline__ void mla_wg_row_max(float (&s)[16], int tok_base, int last_lo, int last_hi, float scale,
                                               u32 red, int wg, int r_lo, int r_hi, int c4, float& m_lo, float& m_hi,
                                               float& muse_lo, float& muse_hi, float& alpha_lo, float& alpha_hi) {
  float mx_lo, mx_hi;
  mla_wg_mask_max(s, tok_base, last_lo, last_hi, scale, mx_lo, mx_hi);
  if (c4 == 0) {
    sts_f32(red + (wg * 64 + r_lo) * 4, mx_lo);
    sts_f32(red + (wg * 64 + r_hi) * 4, mx_hi);
  }
  named_barrier_sync(kMlaBarRowExchange, kMlaWgThreads);
  mx_lo = fmaxf(mx_lo, lds_f32(red + ((wg ^ 1) * 64 + r_lo) * 4));
  mx_hi = fmaxf(mx_hi, lds_f32(red + ((wg ^ 1) * 64 + r_hi) * 4));
  const OnlineSoftmaxStep step_lo = online_softmax_step(m_lo, mx_lo);
  const OnlineSoftmaxStep step_hi = online_softmax_step(m_hi, mx_hi);
  muse_lo = step_lo.m_use;
  muse_hi = step_hi.m_use;
  alpha_lo = step_lo.alpha;
  alpha_hi = step_hi.alpha;
}

// l = l alpha + this tile's sums; O *= alpha. Once a row's max settles its alpha is exactly 1: the
// 128 multiplies are skipped when the whole warp's are.
__device__ __forceinline__ void mla_wg_rescale(float (&o)[128], float& l_lo, float& l_hi, float alpha_lo, float alpha_hi,
                                               float sum_lo, float sum_hi) {
  l_lo = l_lo * alpha_lo + sum_lo;
  l_hi = l_hi * alpha_hi + sum_hi;
  if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f)) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= ((i >> 1) & 1) ? alpha_hi : alpha_lo;
  }
}

// Row sums across the warpgroups, normalise, store: slot < 0 writes `out`, else the partial O and
// LSE at `slot`. Every `red` read of the last tile happened before the P barrier (kMlaBarP), which
// both warpgroups have passed; both read `red` here before the next piece's first write (kMlaBarPiece
// at its start).
__device__ __forceinline__ void mla_wg_epilogue(const MlaDecodeParams& p, const float (&o)[128], float m_lo, float m_hi,
                                                float l_lo, float l_hi, u32 red, int wg, int c4, int r_lo, int r_hi,
                                                int row0, int rows_b, int tok0, int slot) {
  const int max_rows = mla_max_rows(p.heads, p.max_seq_len_q);
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  if (c4 == 0) {
    sts_f32(red + (wg * 64 + r_lo) * 4, l_lo);
    sts_f32(red + (wg * 64 + r_hi) * 4, l_hi);
  }
  named_barrier_sync(kMlaBarRowExchange, kMlaWgThreads);
  const float lt_lo = lds_f32(red + r_lo * 4) + lds_f32(red + (64 + r_lo) * 4);
  const float lt_hi = lds_f32(red + r_hi * 4) + lds_f32(red + (64 + r_hi) * 4);

  const int col0 = 256 * wg + 2 * c4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + (half ? r_hi : r_lo);
    const bool live = row < rows_b;
    const float lt = half ? lt_hi : lt_lo;
    const float m = half ? m_hi : m_lo;
    if (slot < 0) {
      const float inv = lt > 0.f ? p.out_scale / lt : 0.f;  // nothing visible -> zeros
      u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * p.heads + (live ? row : 0)) * kMlaDimV + 256 * wg;
#pragma unroll
      for (int n = 0; n < 32; n += 2) {
        st_acc_row_pairs(out, o, n, half, c4, inv, live);
      }
    } else {
      if (!live) continue;
      const long long idx = static_cast<long long>(slot) * max_rows + row;
      if (lt > 0.f) {
        const float inv = 1.f / lt;
        float* op = static_cast<float*>(p.o_partial) + idx * kMlaDimV + col0;
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          *reinterpret_cast<float2*>(op + 8 * n) = make_float2(o[4 * n + 2 * half] * inv, o[4 * n + 2 * half + 1] * inv);
        }
      }
      if (wg == 0 && c4 == 0) static_cast<float*>(p.lse_partial)[idx] = lt > 0.f ? m + fast_log2(lt) : neg_inf();
    }
  }
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
