#pragma once
// Paged MLA decode on Hopper warpgroup MMAs for e4m3 Q and KV (sm_90a), one piece at a time
// (schedule.cuh). The bf16 kernel's rows, tiles and consumer warpgroups (kernel_wgmma.cuh), plus a
// third warpgroup that brings the data in and widens it; it does nothing else.
//
// One CTA = 64 query rows of one part; 384 threads:
//   warpgroup 2 (producer): cp.async copies Q and each 64-token KV tile into shared memory as raw
//     e4m3 bytes (two raw stages, 128-byte-swizzled), then widens the tile's V (its first 512
//     columns) to f16 in the MN-major layout P V reads (one V stage). The bytes are copied as stored:
//     the caller's dequantisation scales live in bmm1_scale and bmm2_scale, applied as for bf16.
//   warpgroups 0 and 1 (consumers): S = Q K^T straight from the raw stage with e4m3 wgmmas
//     (m64n32k32, tokens [32 w, 32 w + 32), all 576 columns, fp32 accumulators), the softmax with
//     the row max crossing the warpgroups, P as one f16 (11 bits: fp8's tolerances need no hi + lo,
//     as in the mma.sync kernel), O += P V with f16 wgmmas over output columns [256 w, 256 w + 256).
// Why only V is widened: a widened K tile is 72 KB and widening it while the MMAs run needs two such
// stages beside Q (64 KB as f16) and the raw stages, more than 227 KB. Read as e4m3, S needs no copy
// and half the shared-memory bytes of f16 per MMA; the widened V (64 KB) is written while S and the
// softmax of the same tile run, so one stage of it keeps the widening off the MMAs' path.
//
// Hand-offs, all mbarriers (counts in kernel.cuh), phases from the CTA's running tile count:
//   Q full: the producer's cp.async; raw full [stage]: the producer's cp.async;
//   raw empty [stage]: each consumer warp once its S has retired, each producer warp once it has
//     widened the stage's V; V full: every producer thread after its stores and a proxy fence;
//   V empty: each consumer warp once its P V has retired.
// Per tile the producer refills the other raw stage (freed by the previous tile's S and widening)
// before it widens this one, so the next tile streams in during this tile's softmax and P V.
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "mla_decode/kernel_mma.cuh"
#include "mla_decode/kernel_wgmma.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

// Registers per thread after setmaxnreg: 128 x 56 + 256 x 224 = the 384 x 168 the launch allocates.
constexpr int kMlaWgFp8ProducerRegs = 56;
constexpr int kMlaWgFp8ConsumerRegs = 224;

// Shared-memory addresses of the fp8 kernel (`base`: the 1024-byte-aligned base).
struct MlaWgFp8Smem {
  u32 q, raw, v, p, red;
  u32 bar_q, bar_raw_full, bar_raw_empty, bar_v_full, bar_v_empty;  // raw: + 8 * stage

  __device__ __forceinline__ explicit MlaWgFp8Smem(u32 base)
      : q(base + kMlaWgFp8QOffset),
        raw(base + kMlaWgFp8RawOffset),
        v(base + kMlaWgFp8VOffset),
        p(base + kMlaWgFp8POffset),
        red(base + kMlaWgFp8RedOffset),
        bar_q(base + kMlaWgFp8BarOffset),
        bar_raw_full(bar_q + 8),
        bar_raw_empty(bar_q + 8 + 8 * kMlaWgFp8RawStages),
        bar_v_full(bar_q + 8 + 16 * kMlaWgFp8RawStages),
        bar_v_empty(bar_v_full + 8) {}
};

// One thread initialises every barrier of the fp8 kernel.
__device__ __forceinline__ void mla_wgmma_fp8_init_barriers(u32 base) {
  const MlaWgFp8Smem sm(base);
  constexpr u32 kProducers = kMlaWgFp8Threads - kMlaWgThreads;
  mbar_init(sm.bar_q, kProducers);
  for (int s = 0; s < kMlaWgFp8RawStages; ++s) {
    mbar_init(sm.bar_raw_full + 8 * s, kProducers);
    mbar_init(sm.bar_raw_empty + 8 * s, kMlaWgFp8Threads / 32);  // every warp
  }
  mbar_init(sm.bar_v_full, kProducers);
  mbar_init(sm.bar_v_empty, kMlaWgThreads / 32);  // the consumer warps
  mbar_fence_init();
}

// The producer warpgroup's share of rows [row0, row0 + 64) of `piece`.
template <int kHeads, int kPageSize, bool kCausal>
__device__ __forceinline__ void mla_wgmma_fp8_producer(const MlaDecodeParams& p, u32 base, const MlaPiece& piece,
                                                       int row0, MlaWgState& st) {
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  constexpr int kChunks = kMlaDimQk / 16;  // 16-byte chunks per e4m3 row
  const int wt = threadIdx.x & 127;
  const int warp = wt >> 5;
  const int lane = threadIdx.x & 31;
  const MlaWgFp8Smem sm(base);

  // Every thread is done with the previous piece's Q and stages.
  named_barrier_sync(1, kMlaWgFp8Threads);
  int t1;
  const int n_tiles = mla_wg_tiles<kHeads, kCausal>(piece, row0, t1);
  if (n_tiles == 0) return;
  const int t0 = piece.t0;
  const int rows_b = piece.r.q_len * kHeads;
  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(piece.b) * p.block_table_stride;
  const unsigned char* q_rows =
      static_cast<const unsigned char*>(p.q) + (static_cast<long long>(piece.r.tok0) * kHeads + row0) * kMlaDimQk;

  // Q: 64 rows x 36 chunks, rows past the request zero-filled.
#pragma unroll 6
  for (int i = 0; i < kMlaWgRows * kChunks / 128; ++i) {
    const int idx = i * 128 + wt;
    const int r = idx / kChunks;
    const int ch = idx % kChunks;
    const bool valid = row0 + r < rows_b;
    cp_async_16_addr(sm.q + (ch >> 3) * 8192 + sw128(r, ch & 7), valid ? q_rows + r * kMlaDimQk + ch * 16 : q_rows,
                     valid ? 16u : 0u);
  }
  cp_async_mbar_arrive(sm.bar_q);

  // Tile loads: each warp instruction copies 4 token rows x 8 chunks of one column block
  // (conflict-free shared stores, 128-byte global segments). Thread (warp w, lane l) owns tokens
  // 16 q + 4 w + l / 8 (q = 0..3) and chunk l % 8 of blocks 0-3, and of block 4 when l % 8 < 4.
  const int ld_tok = 4 * warp + (lane >> 3);
  const int ld_chunk = lane & 7;
  const u32 ld_dst = sw128(ld_tok, ld_chunk);
  auto pages_of = [&](int j, int (&pages)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
      pages[q] = j < n_tiles && t < t1 ? __ldg(bt_row + t / kPageSize) : -1;  // -1: zero-filled
    }
  };
  auto load_tile = [&](int j, const int (&pages)[4], u32 idx) {
    const u32 stage = idx & 1u;
    mbar_wait(sm.bar_raw_empty + 8 * stage, ((idx >> 1) & 1u) ^ 1u);
    const u32 dst0 = sm.raw + stage * kMlaWgFp8RawBytes + ld_dst;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
      // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
      const bool valid = pages[q] >= 0;
      const unsigned char* src =
          valid ? kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kMlaDimQk + ld_chunk * 16 : kv;
      const u32 bytes = valid ? 16u : 0u;
#pragma unroll
      for (int blk = 0; blk < 4; ++blk) cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
      if (ld_chunk < 4) cp_async_16_addr(dst0 + 4 * 8192 + q * 2048, src + 4 * 128, bytes);
    }
    cp_async_mbar_arrive(sm.bar_raw_full + 8 * stage);
  };

  // Widening: thread (warp w, lane l) takes tokens 16 w + l % 8 and + 8, raw chunks l / 8 + 4 k
  // (k = 0..7) of V's 32; the 8 lanes of each quarter-warp read and write 8 different rows of one
  // chunk column, so both sides are conflict-free in the swizzle.
  const int wd_tok = 16 * warp + (lane & 7);
  const int wd_chunk = lane >> 3;
  auto widen = [&](u32 idx) {
    const u32 src0 = sm.raw + (idx & 1u) * kMlaWgFp8RawBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = wd_tok + 8 * h;
#pragma unroll 4
      for (int k = 0; k < 8; ++k) {
        const int c = wd_chunk + 4 * k;  // raw columns 16 c .. 16 c + 15
        U32x4 lo, hi;
        e4m3x16_to_f16(lds128(src0 + (c >> 3) * 8192 + sw128(t, c & 7)), lo, hi);
        const u32 dst = sm.v + (c >> 2) * 8192;  // f16 block of 64 columns
        sts128(dst + sw128(t, 2 * (c & 3)), lo);
        sts128(dst + sw128(t, 2 * (c & 3) + 1), hi);
      }
    }
  };

  const u32 idx0 = st.tiles;
  int pages[4];
  pages_of(0, pages);
  load_tile(0, pages, idx0);
  pages_of(1, pages);
  for (int j = 0; j < n_tiles; ++j) {
    const u32 idx = idx0 + j;
    if (j + 1 < n_tiles) {
      load_tile(j + 1, pages, idx + 1);
      pages_of(j + 2, pages);
    }
    mbar_wait(sm.bar_raw_full + 8 * (idx & 1u), (idx >> 1) & 1u);
    mbar_wait(sm.bar_v_empty, (idx & 1u) ^ 1u);
    widen(idx);
    // The stores went through the generic proxy; the consumers' wgmmas read them through the async one.
    fence_proxy_async_smem();
    mbar_arrive(sm.bar_v_full);
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.bar_raw_empty + 8 * (idx & 1u));
  }
  st.tiles = idx0 + n_tiles;
}

// The consumer warpgroups' share: slot < 0 writes `out`, else the partial O and LSE at `slot`.
template <int kHeads, int kMaxSeqLenQ, bool kCausal>
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
  const int q_len = piece.r.q_len;
  const int rows_b = q_len * kHeads;
  const int seq_len = piece.r.seq_len;
  const int t0 = piece.t0;
  const MlaWgFp8Smem sm(base);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  // Every thread is done with the previous piece's Q, stages, P and row sums.
  named_barrier_sync(1, kMlaWgFp8Threads);
  int t1;
  const int n_tiles = mla_wg_tiles<kHeads, kCausal>(piece, row0, t1);
  if (n_tiles > 0) {
    int lim_lo = 0x7fffffff, lim_hi = 0x7fffffff;
    if constexpr (kCausal) {
      lim_lo = seq_len - q_len + (row0 + r_lo) / kHeads;
      lim_hi = seq_len - q_len + (row0 + r_hi) / kHeads;
    }
    const float scale = p.scale_log2;
    // P stores: row r, tokens 32 wg + 8 n + 2 c4 (+1): chunk 4 wg + n of the 64-token row.
    const u32 p_row_lo = r_lo * 128 + 4 * c4;
    const u32 p_row_hi = r_hi * 128 + 4 * c4;
    const u64 dq = wgmma_desc_sw128(sm.q, 16, 1024);
    const u64 dp = wgmma_desc_sw128(sm.p, 16, 1024);
    const u64 dv = wgmma_desc_sw128(sm.v + wg * 4 * 8192, 8192, 1024);

    mbar_wait(sm.bar_q, st.pieces & 1u);
    ++st.pieces;

    for (int j = 0; j < n_tiles; ++j) {
      const u32 idx = st.tiles;
      const u32 stage = idx & 1u;
      mbar_wait(sm.bar_raw_full + 8 * stage, (idx >> 1) & 1u);
      // cp.async wrote Q and the tile through the generic proxy; wgmma reads them through the async one.
      fence_proxy_async_smem();
      const u64 dk = wgmma_desc_sw128(sm.raw + stage * kMlaWgFp8RawBytes + wg * 4096, 16, 1024);

      // ---- S = Q K^T for tokens [32 wg, 32 wg + 32): 16 k32 steps over blocks 0-3, 2 over block 4 ----
      float s[16];
      wgmma_fence();
#pragma unroll
      for (int kb = 0; kb < kMlaWgFp8Blocks; ++kb) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if (kb * 128 + ks * 32 < kMlaDimQk) {
            WgmmaE4m3<32>::ss(s, wgmma_desc_advance(dq, kb * 8192 + ks * 32), wgmma_desc_advance(dk, kb * 8192 + ks * 32),
                              kb + ks > 0);
          }
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(s);
      if (lane == 0) mbar_arrive(sm.bar_raw_empty + 8 * stage);

      // ---- mask, scale, row max across the two warpgroups ----
      float muse_lo, muse_hi, alpha_lo, alpha_hi;
      mla_wg_row_max<kCausal>(s, t0 + j * kMlaWgTileTokens + 32 * wg + 2 * c4, t1, lim_lo, lim_hi, scale, sm.red, wg,
                              r_lo, r_hi, c4, m_lo, m_hi, muse_lo, muse_hi, alpha_lo, alpha_hi);

      // ---- P = exp2(S - m) as f16 into the shared P tile ----
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float p0 = fast_exp2(s[4 * n + 0] - muse_lo);
        const float p1 = fast_exp2(s[4 * n + 1] - muse_lo);
        const float p2 = fast_exp2(s[4 * n + 2] - muse_hi);
        const float p3 = fast_exp2(s[4 * n + 3] - muse_hi);
        sum_lo += p0 + p1;
        sum_hi += p2 + p3;
        const u32 chunk = static_cast<u32>(4 * wg + n);
        sts32(sm.p + p_row_lo + ((chunk ^ static_cast<u32>(g)) << 4), pack_f16x2(p0, p1));
        sts32(sm.p + p_row_hi + ((chunk ^ static_cast<u32>(g)) << 4), pack_f16x2(p2, p3));
      }
      mla_wg_rescale(o, l_lo, l_hi, alpha_lo, alpha_hi, sum_lo, sum_hi);
      // P was written through the generic proxy; both warpgroups' wgmmas read it.
      fence_proxy_async_smem();
      named_barrier_sync(3, kMlaWgThreads);

      // ---- O += P V over this warpgroup's 256 columns, V widened by the producer ----
      mbar_wait(sm.bar_v_full, idx & 1u);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        WgmmaF16<256>::ss<1>(o, wgmma_desc_advance(dp, ks * 32), wgmma_desc_advance(dv, ks * 2048), true);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(o);
      if (lane == 0) mbar_arrive(sm.bar_v_empty);
      ++st.tiles;
    }
  }
  mla_wg_epilogue<kHeads, kMaxSeqLenQ>(p, o, m_lo, m_hi, l_lo, l_hi, sm.red, wg, c4, r_lo, r_hi, row0, rows_b,
                                       piece.r.tok0, slot);
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
