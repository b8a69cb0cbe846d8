#pragma once
// Paged MLA decode on Hopper warpgroup MMAs for e4m3 Q and KV (sm_90a), one piece at a time
// (schedule.cuh). The rows, tiles and consumer warpgroups of wgmma_common.cuh, plus a
// third warpgroup that loads the e4m3 bytes and widens them; it does nothing else.
//
// One CTA = 64 query rows of one part; 384 threads:
//   warpgroup 2 (producer): loads each 64-token KV tile from global memory into registers as e4m3
//     (16 bytes per load), widens it to f16 (exact: every e4m3 value is an f16) and stores it
//     128-byte-swizzled into the stage the wgmmas read, two stages. The bytes are used as stored:
//     the caller's dequantisation scales live in bmm1_scale and bmm2_scale, applied as for bf16. A
//     tile's loads are issued before the wait for its stage, so they fly while the consumers still
//     read it.
//   warpgroups 0 and 1 (consumers) widen Q the same way at the start of a piece (while the producer
//     fetches the first tile), then: S = Q K^T with f16 wgmmas (m64n32k16,
//     tokens [32 w, 32 w + 32), all 576 columns from shared memory), the softmax with the row max
//     crossing the warpgroups, P as one f16 (11 bits: fp8's tolerances need no hi + lo, as in the
//     mma.sync kernel), O += P V with f16 wgmmas over output columns [256 w, 256 w + 256), V the
//     first 512 columns of the same stage.
// Why the e4m3 bytes go through registers and not through a raw shared-memory stage: Q and two f16
// stages take 216 KB, which leaves no room for raw stages in 227 KB; with one f16 stage the widening
// of tile j + 1 would wait for tile j's P V. And why S is not an e4m3 wgmma on the raw bytes: that
// put outputs outside the contract's fp8 tolerance (atol 1.5e-3 + rtol 5e-2) on the H200 at
// bmm1_scale 0.11-0.2 (Hopper reportedly accumulates e4m3 products with ~13-bit mantissas; NOTES.md).
//
// Hand-offs, mbarriers with phases from the CTA's running tile count: stage full: every producer
// thread after its stores and a proxy fence; stage empty: each consumer warp once its P V (the
// stage's last reader) has retired. Q: a named barrier of the two consumer warpgroups.
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "mla_decode/kernel_mma.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"
#include "mla_decode/wgmma_common.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

// Registers per thread after setmaxnreg: 128 x 104 + 256 x 200 = the 384 x 168 the launch
// allocates. The producer holds a whole tile's share in flight (72 registers of loads).
constexpr int kMlaWgFp8ProducerRegs = 104;
constexpr int kMlaWgFp8ConsumerRegs = 200;

// Shared-memory addresses of the fp8 kernel (`base`: the 1024-byte-aligned base).
struct MlaWgFp8Smem {
  u32 q, stage, p, red;
  u32 bar_full, bar_empty;  // + 8 * stage

  __device__ __forceinline__ explicit MlaWgFp8Smem(u32 base)
      : q(base + kMlaWgFp8QOffset),
        stage(base + kMlaWgFp8StageOffset),
        p(base + kMlaWgFp8POffset),
        red(base + kMlaWgFp8RedOffset),
        bar_full(base + kMlaWgFp8BarOffset),
        bar_empty(bar_full + 8 * kMlaWgFp8Stages) {}
};

// One thread initialises every barrier of the fp8 kernel.
__device__ __forceinline__ void mla_wgmma_fp8_init_barriers(u32 base) {
  const MlaWgFp8Smem sm(base);
  constexpr u32 kProducers = kMlaWgFp8Threads - kMlaWgThreads;
  for (int s = 0; s < kMlaWgFp8Stages; ++s) {
    mbar_init(sm.bar_full + 8 * s, kProducers);
    mbar_init(sm.bar_empty + 8 * s, kMlaWgThreads / 32);  // the consumer warps
  }
  mbar_fence_init();
}

// Widens a thread's share of a 64-row tile (Q rows or KV tokens) into the f16 tile at `tile`. The
// share: rows row0 + 8 h (h < kGroups) and 16-byte e4m3 chunks chunk0 + 4 k (k = 0..8) of the 36 per
// row, with row0 % 8 = lane % 8 and chunk0 = lane / 8: each warp load reads 64 contiguous bytes of 8
// rows, each quarter-warp stores 8 rows of one chunk column (conflict-free in the swizzle).
template <int kGroups>
__device__ __forceinline__ void mla_fp8_store_f16(u32 tile, int row0, int chunk0, const U32x4 (&v)[kGroups][9]) {
#pragma unroll
  for (int h = 0; h < kGroups; ++h) {
    const int r = row0 + 8 * h;
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      const int c = chunk0 + 4 * k;  // e4m3 columns 16 c .. 16 c + 15: f16 block c / 4, chunks 2 (c % 4) (+1)
      U32x4 lo, hi;
      e4m3x16_to_f16(v[h][k], lo, hi);
      const u32 dst = tile + (c >> 2) * kMlaWgBlockBytes;
      sts128(dst + sw128(r, 2 * (c & 3)), lo);
      sts128(dst + sw128(r, 2 * (c & 3) + 1), hi);
    }
  }
}

// The producer warpgroup's share of rows [row0, row0 + 64) of `piece`.
template <int kPageSize>
__device__ __forceinline__ void mla_wgmma_fp8_producer(const MlaDecodeParams& p, u32 base, const MlaPiece& piece,
                                                       int row0, MlaWgState& st) {
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  const int warp = (threadIdx.x & 127) >> 5;
  const int lane = threadIdx.x & 31;
  const int pr = 16 * warp + (lane & 7);  // rows pr, pr + 8 (two 8-row groups per warp)
  const int pc = lane >> 3;
  const MlaWgFp8Smem sm(base);

  // Every thread is done with the previous piece's Q and stages.
  named_barrier_sync(kMlaBarPiece, kMlaWgFp8Threads);
  const MlaPieceRows pv = mla_piece_rows<kMlaWgRows, kMlaWgTileTokens>(p, piece, row0);
  if (pv.n_tiles == 0) return;
  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(pv.b) * p.block_table_stride;

  // The block-table entries of this thread's two tokens, read a tile ahead; -1: past the range.
  auto pages_of = [&](int j, int (&pages)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = pv.t0 + j * kMlaWgTileTokens + pr + 8 * h;
      pages[h] = j < pv.n_tiles && t < pv.t1 ? __ldg(bt_row + t / kPageSize) : -1;
    }
  };
  U32x4 v[2][9];
  int pages[2];
  pages_of(0, pages);
  const u32 idx0 = st.tiles;
  for (int j = 0; j < pv.n_tiles; ++j) {
    // Tokens past the range read as zeros: masked P is 0, and 0 * stale NaN would be NaN.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = pv.t0 + j * kMlaWgTileTokens + pr + 8 * h;
      const bool valid = pages[h] >= 0;
      const unsigned char* src =
          kv + ((valid ? static_cast<long long>(pages[h]) * kPageSize : 0) + t % kPageSize) * kMlaDimQk + pc * 16;
#pragma unroll
      for (int k = 0; k < 9; ++k) v[h][k] = ldg128_if(src + 64 * k, valid);
    }
    pages_of(j + 1, pages);
    const u32 idx = idx0 + j;
    const u32 stage = idx & 1u;
    mbar_wait(sm.bar_empty + 8 * stage, ((idx >> 1) & 1u) ^ 1u);
    mla_fp8_store_f16(sm.stage + stage * kMlaWgFp8TileBytes, pr, pc, v);
    // The stores went through the generic proxy; the consumers' wgmmas read them through the async one.
    fence_proxy_async_smem();
    mbar_arrive(sm.bar_full + 8 * stage);
  }
  st.tiles = idx0 + pv.n_tiles;
}

// P = exp2(S - m) as one f16 into the shared P tile: row r, tokens 32 wg + 8 n + 2 c4 (+1) go to chunk
// 4 wg + n of the row's 128 bytes. Returns the rows' sums of the unrounded P.
__device__ __forceinline__ void mla_fp8_store_p(const float (&s)[16], float muse_lo, float muse_hi, u32 p_smem,
                                                u32 p_row_lo, u32 p_row_hi, int wg, int g, float& sum_lo, float& sum_hi) {
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
    const u32 chunk = static_cast<u32>(4 * wg + n);
    const u32 h01 = pack_f16x2(p0, p1);
    const u32 h23 = pack_f16x2(p2, p3);
    sts32(p_smem + (p_row_lo + ((chunk ^ static_cast<u32>(g)) << 4)), h01);
    sts32(p_smem + (p_row_hi + ((chunk ^ static_cast<u32>(g)) << 4)), h23);
  }
}

// The consumer warpgroups' share: slot < 0 writes `out`, else the partial O and LSE at `slot`.
__device__ __forceinline__ void mla_wgmma_fp8_consumer(const MlaDecodeParams& p, u32 base, const MlaPiece& piece,
                                                       int row0, int slot, MlaWgState& st) {
  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // output columns [256 wg, 256 wg + 256), S tokens [32 wg, 32 wg + 32)
  const int warp = (tid & 127) >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c4 = lane & 3;
  const int r_lo = 16 * warp + g;
  const int r_hi = r_lo + 8;
  const MlaWgFp8Smem sm(base);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  // Every thread is done with the previous piece's Q, stages, P and row sums.
  named_barrier_sync(kMlaBarPiece, kMlaWgFp8Threads);
  const MlaPieceRows pv = mla_piece_rows<kMlaWgRows, kMlaWgTileTokens>(p, piece, row0);
  if (pv.n_tiles > 0) {
    const int last_lo = mla_row_last(p, pv, row0 + r_lo);
    const int last_hi = mla_row_last(p, pv, row0 + r_hi);
    const float scale = p.scale_log2;
    // P stores: row r, tokens 32 wg + 8 n + 2 c4 (+1): chunk 4 wg + n of the 64-token row.
    const u32 p_row_lo = r_lo * kMlaWgLineBytes + 4 * c4;
    const u32 p_row_hi = r_hi * kMlaWgLineBytes + 4 * c4;
    const u64 dq = wgmma_desc_sw128(sm.q, 16, kMlaWgSbo);
    const u64 dp = wgmma_desc_sw128(sm.p, 16, kMlaWgSbo);

    {
      // Q: rows 8 (warp of the two warpgroups) + lane % 8; rows past the request read as zeros.
      const int qr = 8 * (tid >> 5) + (lane & 7);
      const bool valid = row0 + qr < pv.rows_b;
      const unsigned char* src = static_cast<const unsigned char*>(p.q) +
                                 (static_cast<long long>(pv.tok0) * p.heads + row0 + qr) * kMlaDimQk + (lane >> 3) * 16;
      U32x4 v[1][9];
#pragma unroll
      for (int k = 0; k < 9; ++k) v[0][k] = ldg128_if(src + 64 * k, valid);
      mla_fp8_store_f16(sm.q, qr, lane >> 3, v);
      fence_proxy_async_smem();
      named_barrier_sync(kMlaBarRowExchange, kMlaWgThreads);
    }

    for (int j = 0; j < pv.n_tiles; ++j) {
      const u32 idx = st.tiles;
      const u32 stage = idx & 1u;
      mbar_wait(sm.bar_full + 8 * stage, (idx >> 1) & 1u);
      const u32 k_smem = sm.stage + stage * kMlaWgFp8TileBytes;
      const u64 dk = wgmma_desc_sw128(k_smem + wg * 32 * kMlaWgLineBytes, 16, kMlaWgSbo);
      const u64 dv = wgmma_desc_sw128(k_smem + wg * 4 * kMlaWgBlockBytes, kMlaWgBlockBytes, kMlaWgSbo);

      // ---- S = Q K^T for tokens [32 wg, 32 wg + 32) ----
      float s[16];
      wgmma_fence();
#pragma unroll
      for (int kb = 0; kb < kMlaDimQk / 64; ++kb) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const u32 off = kb * kMlaWgBlockBytes + ks * kMlaWgKStepBytes;
          WgmmaF16<32>::ss<0>(s, wgmma_desc_advance(dq, off), wgmma_desc_advance(dk, off), kb + ks > 0);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(s);

      // ---- mask, scale, row max across the two warpgroups ----
      float muse_lo, muse_hi, alpha_lo, alpha_hi;
      mla_wg_row_max(s, pv.t0 + j * kMlaWgTileTokens + 32 * wg + 2 * c4, last_lo, last_hi, scale, sm.red, wg, r_lo, r_hi,
                     c4, m_lo, m_hi, muse_lo, muse_hi, alpha_lo, alpha_hi);

      float sum_lo, sum_hi;
      mla_fp8_store_p(s, muse_lo, muse_hi, sm.p, p_row_lo, p_row_hi, wg, g, sum_lo, sum_hi);
      mla_wg_rescale(o, l_lo, l_hi, alpha_lo, alpha_hi, sum_lo, sum_hi);
      // P was written through the generic proxy; both warpgroups' wgmmas read it.
      fence_proxy_async_smem();
      named_barrier_sync(kMlaBarP, kMlaWgThreads);

      // ---- O += P V over this warpgroup's 256 columns ----
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        WgmmaF16<256>::ss<1>(o, wgmma_desc_advance(dp, ks * kMlaWgKStepBytes), wgmma_desc_advance(dv, ks * kMlaWgMnStepBytes), true);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(o);
      if (lane == 0) mbar_arrive(sm.bar_empty + 8 * stage);
      ++st.tiles;
    }
  }
  mla_wg_epilogue(p, o, m_lo, m_hi, l_lo, l_hi, sm.red, wg, c4, r_lo, r_hi, row0, pv.rows_b, pv.tok0, slot);
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
