#pragma once
// Paged MLA decode on Hopper warpgroup MMAs (sm_90a), one piece at a time (schedule.cuh).
//
// One CTA = 64 query rows (row = i * H + h) of one part; two warpgroups. Per 64-token KV tile:
//   S = Q K^T: warpgroup w computes the 64 rows x tokens [32 w, 32 w + 32): 32 m64n32k16 wgmmas with
//     Q's 512 latent columns and K both from shared memory, 4 more with Q's 64 RoPE columns from
//     registers;
//   the row max crosses the two warpgroups through shared memory (one named barrier);
//   P = exp2(S - m) is stored as bf16 hi + lo (P - hi) in shared memory (kMlaPrecisionExact: a
//     single bf16 P misses the contract's 1e-2 / 5e-4 tolerances) or as one bf16 P
//     (kMlaPrecisionBf16), a second named barrier;
//   O += P V: warpgroup w owns output columns [256 w, 256 w + 256): 8 m64n256k16 wgmmas (4 token
//     steps x hi, lo; 4 with one P) whose B operand is the same shared K tile read MN-major: V is never loaded twice.
// Loads are cp.async into 128-byte-swizzled tiles (any page size works; zero-fill past the range),
// completing on one mbarrier per stage. Two stages: warpgroup w refills exactly the columns only its
// own P V reads (w = 0: 0-255, w = 1: 256-575), so a refill needs no cross-warpgroup handshake
// beyond the per-tile barriers, and tile j + 1 streams in while tile j computes.
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
  return static_cast<u32>(row * 128 + ((chunk ^ (row & 7)) << 4));
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
    cp_async_16_addr(q_smem + (ch >> 3) * 8192 + sw128(r, ch & 7), valid ? q_rows + r * kRowBytes + ch * 16 : q_rows,
                     valid ? 16u : 0u);
  }
  cp_async_mbar_arrive(bar_q);
}

// Per-CTA pipeline counters, identical in every thread.
struct MlaWgState {
  u32 tiles;   // KV tiles consumed so far: stage = tiles % 2, its phase = (tiles / 2) % 2
  u32 pieces;  // pieces with a Q load so far: the Q barrier's phase
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
        ld_dst(static_cast<u32>(ld_tok * 128 + ((ld_chunk ^ (ld_tok & 7)) << 4))) {}

  __device__ __forceinline__ void pages_of(int j, int (&pages)[4]) const {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
      pages[q] = j < n_tiles && t < t1 ? __ldg(bt_row + t / kPageSize) : -1;  // -1: zero-filled
    }
  }

  // Tile j into the stage at shared address `stage_base`: all 9 column blocks, or with kPerWarpgroup
  // warpgroup wg's share (0: blocks 0-3 = columns 0-255; 1: blocks 4-8 = columns 256-575).
  template <bool kPerWarpgroup>
  __device__ __forceinline__ void load(int j, const int (&pages)[4], u32 stage_base, int wg) const {
    const u32 dst0 = stage_base + ld_dst;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
      // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
      const bool valid = pages[q] >= 0;
      const unsigned char* src =
          valid ? kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kMlaDimQk * 2 + ld_chunk * 16 : kv;
      const u32 bytes = valid ? 16u : 0u;
      if (!kPerWarpgroup || wg == 0) {
#pragma unroll
        for (int blk = 0; blk < (kPerWarpgroup ? 4 : 9); ++blk) {
          cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
        }
      } else {
#pragma unroll
        for (int blk = 4; blk < 9; ++blk) cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
      }
    }
  }
};

// ---- Steps of the bf16 kernel (the P store also the fp8 kernel's; thread layout as below) ----

// S = Q K^T for this warpgroup's 32 tokens of the tile: Q's 512 latent columns and K both from
// shared memory (8 column blocks x 4 k-steps), then Q's 64 RoPE columns from registers. Issued and
// committed, not waited for.
__device__ __forceinline__ void mla_wg_scores(float (&s)[16], u64 dq, u64 dk, const u32 (&q_rope)[4][4]) {
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      WgmmaBf16<32>::ss<0>(s, wgmma_desc_advance(dq, kb * 8192 + ks * 32), wgmma_desc_advance(dk, kb * 8192 + ks * 32),
                           kb + ks > 0);
    }
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) WgmmaBf16<32>::rs<0>(s, q_rope[ks], wgmma_desc_advance(dk, 8 * 8192 + ks * 32), true);
  wgmma_commit();
}

// P = exp2(S - m) into the shared P tiles as bf16 hi (and, with kSplitP, lo = P - hi), or with kF16
// (the fp8 kernel) as one f16 P: row r, tokens 32 wg + 8 n + 2 c4 (+1) go to chunk 4 wg + n of the
// row's 128 bytes. Returns the rows' sums of the unrounded P.
template <bool kF16, bool kSplitP>
__device__ __forceinline__ void mla_wg_store_p(const float (&s)[16], float muse_lo, float muse_hi, u32 p_hi, u32 p_lo,
                                               u32 p_row_lo, u32 p_row_hi, int wg, int g, float& sum_lo, float& sum_hi) {
  static_assert(!(kF16 && kSplitP), "an f16 P is kept whole");
  sum_lo = 0.f;
  sum_hi = 0.f;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const float p0 = fast_exp2(s[4 * n + 0] - muse_lo);
    const float p1 = fast_exp2(s[4 * n + 1] - muse_lo);
    const float p2 = fast_exp2(s[4 * n + 2] - muse_hi);
    const float p3 = fast_exp2(s[4 * n + 3] - muse_hi);
    sum_lo += p0 + p1;
    sum_hi += p2 + p3;
    const u32 h01 = kF16 ? pack_f16x2(p0, p1) : pack_bf16x2(p0, p1);
    const u32 h23 = kF16 ? pack_f16x2(p2, p3) : pack_bf16x2(p2, p3);
    const u32 chunk = static_cast<u32>(4 * wg + n);
    const u32 off_lo = p_row_lo + ((chunk ^ static_cast<u32>(g)) << 4);
    const u32 off_hi = p_row_hi + ((chunk ^ static_cast<u32>(g)) << 4);
    sts32(p_hi + off_lo, h01);
    sts32(p_hi + off_hi, h23);
    if constexpr (kSplitP) {
      sts32(p_lo + off_lo, pack_bf16x2(p0 - bf16x2_lo(h01), p1 - bf16x2_hi(h01)));
      sts32(p_lo + off_hi, pack_bf16x2(p2 - bf16x2_lo(h23), p3 - bf16x2_hi(h23)));
    }
  }
}

// O += P V over this warpgroup's 256 output columns: 4 token steps of m64n256k16 (twice with kSplitP:
// hi, then lo), B = the tile's K read MN-major as V. Waited for.
template <bool kSplitP>
__device__ __forceinline__ void mla_wg_pv(float (&o)[128], u64 dv, u64 dp_hi, u64 dp_lo) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const u64 dvk = wgmma_desc_advance(dv, ks * 2048);
    WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dp_hi, ks * 32), dvk, true);
    if constexpr (kSplitP) WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dp_lo, ks * 32), dvk, true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(o);
}

// ---- Steps shared with the fp8 kernel (kernel_wgmma_fp8.cuh): the two consumer warpgroups, thread
// (warpgroup wg, lane with g = lane / 4, c4 = lane % 4) holding rows r_lo and r_hi = r_lo + 8. ----

// Masks and scales this warpgroup's S (register i: token tok_base + 8 (i / 4) + i % 2, row r_hi when
// (i / 2) % 2 else r_lo), takes each row's max over both warpgroups' tokens (through `red` and
// kMlaBarRowExchange) and moves the running max m. muse: the max to subtract (0 while a row has seen nothing, so exp2
// gives 0, not NaN); alpha: the factor for O and l.
template <bool kCausal>
__device__ __forceinline__ void mla_wg_row_max(float (&s)[16], int tok_base, int t1, int lim_lo, int lim_hi, float scale,
                                               u32 red, int wg, int r_lo, int r_hi, int c4, float& m_lo, float& m_hi,
                                               float& muse_lo, float& muse_hi, float& alpha_lo, float& alpha_hi) {
  float mx_lo = neg_inf(), mx_hi = neg_inf();
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int t = tok_base + 8 * (i >> 2) + (i & 1);
    const bool hi = (i >> 1) & 1;
    bool ok = t < t1;
    if constexpr (kCausal) ok = ok && t <= (hi ? lim_hi : lim_lo);
    const float x = ok ? s[i] * scale : neg_inf();
    s[i] = x;
    if (hi) mx_hi = fmaxf(mx_hi, x);
    else mx_lo = fmaxf(mx_lo, x);
  }
  mx_lo = quad_max(mx_lo);
  mx_hi = quad_max(mx_hi);
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
template <int kHeads, int kMaxSeqLenQ>
__device__ __forceinline__ void mla_wg_epilogue(const MlaDecodeParams& p, const float (&o)[128], float m_lo, float m_hi,
                                                float l_lo, float l_hi, u32 red, int wg, int c4, int r_lo, int r_hi,
                                                int row0, int rows_b, int tok0, int slot) {
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
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
    if (row >= rows_b) continue;
    const float lt = half ? lt_hi : lt_lo;
    const float m = half ? m_hi : m_lo;
    if (slot < 0) {
      const float inv = lt > 0.f ? p.out_scale / lt : 0.f;  // nothing visible -> zeros
      u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * kHeads + row) * kMlaDimV + col0;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<u32*>(out + 8 * n) = pack_bf16x2(o[4 * n + 2 * half] * inv, o[4 * n + 2 * half + 1] * inv);
      }
    } else {
      const long long idx = static_cast<long long>(slot) * kMaxRows + row;
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

// Rows [row0, row0 + 64) of `piece`; slot < 0: write `out`, else the partial O and LSE at `slot`.
// `base`: the 1024-byte-aligned shared-memory base.
template <int kHeads, int kPageSize, int kMaxSeqLenQ, bool kCausal, bool kSplitP>
__device__ __forceinline__ void mla_wgmma_piece(const MlaDecodeParams& p, u32 base, const MlaPiece& piece, int row0,
                                                int slot, MlaWgState& st) {
  constexpr int kRowBytes = kMlaDimQk * 2;
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // warpgroup: output columns [256 wg, 256 wg + 256), S tokens [32 wg, 32 wg + 32)
  const int wt = tid & 127;
  const int warp = wt >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c4 = lane & 3;
  const int r_lo = 16 * warp + g;  // tile rows of this thread: r_lo and r_lo + 8
  const int r_hi = r_lo + 8;

  const MlaPieceRows pv = mla_piece_rows<kHeads, kCausal, kMlaWgRows, kMlaWgTileTokens>(piece, row0);

  const u32 q_smem = base + kMlaWgQOffset;
  const u32 stage_smem = base + kMlaWgStageOffset;
  const u32 p_hi = base + kMlaWgPOffset;
  const u32 p_lo = p_hi + kMlaWgPBytes;
  const u32 red = base + kMlaWgRedOffset;  // [warpgroup][64 rows] fp32
  const u32 bar_q = base + kMlaWgBarOffset;
  const u32 bar_full = bar_q + 8;  // + 8 * stage

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  // Every thread of both warpgroups is done with the previous piece's Q, stages, P and row sums.
  named_barrier_sync(kMlaBarPiece, kMlaWgThreads);
  if (pv.n_tiles > 0) {
    const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(pv.b) * p.block_table_stride;
    const unsigned char* q_rows =
        static_cast<const unsigned char*>(p.q) + (static_cast<long long>(pv.tok0) * kHeads + row0) * kRowBytes;

    const MlaTileLoader<kPageSize> loader(p.kv, bt_row, pv.t0, pv.t1, pv.n_tiles, warp, lane);
    auto load_tile = [&](int j, const int (&pages)[4], u32 stage) {
      loader.template load<true>(j, pages, stage_smem + stage * kMlaWgStageBytes, wg);
      cp_async_mbar_arrive(bar_full + 8 * stage);
    };

    mla_wg_load_q(q_smem, q_rows, row0, pv.rows_b, wg, wt, bar_q);
    int pages[4];
    loader.pages_of(0, pages);
    load_tile(0, pages, st.tiles & 1);
    loader.pages_of(1, pages);

    // Q's RoPE columns as register A fragments (k-steps 0..3 of the last 64 columns).
    u32 q_rope[4][4];
    {
      const bool v_lo = row0 + r_lo < pv.rows_b, v_hi = row0 + r_hi < pv.rows_b;
      const unsigned char* q_lo = q_rows + r_lo * kRowBytes + (kMlaDimV + 2 * c4) * 2;
      const unsigned char* q_hi = q_rows + r_hi * kRowBytes + (kMlaDimV + 2 * c4) * 2;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        q_rope[ks][0] = ld_u32_if(q_lo + ks * 32, v_lo);
        q_rope[ks][1] = ld_u32_if(q_hi + ks * 32, v_hi);
        q_rope[ks][2] = ld_u32_if(q_lo + ks * 32 + 16, v_lo);
        q_rope[ks][3] = ld_u32_if(q_hi + ks * 32 + 16, v_hi);
      }
    }

    const int lim_lo = mla_causal_limit<kHeads, kCausal>(pv, row0 + r_lo);
    const int lim_hi = mla_causal_limit<kHeads, kCausal>(pv, row0 + r_hi);
    const float scale = p.scale_log2;
    // P stores: row r, tokens 32 wg + 8 n + 2 c4 (+1): chunk 4 wg + n of the 64-token row.
    const u32 p_row_lo = r_lo * 128 + 4 * c4;
    const u32 p_row_hi = r_hi * 128 + 4 * c4;

    const u64 dq = wgmma_desc_sw128(q_smem, 16, 1024);
    const u64 dp_hi = wgmma_desc_sw128(p_hi, 16, 1024);
    const u64 dp_lo = wgmma_desc_sw128(p_lo, 16, 1024);

    mbar_wait(bar_q, st.pieces & 1);
    ++st.pieces;

    for (int j = 0; j < pv.n_tiles; ++j) {
      const u32 stage = st.tiles & 1;
      mbar_wait(bar_full + 8 * stage, (st.tiles >> 1) & 1);
      ++st.tiles;
      // cp.async wrote the tile through the generic proxy; wgmma reads it through the async proxy.
      fence_proxy_async_smem();
      const u32 k_smem = stage_smem + stage * kMlaWgStageBytes;
      // Descriptors of this tile's operands; every step below adds a constant byte offset.
      const u64 dk = wgmma_desc_sw128(k_smem + wg * 4096, 16, 1024);
      const u64 dv = wgmma_desc_sw128(k_smem + wg * 4 * 8192, 8192, 1024);

      float s[16];
      mla_wg_scores(s, dq, dk, q_rope);
      // Tile j + 1 streams into the other stage while S runs: this warpgroup's P V of tile j - 1
      // (the only reader of the columns it refills, besides both S of tile j - 1) is complete.
      if (j + 1 < pv.n_tiles) {
        load_tile(j + 1, pages, stage ^ 1u);
        loader.pages_of(j + 2, pages);
      }
      wgmma_wait<0>();
      wgmma_fence_operand(s);

      // ---- mask, scale, row max across the two warpgroups ----
      float muse_lo, muse_hi, alpha_lo, alpha_hi;
      mla_wg_row_max<kCausal>(s, pv.t0 + j * kMlaWgTileTokens + 32 * wg + 2 * c4, pv.t1, lim_lo, lim_hi, scale, red, wg, r_lo,
                              r_hi, c4, m_lo, m_hi, muse_lo, muse_hi, alpha_lo, alpha_hi);

      float sum_lo, sum_hi;
      mla_wg_store_p<false, kSplitP>(s, muse_lo, muse_hi, p_hi, p_lo, p_row_lo, p_row_hi, wg, g, sum_lo, sum_hi);
      mla_wg_rescale(o, l_lo, l_hi, alpha_lo, alpha_hi, sum_lo, sum_hi);
      // P was written through the generic proxy; both warpgroups' wgmmas read it.
      fence_proxy_async_smem();
      named_barrier_sync(kMlaBarP, kMlaWgThreads);

      mla_wg_pv<kSplitP>(o, dv, dp_hi, dp_lo);
    }
  }

  mla_wg_epilogue<kHeads, kMaxSeqLenQ>(p, o, m_lo, m_hi, l_lo, l_hi, red, wg, c4, r_lo, r_hi, row0, pv.rows_b, pv.tok0, slot);
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
