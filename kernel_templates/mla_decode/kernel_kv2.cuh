#pragma once
// Paged MLA decode with the KV tokens on the MMA's M side, two warpgroups (sm_90a): kernel_kv.cuh's
// layout (S^T = K Q^T, softmax over M, O^T += V^T P^T with V^T through the transpose bit, P as bf16
// hi + lo) with V's 512 output columns split over two warpgroups, so that the O^T accumulators of up
// to 64 query rows fit: warpgroup 0 owns the first kBlocks0 of the 8 column blocks (4; 3 at N = 64),
// warpgroup 1 the rest.
//
// One CTA = 256 threads, N = 16, 32 or 64 query rows (row = i * H + h) of one part. Per 64-token tile:
//   warpgroup 0: S^T (36 m64nNk16), the softmax over the tokens (column max over lanes, then over its
//     four warps through shared memory), P^T hi + lo stored into the stage's RoPE block (dead once
//     S^T is done; at N = 64 only hi fits, lo has its own buffer), the column rescale factors
//     published per stage, then its share of O^T += V^T P^T;
//   warpgroup 1: waits for P^T, rescales and runs its share of P V, then refills the stage both
//     warpgroups have released (cp.async, the 4-rows x 128-byte mapping, block table read a tile ahead), so the
//     loads never sit on warpgroup 0's path.
// Up to N = 32 P^T hi and lo are one 2N-row B operand: each V^T step is a single m64n(2N)k16 (A, the
// 2 KB V^T slice, read once) and query row c accumulates in columns c and c + N, added at the end.
// At N = 64 each step is two m64n64k16 (hi, lo) into the same accumulators.
// Per stage: a full barrier (cp.async completions of warpgroup 1), an empty barrier (both warpgroups
// after their P V), a P-ready barrier (warpgroup 0 after its P^T stores and factors). The stage
// cycle orders the buffer reuse: the next tile of a stage is issued only after both warpgroups
// released it; warpgroup 0 writes the stage's RoPE block after its full barrier, and the stage's
// factors (at N = 64 also the one lo buffer) after the empty barrier of the tile that last read them.
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "mla_decode/kernel_kv.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

template <int kN>
struct MlaKv2Shape {
  static constexpr bool kConcat = kN <= 32;            // hi and lo side by side along N
  static constexpr int kPvN = kConcat ? 2 * kN : kN;   // N of one P V wgmma
  static constexpr int kORegs = kPvN / 2;              // accumulator registers per column block
  static constexpr int kCols = kN / 4;                 // distinct query rows (columns) per thread
  // Column blocks of warpgroup 0 (the rest are warpgroup 1's): at N = 64 warpgroup 0 also holds S^T
  // and the softmax state (32 + 2 x 16 registers), so it keeps 3 of the 8 blocks.
  static constexpr int kBlocks0 = kN == 64 ? 3 : 4;
};

// O^T of a warpgroup's kBlocks column blocks: block mb holds output columns 64 (mb0 + mb) + tok_lo
// (+ 8). Register i holds query row (column) 8 ((i / 4) % (kN / 8)) + 2 c4 + i % 2, i.e. the thread's
// column k = mla_kv2_col(i); in the concatenated form registers i and i + kN / 2 hold its hi and lo.
template <int kN>
__device__ __forceinline__ int mla_kv2_col(int i) {
  return 2 * ((i >> 2) % (kN / 8)) + (i & 1);
}

// O^T += V^T P^T over one tile for blocks mb0 .. mb0 + kBlocks - 1: A = V^T of the stage at `k_smem`
// (transpose bit), B = P^T hi (+ lo) in its RoPE block, at N = 64 lo from `p_lo`. Retired on return.
template <int kN, int kBlocks>
__device__ __forceinline__ void mla_kv2_pv(float (&o)[kBlocks][MlaKv2Shape<kN>::kORegs], u32 k_smem, u32 p_lo, int mb0) {
  using Shape = MlaKv2Shape<kN>;
  const u64 dv = wgmma_desc_sw128(k_smem + mb0 * 8192, 8192, 1024);
  const u64 dp = wgmma_desc_sw128(k_smem + 8 * 8192, 16, 1024);
  const u64 dp_lo = wgmma_desc_sw128(p_lo, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int mb = 0; mb < kBlocks; ++mb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const u64 dvk = wgmma_desc_advance(dv, mb * 8192 + ks * 2048);
      WgmmaBf16<Shape::kPvN>::template ss<0, 1>(o[mb], dvk, wgmma_desc_advance(dp, ks * 32), true);
      if constexpr (!Shape::kConcat) WgmmaBf16<kN>::template ss<0, 1>(o[mb], dvk, wgmma_desc_advance(dp_lo, ks * 32), true);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int mb = 0; mb < kBlocks; ++mb) wgmma_fence_operand(o[mb]);
}

template <int kN, int kBlocks>
__device__ __forceinline__ void mla_kv2_rescale(float (&o)[kBlocks][MlaKv2Shape<kN>::kORegs], const float (&alpha)[kN / 4]) {
  // Once a column's max settles its alpha is exactly 1: skip the multiplies when the whole warp's are.
  bool any = false;
#pragma unroll
  for (int k = 0; k < kN / 4; ++k) any |= alpha[k] != 1.f;
  if (__any_sync(0xffffffffu, any)) {
#pragma unroll
    for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < MlaKv2Shape<kN>::kORegs; ++i) o[mb][i] *= alpha[mla_kv2_col<kN>(i)];
  }
}

// Normalises and stores blocks mb0 .. mb0 + kBlocks - 1 of the rows [row0, row0 + kN) below rows_b:
// slot < 0: `out`, else the partial O at `slot`, and with kLse (warpgroup 0) the LSE from the maxima m.
template <int kN, int kBlocks, int kHeads, int kMaxRows, bool kLse>
__device__ __forceinline__ void mla_kv2_store(const float (&o)[kBlocks][MlaKv2Shape<kN>::kORegs], const MlaDecodeParams& p,
                                              const float (&lt)[kN / 4], const float (&m)[kN / 4], int mb0, int row0, int rows_b,
                                              int tok0, int slot) {
  const int lane = threadIdx.x & 31;
  const int c4 = lane & 3;
  const bool lse_writer = kLse && (threadIdx.x & 127) < 4;  // warp 0 of the warpgroup, g = 0
  const int dim0 = 64 * mb0 + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);  // output columns dim0 + 64 mb (+ 8)
  // Column k, M-row half h (+ 8) of one O^T block, the concatenated halves added.
  auto o_sum = [](const float(&ob)[MlaKv2Shape<kN>::kORegs], int k, int h) {
    const int i = 4 * (k >> 1) + (k & 1) + 2 * h;
    return MlaKv2Shape<kN>::kConcat ? ob[i] + ob[i + kN / 2] : ob[i];
  };
#pragma unroll
  for (int k = 0; k < kN / 4; ++k) {
    const int row = row0 + 8 * (k >> 1) + 2 * c4 + (k & 1);
    if (row >= rows_b) continue;
    if (slot < 0) {
      const float inv = lt[k] > 0.f ? p.out_scale / lt[k] : 0.f;  // nothing visible -> zeros
      u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * kHeads + row) * kMlaDimV + dim0;
#pragma unroll
      for (int mb = 0; mb < kBlocks; ++mb) {
        out[64 * mb] = float_to_bf16(o_sum(o[mb], k, 0) * inv);
        out[64 * mb + 8] = float_to_bf16(o_sum(o[mb], k, 1) * inv);
      }
    } else {
      const long long idx = static_cast<long long>(slot) * kMaxRows + row;
      if (lt[k] > 0.f) {
        const float inv = 1.f / lt[k];
        float* op = static_cast<float*>(p.o_partial) + idx * kMlaDimV + dim0;
#pragma unroll
        for (int mb = 0; mb < kBlocks; ++mb) {
          op[64 * mb] = o_sum(o[mb], k, 0) * inv;
          op[64 * mb + 8] = o_sum(o[mb], k, 1) * inv;
        }
      }
      if (lse_writer) static_cast<float*>(p.lse_partial)[idx] = lt[k] > 0.f ? m[k] + fast_log2(lt[k]) : neg_inf();
    }
  }
}

// Rows [row0, row0 + kN) of `piece`; slot < 0: write `out`, else the partial O and LSE at `slot`.
// `base`: the 1024-byte-aligned shared-memory base.
template <int kHeads, int kPageSize, int kMaxSeqLenQ, bool kCausal, int kN>
__device__ __forceinline__ void mla_kv2_piece(const MlaDecodeParams& p, u32 base, const MlaPiece& piece, int row0,
                                              int slot, MlaWgState& st) {
  static_assert(kN == 16 || kN == 32 || kN == 64, "the two-warpgroup KV-on-M kernel takes 16, 32 or 64 query rows");
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  using Shape = MlaKv2Shape<kN>;
  constexpr MlaKv2Smem kL = mla_kv2_smem(kN);
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
  constexpr int kRowBytes = kMlaDimQk * 2;
  constexpr int kRegs = kN / 2;  // accumulator registers of S^T (m64nNk16)
  constexpr int kCols = Shape::kCols;
  constexpr u32 kQBlock = kN * 128;  // bytes of one 64-column block of Q
  constexpr u32 kRopeBlock = 8 * 8192;  // the stage's RoPE columns: P^T once S^T is done

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;  // within the warpgroup
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c4 = lane & 3;
  const int tok_lo = 16 * warp + g;  // tile tokens (and O^T rows) of this thread: tok_lo and tok_lo + 8

  const int b = piece.b;
  const int tok0 = piece.r.tok0;
  const int q_len = piece.r.q_len;
  const int rows_b = q_len * kHeads;
  const int seq_len = piece.r.seq_len;
  const int t0 = piece.t0;
  int t1 = piece.t1;
  if constexpr (kCausal) {
    const int last_row = (row0 + kN < rows_b ? row0 + kN : rows_b) - 1;
    const int vis_end = seq_len - q_len + last_row / kHeads + 1;
    if (vis_end < t1) t1 = vis_end > t0 ? vis_end : t0;
  }
  const int n_tiles = (t1 - t0 + kMlaKvTileTokens - 1) / kMlaKvTileTokens;

  const u32 q_smem = base + kL.q_offset;
  const u32 stage_smem = base + kL.stage_offset;
  const u32 p_lo_buf = base + kL.plo_offset;  // N = 64 only
  const u32 alpha_smem = base + kL.alpha_offset;
  const u32 red = base + kL.red_offset;  // [warp][column] fp32; after the loop row 0 holds the sums
  const u32 bar_q = base + kL.bar_offset;
  auto bar_full = [&](u32 s) { return bar_q + 8 + 8 * s; };
  auto bar_empty = [&](u32 s) { return bar_q + 8 + 8 * kMlaKvStages + 8 * s; };
  auto bar_ready = [&](u32 s) { return bar_q + 8 + 16 * kMlaKvStages + 8 * s; };

  const u32 tile0 = st.tiles;
  // The final column sums (published by warpgroup 0), once both warpgroups are past their P V loops.
  auto column_sums = [&](float (&lt)[kCols]) {
    named_barrier_sync(1, kMlaKv2Threads);
#pragma unroll
    for (int n = 0; n < kCols / 2; ++n) {
      const float2 v = lds_f32x2(red + (8 * n + 2 * c4) * 4);
      lt[2 * n] = v.x;
      lt[2 * n + 1] = v.y;
    }
    // Every thread reads the sums before the next piece's first write (after the barrier at its start).
  };

  // Every thread is done with the previous piece's Q, stages and exchange slots.
  named_barrier_sync(1, kMlaKv2Threads);
  if (n_tiles > 0) st.tiles = tile0 + static_cast<u32>(n_tiles);
  if (wg == 1) {
    float o[8 - Shape::kBlocks0][Shape::kORegs];
#pragma unroll
    for (int mb = 0; mb < 8 - Shape::kBlocks0; ++mb)
#pragma unroll
      for (int i = 0; i < Shape::kORegs; ++i) o[mb][i] = 0.f;
    if (n_tiles > 0) {
      // ---- loads and the second half of P V ----
      const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
      const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(b) * p.block_table_stride;
      const unsigned char* q_rows =
          static_cast<const unsigned char*>(p.q) + (static_cast<long long>(tok0) * kHeads + row0) * kRowBytes;
      // Each warp instruction copies 4 token rows x 8 chunks (one 128-byte swizzled row of one
      // 64-column block each): thread (warp w, lane l) owns tokens 16 q + 4 w + l / 8 (q = 0..3) and
      // chunk l % 8 of all 9 column blocks.
      const int ld_tok = 4 * warp + (lane >> 3);
      const int ld_chunk = lane & 7;
      const u32 ld_dst = static_cast<u32>(ld_tok * 128 + ((ld_chunk ^ (ld_tok & 7)) << 4));
      auto pages_of = [&](int j, int (&pages)[4]) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int t = t0 + j * kMlaKvTileTokens + 16 * q + ld_tok;
          pages[q] = j < n_tiles && t < t1 ? __ldg(bt_row + t / kPageSize) : -1;  // -1: zero-filled
        }
      };
      auto load_tile = [&](int j, const int (&pages)[4], u32 stage) {
        const u32 dst0 = stage_smem + stage * kMlaWgStageBytes + ld_dst;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int t = t0 + j * kMlaKvTileTokens + 16 * q + ld_tok;
          // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
          const bool valid = pages[q] >= 0;
          const unsigned char* src =
              valid ? kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kRowBytes + ld_chunk * 16 : kv;
          const u32 bytes = valid ? 16u : 0u;
#pragma unroll
          for (int blk = 0; blk < 9; ++blk) cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
        }
        cp_async_mbar_arrive(bar_full(stage));
      };
      const int ltid = tid - 128;
      for (int idx = ltid; idx < kN * 72; idx += 128) {
        const int r = idx / 72;
        const int ch = idx - 72 * r;
        const bool valid = row0 + r < rows_b;
        cp_async_16_addr(q_smem + (ch >> 3) * kQBlock + sw128(r, ch & 7),
                         valid ? q_rows + r * kRowBytes + ch * 16 : q_rows, valid ? 16u : 0u);
      }
      cp_async_mbar_arrive(bar_q);
      int pages[4];
      pages_of(0, pages);
      load_tile(0, pages, tile0 & 1u);
      if (n_tiles > 1) {
        pages_of(1, pages);
        load_tile(1, pages, (tile0 + 1u) & 1u);
      }
      for (int j = 0; j < n_tiles; ++j) {
        pages_of(j + 2, pages);
        const u32 tile = tile0 + static_cast<u32>(j);
        const u32 stage = tile & 1u;
        const u32 phase = (tile >> 1) & 1u;
        mbar_wait(bar_full(stage), phase);
        mbar_wait(bar_ready(stage), phase);
        // The tile (cp.async) and P^T (st.shared) were written through the generic proxy.
        fence_proxy_async_smem();
        float alpha[kCols];
#pragma unroll
        for (int n = 0; n < kCols / 2; ++n) {
          const float2 v = lds_f32x2(alpha_smem + (stage * kN + 8 * n + 2 * c4) * 4);
          alpha[2 * n] = v.x;
          alpha[2 * n + 1] = v.y;
        }
        mla_kv2_rescale<kN>(o, alpha);
        mla_kv2_pv<kN>(o, stage_smem + stage * kMlaWgStageBytes, p_lo_buf, Shape::kBlocks0);
        mbar_arrive(bar_empty(stage));
        if (j + 2 < n_tiles) {
          mbar_wait(bar_empty(stage), phase);  // warpgroup 0's P V of the tile has retired too
          load_tile(j + 2, pages, stage);
        }
      }
    }
    float lt[kCols];
    column_sums(lt);
    mla_kv2_store<kN, 8 - Shape::kBlocks0, kHeads, kMaxRows, false>(o, p, lt, lt, Shape::kBlocks0, row0, rows_b, tok0, slot);
  } else {
    float o[Shape::kBlocks0][Shape::kORegs];
#pragma unroll
    for (int mb = 0; mb < Shape::kBlocks0; ++mb)
#pragma unroll
      for (int i = 0; i < Shape::kORegs; ++i) o[mb][i] = 0.f;
    float m[kCols], l[kCols];
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      m[k] = neg_inf();
      l[k] = 0.f;
    }
    if (n_tiles > 0) {
      // ---- S^T, softmax, P^T, the first column blocks of P V ----
      // Last visible token of this thread's column k, from per-tile opaque copies of the request's
      // offsets (held across the loop, the kN / 4 limits take registers that N = 64 does not have).
      auto lim = [&](int k, int vis0, int r0) { return vis0 + (r0 + 8 * (k >> 1) + (k & 1)) / kHeads; };
      const float scale = p.scale_log2;
      const u32 p_tok_lo = static_cast<u32>(2 * g);  // P^T: tokens tok_lo / tok_lo + 8 = chunks 2 w / 2 w + 1
      const u64 dq = wgmma_desc_sw128(q_smem, 16, 1024);
      // A column that has seen nothing yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
      auto muse = [](float mc) { return mc == neg_inf() ? 0.f : mc; };

      mbar_wait(bar_q, st.pieces & 1);
      for (int j = 0; j < n_tiles; ++j) {
        const u32 tile = tile0 + static_cast<u32>(j);
        const u32 stage = tile & 1u;
        const u32 phase = (tile >> 1) & 1u;
        mbar_wait(bar_full(stage), phase);
        fence_proxy_async_smem();
        const u32 k_smem = stage_smem + stage * kMlaWgStageBytes;
        const u64 dk = wgmma_desc_sw128(k_smem, 16, 1024);
        // Opaque per tile, so the 36 Q descriptors are formed at their wgmmas instead of being held
        // in registers across the loop (72 registers that N = 64 does not have).
        u64 dq_t = dq;
        asm volatile("" : "+l"(dq_t));
        int vis0 = seq_len - q_len, r0 = row0 + 2 * c4;
        asm volatile("" : "+r"(vis0), "+r"(r0));

        float s[kRegs];
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 9; ++kb) {
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            WgmmaBf16<kN>::template ss<0>(s, wgmma_desc_advance(dk, kb * 8192 + ks * 32),
                                          wgmma_desc_advance(dq_t, kb * kQBlock + ks * 32), kb + ks > 0);
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s);

        // ---- mask, scale, column max over the 64 tokens ----
        const int t_lo = t0 + j * kMlaKvTileTokens + tok_lo;
        float mx[kCols];
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          const int k = 2 * (i >> 2) + (i & 1);
          const int t = t_lo + 8 * ((i >> 1) & 1);
          bool ok = t < t1;
          if constexpr (kCausal) ok = ok && t <= lim(k, vis0, r0);
          s[i] = ok ? s[i] * scale : neg_inf();
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
        named_barrier_sync(2, 128);
        float alpha[kCols];
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
          const float mnew = fmaxf(m[k], mx[k]);
          alpha[k] = fast_exp2(m[k] - muse(mnew));
          m[k] = mnew;
          l[k] *= alpha[k];
        }
        // Warpgroup 1 has read this stage's factors of two tiles back (and, at N = 64, finished the P V
        // of the previous tile, which reads the single P^T lo buffer): both arrive on the empty
        // barrier after that, and the wait makes the order explicit (it has long completed).
        constexpr int kBack = Shape::kConcat ? 2 : 1;
        if (j >= kBack) mbar_wait(bar_empty((tile - kBack) & 1u), ((tile - kBack) >> 1) & 1u);
        if (warp == 0 && g == 0) {
#pragma unroll
          for (int n = 0; n < kCols / 2; ++n) {
            const u32 a = alpha_smem + (stage * kN + 8 * n + 2 * c4) * 4;
            sts_f32(a, alpha[2 * n]);
            sts_f32(a + 4, alpha[2 * n + 1]);
          }
        }
        mla_kv2_rescale<kN>(o, alpha);

        // ---- P^T = exp2(S^T - m) as bf16 hi + lo into the stage's RoPE block (and the lo buffer) ----
        const u32 p_hi = k_smem + kRopeBlock;
        const u32 p_lo = Shape::kConcat ? p_hi + kN * 128 : p_lo_buf;
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          const int k = 2 * (i >> 2) + (i & 1);
          const int col = 8 * (i >> 2) + 2 * c4 + (i & 1);
          const float pv_ = fast_exp2(s[i] - muse(m[k]));
          l[k] += pv_;
          const u16 h = float_to_bf16(pv_);
          const u32 chunk = static_cast<u32>(2 * warp + ((i >> 1) & 1));
          const u32 off = static_cast<u32>(col * 128) + ((chunk ^ static_cast<u32>(col & 7)) << 4) + p_tok_lo;
          sts16(p_hi + off, h);
          sts16(p_lo + off, float_to_bf16(pv_ - bf16_to_float(h)));
        }
        // P^T and the factors were written through the generic proxy; both warpgroups' wgmmas read P^T.
        fence_proxy_async_smem();
        mbar_arrive(bar_ready(stage));
        mbar_wait(bar_ready(stage), phase);  // all of warpgroup 0's P^T stores (and its reads of `red`)

        mla_kv2_pv<kN>(o, k_smem, p_lo_buf, 0);
        mbar_arrive(bar_empty(stage));
      }
    }

    // ---- the column sums over lanes and warps, published for both warpgroups ----
#pragma unroll
    for (int k = 0; k < kCols; ++k) l[k] = column_sum8(l[k]);
    // The last reads of `red` happened before the last tile's P-ready wait.
    if (g == 0) {
#pragma unroll
      for (int n = 0; n < kCols / 2; ++n) {
        const u32 a = red + (warp * kN + 8 * n + 2 * c4) * 4;
        sts_f32(a, l[2 * n]);
        sts_f32(a + 4, l[2 * n + 1]);
      }
    }
    named_barrier_sync(2, 128);
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int n = 0; n < kCols / 2; ++n) {
        float t[2] = {0.f, 0.f};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 v = lds_f32x2(red + (w * kN + 8 * n + 2 * c4) * 4);
          t[0] += v.x;
          t[1] += v.y;
        }
        // Row 0, the columns this lane has just read: no other lane touches them.
        sts_f32(red + (8 * n + 2 * c4) * 4, t[0]);
        sts_f32(red + (8 * n + 2 * c4 + 1) * 4, t[1]);
      }
    }
    float lt[kCols];
    column_sums(lt);
    mla_kv2_store<kN, Shape::kBlocks0, kHeads, kMaxRows, true>(o, p, lt, m, 0, row0, rows_b, tok0, slot);
  }
  if (n_tiles > 0) ++st.pieces;
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
