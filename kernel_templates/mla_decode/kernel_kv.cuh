#pragma once
// Paged MLA decode on Hopper warpgroup MMAs with the KV tokens on the M side (sm_90a), for small
// row counts (the planner gives it H x SQ <= 32), where a 64-row query tile would be mostly padding;
// larger row counts fold into several row tiles. One piece at a time (schedule.cuh).
//
// One CTA = N = 16 or 32 query rows (row = i * H + h) of one part; one warpgroup, or two at N = 32
// with P as hi + lo (mla_kv_warpgroups). Per 64-token tile:
//   S^T = K Q^T (warpgroup 0): 36 m64nNk16 wgmmas, K (tokens x 576) and Q (N rows x 576) both K-major
//     from shared memory; thread (warp w, lane l) holds tokens 16 w + l / 4 (+ 8) of columns
//     8 n + 2 (l % 4) (+ 1);
//   softmax over the tokens = over the M side (warpgroup 0): the column max over the lanes of a warp
//     (shuffles), then over the four warps through shared memory (one barrier); every thread then
//     holds the same max and keeps per-column partial sums over its own tokens, reduced once at the
//     end; with two warpgroups the O factors go to warpgroup 1 through shared memory;
//   P^T is stored as bf16 hi + lo (P - hi), N rows x 64 tokens, K-major (kMlaPrecisionExact: a single
//     bf16 P misses the contract's 1e-2 / 5e-4 tolerances); kMlaPrecisionBf16 keeps hi alone (N = 16:
//     lo is stored as zeros, so the step below keeps its shape);
//   O^T += V^T P^T: for each 64-column block of V, 4 token steps of one wgmma with A = V^T read from
//     the same K tile through the transpose bit (64 dims along M are contiguous in each 128-byte token
//     row) and B = P^T; V is never loaded twice. With hi + lo, B is the 2N rows [P_hi^T; P_lo^T] (the
//     lo tile follows the hi tile), so O accumulates the two halves in separate columns (query row c in
//     columns c and c + N) and A, the larger operand, is read once per step; the halves are added at
//     the end. 2N rows of O^T per block are 8 x 32 registers at N = 32, so there two warpgroups take
//     four blocks each; one P at N = 32 is m64n32k16 over all eight blocks in one warpgroup.
// Loads: cp.async into 128-byte-swizzled tiles (any page size; zero-fill past the range), completing
// on one mbarrier per stage. Two stages; tile j + 2 is issued into tile j's stage as soon as tile j's
// P V has retired, so two tiles stay in flight while tile j + 1 is waited on. Warpgroup 0 issues a
// piece's first two tiles; with two warpgroups warpgroup 1 issues the refills, which keeps them off
// warpgroup 0's S -> softmax -> P V chain.
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"
#include "mla_decode/wgmma_common.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

__device__ __forceinline__ void sts16(u32 addr, u16 v) { asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v)); }

__device__ __forceinline__ float2 lds_f32x2(u32 addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// Sum / max over the 8 lanes of a warp that share l % 4 (the lanes holding one accumulator column).
__device__ __forceinline__ float column_max8(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}
__device__ __forceinline__ float column_sum8(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

// S^T = K Q^T for one 64-token tile: K (tokens x 576) and Q (N rows x 576) both K-major in shared
// memory, 9 column blocks x 4 k-steps. Waited for.
template <int kN>
__device__ __forceinline__ void mla_kv_scores(float (&s)[kN / 2], u64 dk, u64 dq) {
  constexpr u32 kQBlock = kN * kMlaWgLineBytes;  // bytes of one 64-column block of Q
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < 9; ++kb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      WgmmaBf16<kN>::template ss<0>(s, wgmma_desc_advance(dk, kb * kMlaWgBlockBytes + ks * kMlaWgKStepBytes),
                                    wgmma_desc_advance(dq, kb * kQBlock + ks * kMlaWgKStepBytes), kb + ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(s);
}

// O^T += V^T P^T over V's column blocks [mb0, mb0 + kMb): 4 token steps each of an m64 wgmma with
// A = V^T (the tile's K through the transpose bit) and B = P^T: with kStacked the 2 kN rows
// [hi; lo] (one MMA per step, V read once), else hi alone. Waited for.
template <int kN, bool kStacked, int kMb>
__device__ __forceinline__ void mla_kv_pv(float (&o)[kMb][kStacked ? kN : kN / 2], int mb0, u64 dv, u64 dp) {
  constexpr int kON = kStacked ? 2 * kN : kN;
  wgmma_fence();
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      WgmmaBf16<kON>::template ss<0, 1>(o[mb], wgmma_desc_advance(dv, (mb0 + mb) * kMlaWgBlockBytes + ks * kMlaWgMnStepBytes),
                                        wgmma_desc_advance(dp, ks * kMlaWgKStepBytes), true);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb) wgmma_fence_operand(o[mb]);
}

// Rows [row0, row0 + kN) of `piece`; slot < 0: write `out`, else the partial O and LSE at `slot`.
// `base`: the 1024-byte-aligned shared-memory base. Warpgroup 0 loads, computes S and the softmax;
// with two warpgroups (kN = 32) each adds P V over half of V's column blocks.
template <int kPageSize, int kN, int kWgs, bool kSplitP>
__device__ __forceinline__ void mla_kv_piece(const MlaDecodeParams& p, u32 base, const MlaPiece& piece, int row0,
                                             int slot, MlaWgState& st) {
  static_assert(kN == 16 || kN == 32, "the KV-on-M kernel takes 16 or 32 query rows");
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  constexpr MlaKvSmem kL = mla_kv_smem(kN);
  const int max_rows = mla_max_rows(p.heads, p.max_seq_len_q);
  constexpr int kRowBytes = kMlaDimQk * 2;
  constexpr int kRegs = kN / 2;  // accumulator registers of S^T (m64nNk16)
  constexpr int kCols = kN / 4;  // distinct columns per thread: k = 2 n + e -> column 8 n + 2 c4 + e
  constexpr u32 kQBlock = kN * kMlaWgLineBytes;  // bytes of one 64-column block of Q
  constexpr int kAll = kWgs * kMlaKvThreads;
  // P^T as one B operand [hi; lo] (at N = 16 also without kSplitP, lo = 0, which keeps the shape).
  constexpr bool kStacked = kN == 16 || kSplitP;
  constexpr int kORegs = kStacked ? kN : kN / 2;  // O^T registers per column block
  constexpr int kMb = 8 / kWgs;                    // V column blocks per warpgroup
  static_assert(kWgs == 1 || kWgs == 2, "one or two warpgroups");
  static_assert(kORegs * kMb <= 128, "O^T must fit in 128 registers per thread");

  const int tid = threadIdx.x;
  const int wg = kWgs == 1 ? 0 : tid >> 7;  // constants where there is one warpgroup
  const int wt = kWgs == 1 ? tid : tid & 127;
  const int warp = wt >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c4 = lane & 3;
  const int tok_lo = 16 * warp + g;  // tile tokens of this thread: tok_lo and tok_lo + 8
  const int mb0 = wg * kMb;

  const MlaPieceRows pv = mla_piece_rows<kN, kMlaKvTileTokens>(p, piece, row0);

  const u32 q_smem = base + kL.q_offset;
  const u32 stage_smem = base + kL.stage_offset;
  const u32 p_hi = base + kL.p_offset;
  const u32 p_lo = p_hi + kL.p_bytes;
  const u32 red = base + kL.red_offset;      // [warp][column] fp32
  const u32 alphas = base + kL.alpha_offset;  // [column] fp32: the tile's O factors, for warpgroup 1
  const u32 bar_q = base + kL.bar_offset;
  const u32 bar_full = bar_q + 8;  // + 8 * stage

  // O^T: block mb holds output columns 64 (mb0 + mb) + tok_lo (+ 8) (its M rows) of the thread's
  // query rows. Accumulator register i of O^T holds query row 8 ((i / 4) % (kN / 8)) + 2 c4 + i % 2,
  // i.e. this thread's column k = o_col(i); stacked, registers i and i + kN / 2 hold the hi and lo
  // halves.
  float o[kMb][kORegs];
  auto o_col = [](int i) { return 2 * ((i >> 2) % (kN / 8)) + (i & 1); };
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb)
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[mb][i] = 0.f;
  float m[kCols], l[kCols];
#pragma unroll
  for (int k = 0; k < kCols; ++k) {
    m[k] = neg_inf();
    l[k] = 0.f;
  }
  auto rescale = [&](const float (&alpha)[kCols]) {
    // Once a column's max settles its alpha is exactly 1: skip the multiplies when the whole warp's are.
    bool any = false;
#pragma unroll
    for (int k = 0; k < kCols; ++k) any |= alpha[k] != 1.f;
    if (__any_sync(0xffffffffu, any)) {
#pragma unroll
      for (int mb = 0; mb < kMb; ++mb)
#pragma unroll
        for (int i = 0; i < kORegs; ++i) o[mb][i] *= alpha[o_col(i)];
    }
  };

  // Every thread is done with the previous piece's Q, stages, P and exchange slots.
  named_barrier_sync(kMlaKvBar, kAll);
  if (pv.n_tiles > 0) {
    const u64 dp = wgmma_desc_sw128(p_hi, 16, kMlaWgSbo);
    const u32 tile0 = st.tiles;
    const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(pv.b) * p.block_table_stride;
    // Either warpgroup's 128 threads fill a stage: warpgroup 0 the first two tiles, and with two
    // warpgroups warpgroup 1 the refills, off warpgroup 0's S -> softmax -> P V chain.
    const MlaTileLoader<kPageSize> loader(p.kv, bt_row, pv.t0, pv.t1, pv.n_tiles, warp, lane);
    auto load_tile = [&](int j, const int (&pages)[4], u32 stage) {
      loader.load(j, pages, stage_smem + stage * kMlaWgStageBytes);
      cp_async_mbar_arrive(bar_full + 8 * stage);
    };
    if (wg == 0) {
      const unsigned char* q_rows =
          static_cast<const unsigned char*>(p.q) + (static_cast<long long>(pv.tok0) * p.heads + row0) * kRowBytes;

      // Q: kN rows x 576 columns (72 chunks a row), rows past the request zero-filled.
      for (int idx = wt; idx < kN * 72; idx += kMlaKvThreads) {
        const int r = idx / 72;
        const int ch = idx - 72 * r;
        const bool valid = row0 + r < pv.rows_b;
        cp_async_16_addr(q_smem + (ch >> 3) * kQBlock + sw128(r, ch & 7), valid ? q_rows + r * kRowBytes + ch * 16 : q_rows,
                         valid ? 16u : 0u);
      }
      cp_async_mbar_arrive(bar_q);
      int pages[4];
      loader.pages_of(0, pages);
      load_tile(0, pages, tile0 & 1u);
      if (pv.n_tiles > 1) {
        loader.pages_of(1, pages);
        load_tile(1, pages, (tile0 + 1u) & 1u);
      }

      int last[kCols];  // last visible token of each of this thread's columns
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        last[k] = mla_row_last(p, pv, row0 + 8 * (k >> 1) + 2 * c4 + (k & 1));
      }
      const float scale = p.scale_log2;
      // P^T stores: column c (row of P^T), tokens tok_lo / tok_lo + 8 = chunks 2 w / 2 w + 1, element g.
      const u32 p_tok_lo = static_cast<u32>(2 * g);
      const u64 dq = wgmma_desc_sw128(q_smem, 16, kMlaWgSbo);

      mbar_wait(bar_q, st.pieces & 1);
      ++st.pieces;

      for (int j = 0; j < pv.n_tiles; ++j) {
        if constexpr (kWgs == 1) loader.pages_of(j + 2, pages);
        const u32 stage = (tile0 + static_cast<u32>(j)) & 1u;
        mbar_wait(bar_full + 8 * stage, ((tile0 + static_cast<u32>(j)) >> 1) & 1u);
        // cp.async wrote the tile through the generic proxy; wgmma reads it through the async proxy.
        fence_proxy_async_smem();
        const u32 k_smem = stage_smem + stage * kMlaWgStageBytes;
        const u64 dk = wgmma_desc_sw128(k_smem, 16, kMlaWgSbo);
        const u64 dv = wgmma_desc_sw128(k_smem, kMlaWgBlockBytes, kMlaWgSbo);

        float s[kRegs];
        mla_kv_scores<kN>(s, dk, dq);

        // ---- mask, scale, column max over the 64 tokens ----
        const int t_lo = pv.t0 + j * kMlaKvTileTokens + tok_lo;
        float mx[kCols];
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          const int k = 2 * (i >> 2) + (i & 1);
          const int t = t_lo + 8 * ((i >> 1) & 1);
          s[i] = t <= last[k] ? s[i] * scale : neg_inf();
          mx[k] = (i >> 1) & 1 ? fmaxf(mx[k], s[i]) : s[i];
        }
#pragma unroll
        for (int k = 0; k < kCols; ++k) mx[k] = column_max8(mx[k]);
        if (g == 0) {
#pragma unroll
          for (int n = 0; n < kCols / 2; ++n) {
            const u32 a = red + (warp * kN + 8 * n + 2 * c4) * 4;
            sts_f32(a, mx[2 * n]);
            sts_f32(a + 4, mx[2 * n + 1]);
          }
        }
        named_barrier_sync(kMlaKvBar, kAll);  // warpgroup 1 arrives too: every barrier spans the CTA
        float alpha[kCols], muse[kCols];
#pragma unroll
        for (int n = 0; n < kCols / 2; ++n) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const float2 v = lds_f32x2(red + (w * kN + 8 * n + 2 * c4) * 4);
            mx[2 * n] = fmaxf(mx[2 * n], v.x);
            mx[2 * n + 1] = fmaxf(mx[2 * n + 1], v.y);
          }
        }
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
          const OnlineSoftmaxStep step = online_softmax_step(m[k], mx[k]);
          muse[k] = step.m_use;
          alpha[k] = step.alpha;
          l[k] *= alpha[k];
        }
        if (kWgs == 2 && warp == 0 && g == 0) {
#pragma unroll
          for (int n = 0; n < kCols / 2; ++n) {
            sts_f32(alphas + (8 * n + 2 * c4) * 4, alpha[2 * n]);
            sts_f32(alphas + (8 * n + 2 * c4 + 1) * 4, alpha[2 * n + 1]);
          }
        }

        // ---- P^T = exp2(S^T - m) as bf16 hi (+ lo) ----
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          const int k = 2 * (i >> 2) + (i & 1);
          const int col = 8 * (i >> 2) + 2 * c4 + (i & 1);
          const float pv = fast_exp2(s[i] - muse[k]);
          l[k] += pv;
          const u16 h = float_to_bf16(pv);
          const u32 off = sw128(col, 2 * warp + ((i >> 1) & 1)) + p_tok_lo;
          sts16(p_hi + off, h);
          if constexpr (kSplitP) {
            sts16(p_lo + off, float_to_bf16(pv - bf16_to_float(h)));
          } else if constexpr (kStacked) {
            sts16(p_lo + off, u16(0));
          }
        }
        rescale(alpha);
        // P^T was written through the generic proxy; every warp's wgmmas read all of it.
        fence_proxy_async_smem();
        named_barrier_sync(kMlaKvBar, kAll);

        mla_kv_pv<kN, kStacked, kMb>(o, mb0, dv, dp);
        // Every warp's P V of tile j has retired: its stage takes tile j + 2 (and P^T the next tile's).
        named_barrier_sync(kMlaKvBar, kAll);
        if (kWgs == 1 && j + 2 < pv.n_tiles) load_tile(j + 2, pages, stage);
      }
    } else {
      int pages[4];
      for (int j = 0; j < pv.n_tiles; ++j) {
        loader.pages_of(j + 2, pages);
        const u32 stage = (tile0 + static_cast<u32>(j)) & 1u;
        named_barrier_sync(kMlaKvBar, kAll);  // warpgroup 0's column maxima exchanged
        named_barrier_sync(kMlaKvBar, kAll);  // P^T and the factors of tile j
        float alpha[kCols];
#pragma unroll
        for (int n = 0; n < kCols / 2; ++n) {
          const float2 v = lds_f32x2(alphas + (8 * n + 2 * c4) * 4);
          alpha[2 * n] = v.x;
          alpha[2 * n + 1] = v.y;
        }
        rescale(alpha);
        mla_kv_pv<kN, kStacked, kMb>(o, mb0, wgmma_desc_sw128(stage_smem + stage * kMlaWgStageBytes, kMlaWgBlockBytes, kMlaWgSbo), dp);
        named_barrier_sync(kMlaKvBar, kAll);
        if (j + 2 < pv.n_tiles) load_tile(j + 2, pages, stage);
      }
    }
    st.tiles = tile0 + static_cast<u32>(pv.n_tiles);
  }

  // ---- epilogue: column sums across the lanes and warps, normalise, store ----
  // The last reads of the exchange slots happened before the last tile's second barrier.
  if (wg == 0) {
#pragma unroll
    for (int k = 0; k < kCols; ++k) l[k] = column_sum8(l[k]);
    if (g == 0) {
#pragma unroll
      for (int n = 0; n < kCols / 2; ++n) {
        const u32 a = red + (warp * kN + 8 * n + 2 * c4) * 4;
        sts_f32(a, l[2 * n]);
        sts_f32(a + 4, l[2 * n + 1]);
      }
    }
  }
  named_barrier_sync(kMlaKvBar, kAll);
  float lt[kCols];
#pragma unroll
  for (int n = 0; n < kCols / 2; ++n) {
    lt[2 * n] = 0.f;
    lt[2 * n + 1] = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 v = lds_f32x2(red + (w * kN + 8 * n + 2 * c4) * 4);
      lt[2 * n] += v.x;
      lt[2 * n + 1] += v.y;
    }
  }
  // Every thread reads the slots before the next piece's first write (the barrier at its start).

  // Column k, M-row half h (+ 8) of one O^T block, stacked halves added.
  auto o_sum = [](const float (&ob)[kORegs], int k, int h) {
    const int i = 4 * (k >> 1) + (k & 1) + 2 * h;
    return kStacked ? ob[i] + ob[i + kN / 2] : ob[i];
  };
#pragma unroll
  for (int k = 0; k < kCols; ++k) {
    const int col = 8 * (k >> 1) + 2 * c4 + (k & 1);
    const int row = row0 + col;
    if (row >= pv.rows_b) continue;
    // Output columns 64 mb + tok_lo and 64 mb + tok_lo + 8 (the M rows of O^T).
    if (slot < 0) {
      const float inv = lt[k] > 0.f ? p.out_scale / lt[k] : 0.f;  // nothing visible -> zeros
      u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(pv.tok0) * p.heads + row) * kMlaDimV + 64 * mb0 + tok_lo;
#pragma unroll
      for (int mb = 0; mb < kMb; ++mb) {
        out[64 * mb] = float_to_bf16(o_sum(o[mb], k, 0) * inv);
        out[64 * mb + 8] = float_to_bf16(o_sum(o[mb], k, 1) * inv);
      }
    } else {
      const long long idx = static_cast<long long>(slot) * max_rows + row;
      if (lt[k] > 0.f) {
        const float inv = 1.f / lt[k];
        float* op = static_cast<float*>(p.o_partial) + idx * kMlaDimV + 64 * mb0 + tok_lo;
#pragma unroll
        for (int mb = 0; mb < kMb; ++mb) {
          op[64 * mb] = o_sum(o[mb], k, 0) * inv;
          op[64 * mb + 8] = o_sum(o[mb], k, 1) * inv;
        }
      }
      if (wg == 0 && warp == 0 && g == 0) {
        static_cast<float*>(p.lse_partial)[idx] = lt[k] > 0.f ? m[k] + fast_log2(lt[k]) : neg_inf();
      }
    }
  }
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
