#pragma once
// Paged MLA decode on Hopper warpgroup MMAs (sm_90a), bf16 pages, either precision (one bf16 P, or
// with kSplitP P as bf16 hi + lo): the two warpgroups take alternate KV tiles, so one warpgroup's
// softmax runs while the other's MMAs keep the tensor cores busy.
//
// One CTA = 64 query rows of one part (Q layout, loads and epilogue from wgmma_common.cuh). KV tiles
// of 64 tokens come in pairs: tile 2k in stage 0, tile 2k + 1 in stage 1. Warpgroup w owns output
// columns [256 w, 256 w + 256) and computes S = Q K^T of the tile in stage w (36 m64n64k16, Q's RoPE
// columns from registers) and that tile's softmax. Per pair (with kSplitP P lo goes through the P
// area for both warpgroups, beside each P hi below):
//   warpgroup 0: S(2k) -> softmax against the running max (m -> m0), P(2k) as register A fragments
//     and into stage 0's RoPE block (dead once S(2k) retired) -> publishes m0 -> O_L *= 2^(m - m0),
//     O_L += P(2k) V_L from registers -> takes m1 -> O_L *= 2^(m0 - m1), O_L += P(2k+1) V_L with
//     P(2k+1) from stage 1's RoPE block.
//   warpgroup 1: S(2k+1) is issued before m0 is known -> takes m0, O_R *= 2^(m - m0), O_R +=
//     P(2k) V_R from stage 0's RoPE block -> softmax of S(2k+1) beside that MMA (m0 -> m1), P(2k+1)
//     to registers and stage 1's RoPE block -> publishes m1 -> O_R *= 2^(m0 - m1), O_R += P(2k+1)
//     V_R from registers.
// Each warpgroup keeps the row sums of its own tiles, scaled to the same running max; the
// epilogue adds them. Every O rescale happens with no wgmma of that warpgroup in flight (ptxas
// serializes the whole pipeline otherwise).
//
// Loads: each stage in two parts with a full mbarrier each, filled by the warpgroup that reads the
// part last (stage 0 columns 0-255, stage 1 columns 0-255 plus its RoPE block, which holds P(2k+1)
// for warpgroup 0: warpgroup 0; the rest: warpgroup 1) as soon as its last wgmma on it retired.
//   - With fixed query lengths and an even number of row tiles (mla_kv_tma_ctas 2), the row tiles run
//     in cluster pairs that share every KV tile: each CTA issues half of a part's 64 x 64 TMA boxes,
//     multicast into both, and a part is refilled only after both CTAs' readers released it (empty
//     mbarriers, one arrival per warp, local and remote). This halves the KV traffic out of L2.
//   - With a single row tile (mla_kv_tma_ctas 1) the CTA issues every box itself, and only its own
//     readers release a part.
//   - Otherwise every thread of the warpgroup copies its share with cp.async (zero-filling rows past
//     the piece).
// Pieces are whole pairs (128-token scheduler blocks); a request whose last block has one tile runs
// a masked second tile.
#include "common/cluster.cuh"
#include "common/mbarrier.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"
#include "mla_decode/wgmma_common.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

// Barriers: Q full, then per stage part (part p = the part warpgroup p fills) a full barrier and,
// with TMA loads, an empty one.
__device__ __forceinline__ u32 mla_seesaw_full(u32 bar_q, int stage, int part) { return bar_q + 8u * (1 + 2 * stage + part); }
__device__ __forceinline__ u32 mla_seesaw_empty(u32 bar_q, int stage, int part) { return bar_q + 8u * (5 + 2 * stage + part); }
// Warpgroup wg's zeroing of stale rows done (every thread of the warpgroup arrives).
__device__ __forceinline__ u32 mla_seesaw_zeroed(u32 bar_q, int wg) { return bar_q + 8u * (9 + wg); }

// The column blocks of a stage's part: warpgroup 0's are 0-3 (V_L), plus stage 1's RoPE block, which
// holds P(2k + 1) for warpgroup 0; warpgroup 1's are 4-7 (V_R), plus stage 0's RoPE block (P(2k)).
__device__ __forceinline__ bool mla_seesaw_part_has_rope(int stage, int part) { return stage != part; }

// Loads with cp.async, every thread of the warpgroup (MlaTileLoader's mapping), zero-filling rows past
// the piece; each thread's completions arrive on the part's full barrier.
template <int kPageSize>
struct MlaSeesawCpAsync {
  MlaTileLoader<kPageSize> tiles;
  u32 stage0, bar_q;
  int wg;
  int pages[4];

  __device__ __forceinline__ MlaSeesawCpAsync(const MlaTileLoader<kPageSize>& l, u32 s0, u32 bq, int w)
      : tiles(l), stage0(s0), bar_q(bq), wg(w) {}
  static constexpr u32 kFullCount = kMlaWgThreads / 2;

  __device__ __forceinline__ void prepare(int j) { tiles.pages_of(j, pages); }
  __device__ __forceinline__ void fill(int j, int stage) {
    const u32 dst0 = stage0 + stage * kMlaWgStageBytes + tiles.ld_dst;
    const bool rope = mla_seesaw_part_has_rope(stage, wg);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = tiles.t0 + j * kMlaWgTileTokens + 16 * q + tiles.ld_tok;
      // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
      const bool valid = pages[q] >= 0;
      const unsigned char* src =
          valid ? tiles.kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kMlaDimQk * 2 + tiles.ld_chunk * 16
                : tiles.kv;
      const u32 bytes = valid ? 16u : 0u;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int blk = 4 * wg + i;
        cp_async_16_addr(dst0 + blk * kMlaWgBlockBytes + q * kMlaWgMnStepBytes, src + blk * kMlaWgLineBytes, bytes);
      }
      if (rope) cp_async_16_addr(dst0 + 8 * kMlaWgBlockBytes + q * kMlaWgMnStepBytes, src + 8 * kMlaWgLineBytes, bytes);
    }
    cp_async_mbar_arrive(mla_seesaw_full(bar_q, stage, wg));
  }
  __device__ __forceinline__ void prefetch(int) {}
  __device__ __forceinline__ void release(int) {}
  // Rows of tile j that hold stale data after the fill: none (zero-filled).
  __device__ __forceinline__ int stale_from(int) const { return kMlaWgTileTokens; }
};

// Loads with TMA, one thread per warpgroup issuing. kCtas 2: into both CTAs of a cluster pair, each
// CTA issuing half of a part's column blocks, multicast, and every part has an empty barrier that
// both CTAs' readers release (one arrival per warp, local and remote), so neither CTA overwrites a
// part its peer still reads. kCtas 1: the CTA issues every block and only its own warps release.
// Boxes past the piece read a page coordinate past the map (zeros); rows past the piece inside a
// live page are stale and are zeroed by the tile's S warpgroup (stale_from). kPrefetch: see prefetch.
template <int kPageSize, int kCtas, bool kPrefetch>
struct MlaSeesawTma {
  static_assert(kCtas == 1 || kCtas == 2, "a CTA alone or a cluster pair");
  static constexpr int kBoxTokens = kPageSize < kMlaWgTileTokens ? kPageSize : kMlaWgTileTokens;
  static constexpr int kBoxes = kMlaWgTileTokens / kBoxTokens;  // per column block
  static constexpr u32 kFullCount = 1;
  static constexpr u32 kEmptyCount = kCtas * kMlaWgThreads / 2 / 32;  // the part's warps, in every CTA

  const MlaDecodeParams* p;
  const int* bt_row;
  int t0, t1;
  u32 stage0, bar_q;
  int wg, wt, warp, lane;
  u32 rank;
  u32 fills;  // fills of each part before this piece (every part is filled once per pair)
  int pages[kBoxes];

  __device__ __forceinline__ MlaSeesawTma(const MlaDecodeParams& params, const int* bt, int first, int end, u32 s0,
                                          u32 bq, int w, int t, u32 fills_before)
      : p(&params), bt_row(bt), t0(first), t1(end), stage0(s0), bar_q(bq), wg(w), wt(t), warp(t >> 5), lane(t & 31),
        rank(kCtas == 2 ? cluster_rank() : 0u), fills(fills_before) {}

  __device__ __forceinline__ void prepare(int j) {
    if (warp != 0) return;  // lane 0 issues; the warp keeps the pages so that it stays converged
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      const int t = t0 + j * kMlaWgTileTokens + b * kBoxTokens;
      pages[b] = t < t1 ? __ldg(bt_row + t / kPageSize) : p->kv_pages;
    }
  }
  __device__ __forceinline__ void fill(int j, int stage) {
    if (warp != 0) return;
    // Fill f waits for both CTAs' release of fill f - 1 (a fresh barrier passes parity 1 at once);
    // the whole warp waits, so it stays converged for the barriers that follow.
    const u32 f = fills + static_cast<u32>(j / 2);
    mbar_wait(mla_seesaw_empty(bar_q, stage, wg), (f + 1u) & 1u);
    if (lane == 0) {
      const bool rope = mla_seesaw_part_has_rope(stage, wg);
      const u32 full = mla_seesaw_full(bar_q, stage, wg);
      mbar_arrive_expect_tx(full, (rope ? 5u : 4u) * kMlaWgTileTokens * u32(kMlaWgLineBytes));
      const u32 dst0 = stage0 + stage * kMlaWgStageBytes;
      // The tile's first token's place in its page (boxes of smaller pages start on a page).
      const int tok = kPageSize <= kMlaWgTileTokens ? 0 : (t0 + j * kMlaWgTileTokens) % kPageSize;
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        const int blk = i < 4 ? 4 * wg + i : 8;
        if ((i < 4 || rope) && (kCtas == 1 || (i & 1) == static_cast<int>(rank))) {
#pragma unroll
          for (int b = 0; b < kBoxes; ++b) {
            const u32 dst = dst0 + blk * kMlaWgBlockBytes + b * kBoxTokens * kMlaWgLineBytes;
            if constexpr (kCtas == 1) tma_load_3d(dst, &p->kv_map, blk * 64, tok, pages[b], full);
            else tma_load_3d_multicast(dst, &p->kv_map, blk * 64, tok, pages[b], full, 0x3);
          }
        }
      }
    }
    __syncwarp();
  }
  // Asks L2 for tile j's token rows a pair ahead of its fill: the fill of stage 1 is issued after the
  // pair's last P V and S(2k + 1) of the next pair waits for it, so it should not wait for DRAM. A CTA
  // alone asks once (warpgroup 0), and only with P as hi + lo: with one bf16 P its long memory-bound
  // 64-row configs ran up to 6% slower with the prefetch than without (NOTES.md).
  __device__ __forceinline__ void prefetch(int j) {
    if constexpr (!kPrefetch) return;
    if (wt != 0 || rank != 0 || (kCtas == 1 && wg != 0)) return;
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      const int t = t0 + j * kMlaWgTileTokens + b * kBoxTokens;
      if (t < t1) {
        const long long row = static_cast<long long>(__ldg(bt_row + t / kPageSize)) * kPageSize + t % kPageSize;
        const unsigned char* src = static_cast<const unsigned char*>(p->kv) + row * kMlaDimQk * 2;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "n"(kBoxTokens * kMlaDimQk * 2) : "memory");
      }
    }
  }
  __device__ __forceinline__ void release(int stage) {
    if (lane == 0) {
      const u32 empty = mla_seesaw_empty(bar_q, stage, wg);
      mbar_arrive(empty);
      if constexpr (kCtas == 2) mbar_arrive_remote(peer_addr(empty, rank ^ 1u));
    }
  }
  __device__ __forceinline__ int stale_from(int j) const {
    const int n = t1 - (t0 + j * kMlaWgTileTokens);
    return n <= 0 ? kMlaWgTileTokens : n;  // a tile past the piece is all zeros
  }
};

// S = Q K^T over the whole 64-token tile in the stage at `k_smem`, once both of its parts landed.
// Rows from `stale` on hold data past the piece (TMA reads whole pages): they are zeroed first,
// since P V multiplies them by P = 0 and 0 * NaN would be NaN. Issued and committed, not waited for.
__device__ __forceinline__ void mla_seesaw_scores(float (&s)[32], u64 dq, u32 k_smem, u32 bar_a, u32 bar_b, u32 phase,
                                                  const u32 (&q_rope)[4][4], int stale, u32 bar_zeroed, u32& zeroings,
                                                  int wt) {
  if (stale < kMlaWgTileTokens) {  // uniform: at most the last tile of a piece
    mbar_wait(bar_a, phase);
    mbar_wait(bar_b, phase);
    // V's 8 column blocks: rows [stale, 64) x 8 chunks each; the RoPE block becomes P.
    for (int i = wt; i < 8 * (kMlaWgTileTokens - stale) * 8; i += kMlaWgThreads / 2) {
      const int blk = i / ((kMlaWgTileTokens - stale) * 8);
      const int rc = i % ((kMlaWgTileTokens - stale) * 8);
      sts128(k_smem + blk * kMlaWgBlockBytes + (stale + rc / 8) * kMlaWgLineBytes + (rc % 8) * 16, U32x4{0u, 0u, 0u, 0u});
    }
    // The zeros go to the async proxy (wgmma), and the whole warpgroup's before any of its wgmmas.
    fence_proxy_async_smem();
    mbar_arrive(bar_zeroed);
    mbar_wait(bar_zeroed, zeroings & 1u);
    ++zeroings;
  }
  const u64 dk = wgmma_desc_sw128(k_smem, 16, kMlaWgSbo);
  mbar_wait(bar_a, phase);
  // The tile was written through the generic (cp.async) or async (TMA) proxy; wgmma reads it
  // through the async proxy.
  fence_proxy_async_smem();
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const u32 off = kb * kMlaWgBlockBytes + ks * kMlaWgKStepBytes;
      WgmmaBf16<64>::ss<0>(s, wgmma_desc_advance(dq, off), wgmma_desc_advance(dk, off), kb + ks > 0);
    }
  }
  mbar_wait(bar_b, phase);
  fence_proxy_async_smem();
  wgmma_fence();  // the wait's loop ends the batch for ptxas: a fresh fence keeps the wgmmas pipelined
#pragma unroll
  for (int kb = 4; kb < 8; ++kb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const u32 off = kb * kMlaWgBlockBytes + ks * kMlaWgKStepBytes;
      WgmmaBf16<64>::ss<0>(s, wgmma_desc_advance(dq, off), wgmma_desc_advance(dk, off), true);
    }
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    WgmmaBf16<64>::rs<0>(s, q_rope[ks], wgmma_desc_advance(dk, kMlaWgRopeOffset + ks * kMlaWgKStepBytes), true);
  }
  wgmma_commit();
}

// P = exp2(S - m_use) rounded to bf16 (hi): as register A fragments of P V (k-step ks = tokens
// 16 ks .. 16 ks + 15) and into the 64 x 64 K-major swizzled tile at `p_smem` for the other
// warpgroup; with kSplitP also lo = P - hi into the same place of the tile at `lo_smem`, which both
// warpgroups read from shared memory. Returns the rows' sums of the unrounded P.
template <bool kSplitP>
__device__ __forceinline__ void mla_seesaw_p(const float (&s)[32], float muse_lo, float muse_hi, u32 (&pa)[4][4],
                                             u32 p_smem, u32 lo_smem, u32 p_row_lo, u32 p_row_hi, int g,
                                             float& sum_lo, float& sum_hi) {
  sum_lo = 0.f;
  sum_hi = 0.f;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float p0 = fast_exp2(s[4 * n + 0] - muse_lo);
    const float p1 = fast_exp2(s[4 * n + 1] - muse_lo);
    const float p2 = fast_exp2(s[4 * n + 2] - muse_hi);
    const float p3 = fast_exp2(s[4 * n + 3] - muse_hi);
    sum_lo += p0 + p1;
    sum_hi += p2 + p3;
    const u32 h01 = pack_bf16x2(p0, p1);
    const u32 h23 = pack_bf16x2(p2, p3);
    pa[n >> 1][2 * (n & 1)] = h01;
    pa[n >> 1][2 * (n & 1) + 1] = h23;
    const u32 chunk = static_cast<u32>(n) ^ static_cast<u32>(g);
    sts32(p_smem + p_row_lo + (chunk << 4), h01);
    sts32(p_smem + p_row_hi + (chunk << 4), h23);
    if constexpr (kSplitP) {
      sts32(lo_smem + p_row_lo + (chunk << 4), pack_bf16x2(p0 - bf16x2_lo(h01), p1 - bf16x2_hi(h01)));
      sts32(lo_smem + p_row_hi + (chunk << 4), pack_bf16x2(p2 - bf16x2_lo(h23), p3 - bf16x2_hi(h23)));
    }
  }
}

// The softmax of this warpgroup's own tile: mask and scale S, move the running max (m_lo, m_hi) over
// it, P into registers and the shared tiles (mla_seesaw_p), and publish the new max at `slot` for
// the other warpgroup. step_lo / step_hi get the rows' factors for O and l, sum_lo / sum_hi P's row
// sums.
template <bool kSplitP>
__device__ __forceinline__ void mla_seesaw_softmax(float (&s)[32], int tok_base, int last_lo, int last_hi, float scale,
                                                   float& m_lo, float& m_hi, u32 (&pa)[4][4], u32 p_smem, u32 lo_smem,
                                                   u32 p_row_lo, u32 p_row_hi, int g, int c4, int r_lo, int r_hi, u32 slot,
                                                   OnlineSoftmaxStep& step_lo, OnlineSoftmaxStep& step_hi, float& sum_lo,
                                                   float& sum_hi) {
  float mx_lo, mx_hi;
  mla_wg_mask_max(s, tok_base, last_lo, last_hi, scale, mx_lo, mx_hi);
  step_lo = online_softmax_step(m_lo, mx_lo);
  step_hi = online_softmax_step(m_hi, mx_hi);
  mla_seesaw_p<kSplitP>(s, step_lo.m_use, step_hi.m_use, pa, p_smem, lo_smem, p_row_lo, p_row_hi, g, sum_lo, sum_hi);
  if (c4 == 0) {
    sts_f32(slot + r_lo * 4, m_lo);
    sts_f32(slot + r_hi * 4, m_hi);
  }
  // P was written through the generic proxy; the other warpgroup's wgmmas read it.
  fence_proxy_async_smem();
}

// O += P V over this warpgroup's 256 columns, P hi from registers (and with kSplitP lo from the
// tile `dp_lo`). Issued and committed.
template <bool kSplitP>
__device__ __forceinline__ void mla_seesaw_pv_rs(float (&o)[128], const u32 (&pa)[4][4], u64 dp_lo, u64 dv) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const u64 dvk = wgmma_desc_advance(dv, ks * kMlaWgMnStepBytes);
    WgmmaBf16<256>::rs<1>(o, pa[ks], dvk, true);
    if constexpr (kSplitP) WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dp_lo, ks * kMlaWgKStepBytes), dvk, true);
  }
  wgmma_commit();
}

// O += P V with the other warpgroup's P (hi, and with kSplitP lo) from shared memory. Issued and
// committed.
template <bool kSplitP>
__device__ __forceinline__ void mla_seesaw_pv_ss(float (&o)[128], u64 dp, u64 dp_lo, u64 dv) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const u64 dvk = wgmma_desc_advance(dv, ks * kMlaWgMnStepBytes);
    WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dp, ks * kMlaWgKStepBytes), dvk, true);
    if constexpr (kSplitP) WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dp_lo, ks * kMlaWgKStepBytes), dvk, true);
  }
  wgmma_commit();
}

// The max published by the other warpgroup, which already includes this warpgroup's m: one online
// step to it gives the factor for this warpgroup's O and l, and m = the published max.
__device__ __forceinline__ void mla_seesaw_take_max(u32 slot, int r_lo, int r_hi, float& m_lo, float& m_hi,
                                                    float& alpha_lo, float& alpha_hi) {
  alpha_lo = online_softmax_step(m_lo, lds_f32(slot + r_lo * 4)).alpha;
  alpha_hi = online_softmax_step(m_hi, lds_f32(slot + r_hi * 4)).alpha;
}

template <int kTmaCtas, int kPageSize, bool kSplitP>
struct MlaSeesawLoads {
  using type = MlaSeesawTma<kPageSize, kTmaCtas, kTmaCtas == 2 || kSplitP>;
};
template <int kPageSize, bool kSplitP>
struct MlaSeesawLoads<0, kPageSize, kSplitP> {
  using type = MlaSeesawCpAsync<kPageSize>;
};

template <int kTmaCtas>
__device__ __forceinline__ void mla_seesaw_init_barriers(u32 base) {
  constexpr bool kTma = kTmaCtas > 0;
  using Tma = MlaSeesawTma<64, kTma ? kTmaCtas : 1, true>;
  const u32 bar_q = base + kMlaWgBarOffset;
  // Q: every thread of both warpgroups arrives once per fill (cp.async).
  mbar_init(bar_q, kMlaWgThreads);
  for (int stage = 0; stage < kMlaWgStages; ++stage) {
    for (int part = 0; part < 2; ++part) {
      mbar_init(mla_seesaw_full(bar_q, stage, part), kTma ? Tma::kFullCount : MlaSeesawCpAsync<64>::kFullCount);
      if (kTma) mbar_init(mla_seesaw_empty(bar_q, stage, part), Tma::kEmptyCount);
    }
  }
  if (kTma) {
    for (int wg = 0; wg < 2; ++wg) mbar_init(mla_seesaw_zeroed(bar_q, wg), kMlaWgThreads / 2);
  }
  mbar_fence_init();
}

// Rows [row0, row0 + 64) of `piece`; slot < 0: write `out`, else the partial O and LSE at `slot`.
// kTmaCtas: 0 loads with cp.async, 1 with TMA, 2 with TMA in a cluster pair (row tiles 2c and 2c + 1)
// that shares every KV tile.
template <int kPageSize, int kTmaCtas, bool kSplitP>
__device__ __forceinline__ void mla_seesaw_piece(const MlaDecodeParams& p, u32 base, const MlaPiece& piece, int row0,
                                                 int slot, MlaWgState& st) {
  constexpr int kRowBytes = kMlaDimQk * 2;
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int wt = tid & 127;
  const int warp = wt >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c4 = lane & 3;
  const int r_lo = 16 * warp + g;
  const int r_hi = r_lo + 8;

  // A cluster pair walks the same tiles: with the causal mask both cut the range where the pair's last row does.
  constexpr int kPairRows = kMlaKvTmaCluster * kMlaWgRows;
  const MlaPieceRows pv = kTmaCtas == 2
                              ? mla_piece_rows<kPairRows, kMlaWgTileTokens>(p, piece, row0 - row0 % kPairRows)
                              : mla_piece_rows<kMlaWgRows, kMlaWgTileTokens>(p, piece, row0);
  const int n_pairs = (pv.n_tiles + 1) / 2;

  const u32 q_smem = base + kMlaWgQOffset;
  const u32 stage0 = base + kMlaWgStageOffset;
  const u32 stage1 = stage0 + kMlaWgStageBytes;
  // The max exchanges (m0: warpgroup 0 -> 1, then m1: 1 -> 0, [64 rows] fp32 each).
  const u32 m_slot0 = base + kMlaWgExchangeOffset;
  const u32 m_slot1 = m_slot0 + kMlaWgRows * 4;
  const u32 red = base + kMlaWgRedOffset;
  const u32 bar_q = base + kMlaWgBarOffset;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  // Every thread of both warpgroups is done with the previous piece's Q, stages and row sums.
  named_barrier_sync(kMlaBarPiece, kMlaWgThreads);
  if (n_pairs > 0) {
    const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(pv.b) * p.block_table_stride;
    const unsigned char* q_rows =
        static_cast<const unsigned char*>(p.q) + (static_cast<long long>(pv.tok0) * p.heads + row0) * kRowBytes;
    using Loads = typename MlaSeesawLoads<kTmaCtas, kPageSize, kSplitP>::type;
    Loads loads = [&]() {
      if constexpr (kTmaCtas > 0) {
        return Loads(p, bt_row, pv.t0, pv.t1, stage0, bar_q, wg, wt, st.tiles);
      } else {
        return Loads(MlaTileLoader<kPageSize>(p.kv, bt_row, pv.t0, pv.t1, pv.n_tiles, warp, lane), stage0, bar_q, wg);
      }
    }();

    mla_wg_load_q(q_smem, q_rows, row0, pv.rows_b, wg, wt, bar_q);
    loads.prepare(0);
    loads.fill(0, 0);
    loads.prepare(1);

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

    const int last_lo = mla_row_last(p, pv, row0 + r_lo);
    const int last_hi = mla_row_last(p, pv, row0 + r_hi);
    const float scale = p.scale_log2;
    const u32 p_row_lo = r_lo * kMlaWgLineBytes + 4 * c4;
    const u32 p_row_hi = r_hi * kMlaWgLineBytes + 4 * c4;
    const u64 dq = wgmma_desc_sw128(q_smem, 16, kMlaWgSbo);
    // P of a stage's tile lives in that stage's RoPE block once its S retired.
    const u32 own_stage = wg ? stage1 : stage0;
    const u32 other_stage = wg ? stage0 : stage1;
    const u32 own_p = own_stage + kMlaWgRopeOffset;
    const u64 dp_other = wgmma_desc_sw128(other_stage + kMlaWgRopeOffset, 16, kMlaWgSbo);
    // P lo of the tile in stage s (kSplitP): the P area's tile s. Rewritten only after S of the
    // stage's next tile, which waits for the refill that the tile's last P V released.
    const u32 own_lo = base + kMlaWgPOffset + wg * kMlaWgPBytes;
    const u64 dlo_own = wgmma_desc_sw128(own_lo, 16, kMlaWgSbo);
    const u64 dlo_other = wgmma_desc_sw128(base + kMlaWgPOffset + (wg ^ 1) * kMlaWgPBytes, 16, kMlaWgSbo);
    // V over this warpgroup's columns, of its own tile and of the other warpgroup's tile.
    const u64 dv_own = wgmma_desc_sw128(own_stage + wg * 4 * kMlaWgBlockBytes, kMlaWgBlockBytes, kMlaWgSbo);
    const u64 dv_other = wgmma_desc_sw128(other_stage + wg * 4 * kMlaWgBlockBytes, kMlaWgBlockBytes, kMlaWgSbo);

    mbar_wait(bar_q, st.pieces & 1);
    ++st.pieces;
    // Stage 1 only once Q has landed: every CTA starts a piece at once, and S of tile 0 waits for Q
    // and tile 0 alone, so those should not share DRAM with tile 1.
    loads.fill(1, 1);

    // One loop per warpgroup: every wgmma wait stays out of divergent code, which ptxas would
    // answer by serializing the wgmmas. Each part is released after its last read and refilled with
    // the next pair's tile.
    // In a cluster pair the refill of stage 0 first waits for the peer CTA's release of the part:
    // issued before this warpgroup's next P V, that wait and the TMA issue held warp 0, and with it
    // the P V batch, back; issued behind the batch they overlap it. A CTA alone waits only for its
    // own warps, and there the later refill measured faster only in warpgroup 0 with P as hi + lo
    // (NOTES.md).
    constexpr bool kRefillBehindPv0 = kTmaCtas == 2 || (kTmaCtas == 1 && kSplitP);
    constexpr bool kRefillBehindPv1 = kTmaCtas == 2;
    u32 pa[4][4];
    float s[32];
    float sum_lo, sum_hi, a_lo, a_hi;
    OnlineSoftmaxStep step_lo, step_hi;
    if (wg == 0) {
      for (int k = 0; k < n_pairs; ++k) {
        const bool refill = k + 1 < n_pairs;
        mla_seesaw_scores(s, dq, stage0, mla_seesaw_full(bar_q, 0, 0), mla_seesaw_full(bar_q, 0, 1),
                          (st.tiles + static_cast<u32>(k)) & 1u, q_rope, loads.stale_from(2 * k),
                          mla_seesaw_zeroed(bar_q, 0), st.zeroings, wt);
        loads.prefetch(2 * k + 2);
        loads.prepare(2 * k + 2);  // the refill's block-table reads, off the issue path
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        mla_seesaw_softmax<kSplitP>(s, pv.t0 + 2 * k * kMlaWgTileTokens + 2 * c4, last_lo, last_hi, scale, m_lo, m_hi,
                                    pa, own_p, own_lo, p_row_lo, p_row_hi, g, c4, r_lo, r_hi, m_slot0, step_lo, step_hi,
                                    sum_lo, sum_hi);
        named_barrier_sync(kMlaBarSeesawM0, kMlaWgThreads);
        mla_wg_rescale(o, l_lo, l_hi, step_lo.alpha, step_hi.alpha, sum_lo, sum_hi);
        mla_seesaw_pv_rs<kSplitP>(o, pa, dlo_own, dv_own);
        named_barrier_sync(kMlaBarSeesawM1, kMlaWgThreads);
        mla_seesaw_take_max(m_slot1, r_lo, r_hi, m_lo, m_hi, a_lo, a_hi);
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        loads.release(0);
        if constexpr (!kRefillBehindPv0) {
          if (refill) loads.fill(2 * k + 2, 0);
          loads.prepare(2 * k + 3);
        }
        mla_wg_rescale(o, l_lo, l_hi, a_lo, a_hi, 0.f, 0.f);
        mla_seesaw_pv_ss<kSplitP>(o, dp_other, dlo_other, dv_other);
        if constexpr (kRefillBehindPv0) {
          if (refill) loads.fill(2 * k + 2, 0);
          loads.prepare(2 * k + 3);
        }
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        loads.release(1);
        if (refill) loads.fill(2 * k + 3, 1);
      }
    } else {
      for (int k = 0; k < n_pairs; ++k) {
        const bool refill = k + 1 < n_pairs;
        mla_seesaw_scores(s, dq, stage1, mla_seesaw_full(bar_q, 1, 0), mla_seesaw_full(bar_q, 1, 1),
                          (st.tiles + static_cast<u32>(k)) & 1u, q_rope, loads.stale_from(2 * k + 1),
                          mla_seesaw_zeroed(bar_q, 1), st.zeroings, wt);
        loads.prefetch(2 * k + 3);
        loads.prepare(2 * k + 2);
        named_barrier_sync(kMlaBarSeesawM0, kMlaWgThreads);
        mla_seesaw_take_max(m_slot0, r_lo, r_hi, m_lo, m_hi, a_lo, a_hi);
        // S(2k + 1) retires before O is touched: no wgmma of this warpgroup is in flight then.
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        mla_wg_rescale(o, l_lo, l_hi, a_lo, a_hi, 0.f, 0.f);
        mla_seesaw_pv_ss<kSplitP>(o, dp_other, dlo_other, dv_other);
        mla_seesaw_softmax<kSplitP>(s, pv.t0 + (2 * k + 1) * kMlaWgTileTokens + 2 * c4, last_lo, last_hi, scale, m_lo,
                                    m_hi, pa, own_p, own_lo, p_row_lo, p_row_hi, g, c4, r_lo, r_hi, m_slot1, step_lo,
                                    step_hi, sum_lo, sum_hi);
        named_barrier_sync(kMlaBarSeesawM1, kMlaWgThreads);
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        loads.release(0);
        if constexpr (!kRefillBehindPv1) {
          if (refill) loads.fill(2 * k + 2, 0);
          loads.prepare(2 * k + 3);
        }
        mla_wg_rescale(o, l_lo, l_hi, step_lo.alpha, step_hi.alpha, sum_lo, sum_hi);
        mla_seesaw_pv_rs<kSplitP>(o, pa, dlo_own, dv_own);
        if constexpr (kRefillBehindPv1) {
          if (refill) loads.fill(2 * k + 2, 0);
          loads.prepare(2 * k + 3);
        }
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        loads.release(1);
        if (refill) loads.fill(2 * k + 3, 1);
      }
    }
    st.tiles += static_cast<u32>(n_pairs);
  }

  mla_wg_epilogue(p, o, m_lo, m_hi, l_lo, l_hi, red, wg, c4, r_lo, r_hi, row0, pv.rows_b, pv.tok0, slot);
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
