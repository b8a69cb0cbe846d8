#pragma once
// Paged MLA decode on Hopper warpgroup MMAs (sm_90a), one piece at a time (schedule.cuh).
//
// One CTA = 64 query rows (row = i * H + h) of one part; two warpgroups, each owning output columns
// [256 w, 256 w + 256) of the 64 x 512 fp32 accumulator. KV tiles of 64 tokens come in pairs: tile
// 2k in stage 0, tile 2k + 1 in stage 1. Warpgroup w computes S = Q K^T of the tile in stage w (36
// m64n64k16: Q's 512 latent columns from shared memory, its 64 RoPE columns from registers) and that
// tile's softmax, then the two meet once per tile in a seesaw, so that one warpgroup's softmax always
// runs beside the other's MMAs:
//   warpgroup 0: S(2k); softmax with the running max m -> m0; publishes m0 and P(2k); O_L += P V_L
//     from registers; after m1 arrives: O_L *= 2^(m0 - m1), O_L += P(2k+1) V_L from shared memory.
//   warpgroup 1: S(2k+1) (issued before m0 is known); after m0: O_R *= 2^(m - m0), O_R += P(2k) V_R
//     from shared memory; softmax of S(2k+1) with m0 -> m1 beside that; publishes m1 and P(2k+1);
//     O_R *= 2^(m0 - m1), O_R += P V_R from registers.
// P = exp2(S - m) is kept as bf16 hi + lo (P - hi): a single bf16 P misses the contract's 1e-2 /
// 5e-4 tolerances. A tile's P hi lives in its stage's RoPE block (only that stage's S read it), its
// P lo in a buffer per stage. V is the same shared K tile read MN-major: never loaded twice.
// Loads are cp.async into 128-byte-swizzled tiles (any page size works; zero-fill past the range).
// Each stage is filled in two parts, each by the warpgroup whose P V reads it last (warpgroup 0:
// columns 0-255, plus the RoPE block of stage 1, which holds P hi read by warpgroup 0; warpgroup 1:
// columns 256-511 plus stage 0's RoPE block), each completing its own mbarrier, and S starts with
// the part that was freed first. A refill is issued as soon as the loader's last wgmma on those
// columns retires.
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

// Per-CTA pipeline counters, identical in every thread.
struct MlaWgState {
  u32 fills0;  // tiles consumed from stage 0 so far: its barriers' phase is fills0 % 2
  u32 fills1;  // the same for stage 1
  u32 pieces;  // pieces with a Q load so far: the Q barrier's phase
};

// Rows [row0, row0 + 64) of `piece`; slot < 0: write `out`, else the partial O and LSE at `slot`.
// `base`: the 1024-byte-aligned shared-memory base.
template <int kHeads, int kPageSize, int kMaxSeqLenQ, bool kCausal>
__device__ __forceinline__ void mla_wgmma_piece(const MlaDecodeParams& p, u32 base, const MlaPiece& piece, int row0,
                                                int slot, MlaWgState& st) {
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
  constexpr int kRowBytes = kMlaDimQk * 2;
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  // Named barriers (both warpgroups bar.sync): 1 = piece start, 2 = m0 and P(2k) published
  // (warpgroup 0 -> 1), 3 = m1 and P(2k + 1) published (1 -> 0), 4 = row sums exchanged, 5 = P V_R
  // of tile 2k + 1 issued before P V_L: stage 1's columns 256-511 are then freed a P V earlier,
  // which lengthens their refill window (the shortest of the pair).
  constexpr u32 kBarStart = 1, kBarM0 = 2, kBarM1 = 3, kBarSum = 4, kBarPv = 5;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // warpgroup: output columns [256 wg, 256 wg + 256), S of stage wg
  const int wt = tid & 127;
  const int warp = wt >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c4 = lane & 3;
  const int r_lo = 16 * warp + g;  // tile rows of this thread: r_lo and r_lo + 8
  const int r_hi = r_lo + 8;

  const int b = piece.b;
  const int tok0 = piece.r.tok0;
  const int q_len = piece.r.q_len;
  const int rows_b = q_len * kHeads;
  const int seq_len = piece.r.seq_len;
  const int t0 = piece.t0;
  int t1 = piece.t1;
  if constexpr (kCausal) {
    const int last_row = (row0 + kMlaWgRows < rows_b ? row0 + kMlaWgRows : rows_b) - 1;
    const int vis_end = seq_len - q_len + last_row / kHeads + 1;
    if (vis_end < t1) t1 = vis_end > t0 ? vis_end : t0;
  }
  const int n_tiles = (t1 - t0 + kMlaWgTileTokens - 1) / kMlaWgTileTokens;
  const int n_pairs = (n_tiles + 1) / 2;

  const u32 q_smem = base + kMlaWgQOffset;
  const u32 stage0 = base + kMlaWgStageOffset;
  const u32 stage1 = stage0 + kMlaWgStageBytes;
  const u32 p_lo0 = base + kMlaWgPOffset;  // P lo of stage 0's tile, then stage 1's
  const u32 p_lo1 = p_lo0 + kMlaWgPBytes;
  const u32 red = base + kMlaWgRedOffset;  // [slot][warpgroup][64 rows] fp32: row max, then row sums
  const u32 bar_q = base + kMlaWgBarOffset;
  const u32 bar_full = bar_q + 8;  // + 8 * (2 * stage + loading warpgroup)

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  // Every thread of both warpgroups is done with the previous piece's Q, stages, P and row sums.
  named_barrier_sync(kBarStart, kMlaWgThreads);
  if (n_tiles > 0) {
    const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
    const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(b) * p.block_table_stride;
    const unsigned char* q_rows =
        static_cast<const unsigned char*>(p.q) + (static_cast<long long>(tok0) * kHeads + row0) * kRowBytes;

    // Each warp instruction copies 4 token rows x 8 chunks (one 128-byte swizzled row of one 64-column
    // block each): conflict-free shared stores and 128-byte global segments. Thread (warp w, lane l)
    // owns tokens 16 q + 4 w + l / 8 (q = 0..3) and chunk l % 8 of each column block of its part.
    const int ld_tok = 4 * warp + (lane >> 3);  // + 16 q
    const int ld_chunk = lane & 7;
    const u32 ld_dst = static_cast<u32>(ld_tok * 128 + ((ld_chunk ^ (ld_tok & 7)) << 4));
    auto pages_of = [&](int j, int (&pages)[4]) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
        pages[q] = j < n_tiles && t < t1 ? __ldg(bt_row + t / kPageSize) : -1;  // -1: zero-filled
      }
    };
    // This warpgroup's part of tile j into stage j % 2: column blocks 4 wg .. 4 wg + 3, and the RoPE
    // block when the other warpgroup owns the stage's S.
    auto load_part = [&](int j, const int (&pages)[4]) {
      const int stage = j & 1;
      const u32 dst0 = (stage ? stage1 : stage0) + ld_dst;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
        // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
        const bool valid = pages[q] >= 0;
        const unsigned char* src =
            valid ? kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kRowBytes + ld_chunk * 16 : kv;
        const u32 bytes = valid ? 16u : 0u;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int blk = 4 * wg + i;
          cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
        }
        if (stage != wg) cp_async_16_addr(dst0 + 8 * 8192 + q * 2048, src + 8 * 128, bytes);
      }
      cp_async_mbar_arrive(bar_full + 8 * (2 * stage + wg));
    };

    // Q: 64 rows x 512 latent columns, warpgroup wg loads columns [256 wg, 256 wg + 256).
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
    {
      int pages[4];
      pages_of(0, pages);
      load_part(0, pages);
      if (n_tiles > 1) {
        pages_of(1, pages);
        load_part(1, pages);
      }
    }

    // Q's RoPE columns as register A fragments (k-steps 0..3 of the last 64 columns), read again
    // (L1-resident) for each S rather than held: the 64 x 512 accumulator leaves no registers to spare.
    const bool q_valid_lo = row0 + r_lo < rows_b, q_valid_hi = row0 + r_hi < rows_b;
    auto load_q_rope = [&](u32 (&q_rope)[4][4]) {
      const unsigned char* q_lo = q_rows + r_lo * kRowBytes + (kMlaDimV + 2 * c4) * 2;
      const unsigned char* q_hi = q_rows + r_hi * kRowBytes + (kMlaDimV + 2 * c4) * 2;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        q_rope[ks][0] = ld_u32_if(q_lo + ks * 32, q_valid_lo);
        q_rope[ks][1] = ld_u32_if(q_hi + ks * 32, q_valid_hi);
        q_rope[ks][2] = ld_u32_if(q_lo + ks * 32 + 16, q_valid_lo);
        q_rope[ks][3] = ld_u32_if(q_hi + ks * 32 + 16, q_valid_hi);
      }
    };

    const float scale = p.scale_log2;
    // P stores: row r, tokens 8 n + 2 c4 (+1): chunk n of the 64-token row.
    const u32 p_row_lo = r_lo * 128 + 4 * c4;
    const u32 p_row_hi = r_hi * 128 + 4 * c4;

    const u64 dq = wgmma_desc_sw128(q_smem, 16, 1024);
    // This warpgroup's S operand (its own stage).
    const u64 dk = wgmma_desc_sw128(wg ? stage1 : stage0, 16, 1024);
    // V over this warpgroup's output columns: of the tile whose P it holds in registers (its own
    // stage), and of the other tile.
    const u64 dv_reg = wgmma_desc_sw128((wg ? stage1 : stage0) + wg * 4 * 8192, 8192, 1024);
    const u64 dv_smem = wgmma_desc_sw128((wg ? stage0 : stage1) + wg * 4 * 8192, 8192, 1024);
    // The other warpgroup's P, read from shared memory: hi in its stage's RoPE block, then lo.
    const u64 dph = wgmma_desc_sw128((wg ? stage0 : stage1) + kMlaWgRopeOffset, 16, 1024);
    const u64 dpl = wgmma_desc_sw128(wg ? p_lo0 : p_lo1, 16, 1024);
    const u32 own_p_hi = (wg ? stage1 : stage0) + kMlaWgRopeOffset;
    const u32 own_p_lo = wg ? p_lo1 : p_lo0;

    // S over the column blocks [kb0, kb0 + 4) of this warpgroup's stage, after their part landed.
    auto s_blocks = [&](float (&s)[32], int kb0, u32 bar, u32 phase, bool first) {
      mbar_wait(bar, phase);
      // cp.async wrote the part through the generic proxy; wgmma reads it through the async proxy.
      fence_proxy_async_smem();
      wgmma_fence();
#pragma unroll
      for (int kb = kb0; kb < kb0 + 4; ++kb) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          WgmmaBf16<64>::ss<0>(s, wgmma_desc_advance(dq, kb * 8192 + ks * 32), wgmma_desc_advance(dk, kb * 8192 + ks * 32),
                               !first || kb + ks > kb0);
        }
      }
    };
    auto s_rope = [&](float (&s)[32], const u32 (&q_rope)[4][4]) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) WgmmaBf16<64>::rs<0>(s, q_rope[ks], wgmma_desc_advance(dk, 8 * 8192 + ks * 32), true);
    };

    // Softmax of tile j's S against the running max (m_lo, m_hi), which it raises. Returns the factor
    // 2^(m_old - m_new) in alpha, P as register A fragments (hi, lo) and in shared memory (for the
    // other warpgroup), the new max in red (for the other warpgroup) and the row sums of P.
    auto softmax = [&](float (&s)[32], int j, u32 red_out, u32 (&ph)[4][4], u32 (&pl)[4][4], float& alpha_lo,
                       float& alpha_hi, float& sum_lo, float& sum_hi) {
      const int tok_base = t0 + j * kMlaWgTileTokens + 2 * c4;
      // Causal: the last visible token of each row (recomputed per tile: cheaper than two live registers).
      int lim_lo = 0x7fffffff, lim_hi = 0x7fffffff;
      if constexpr (kCausal) {
        lim_lo = seq_len - q_len + (row0 + r_lo) / kHeads;
        lim_hi = seq_len - q_len + (row0 + r_hi) / kHeads;
      }
      float mx_lo = neg_inf(), mx_hi = neg_inf();
#pragma unroll
      for (int i = 0; i < 32; ++i) {
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
      const float mnew_lo = fmaxf(m_lo, mx_lo);
      const float mnew_hi = fmaxf(m_hi, mx_hi);
      if (c4 == 0) {
        sts_f32(red_out + r_lo * 4, mnew_lo);
        sts_f32(red_out + r_hi * 4, mnew_hi);
      }
      // A row that has seen nothing yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
      const float muse_lo = mnew_lo == neg_inf() ? 0.f : mnew_lo;
      const float muse_hi = mnew_hi == neg_inf() ? 0.f : mnew_hi;
      alpha_lo = fast_exp2(m_lo - muse_lo);
      alpha_hi = fast_exp2(m_hi - muse_hi);
      m_lo = mnew_lo;
      m_hi = mnew_hi;
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
        const u32 l01 = pack_bf16x2(p0 - bf16x2_lo(h01), p1 - bf16x2_hi(h01));
        const u32 l23 = pack_bf16x2(p2 - bf16x2_lo(h23), p3 - bf16x2_hi(h23));
        ph[n >> 1][2 * (n & 1)] = h01;
        ph[n >> 1][2 * (n & 1) + 1] = h23;
        pl[n >> 1][2 * (n & 1)] = l01;
        pl[n >> 1][2 * (n & 1) + 1] = l23;
        const u32 off_lo = p_row_lo + ((static_cast<u32>(n) ^ static_cast<u32>(g)) << 4);
        const u32 off_hi = p_row_hi + ((static_cast<u32>(n) ^ static_cast<u32>(g)) << 4);
        sts32(own_p_hi + off_lo, h01);
        sts32(own_p_hi + off_hi, h23);
        sts32(own_p_lo + off_lo, l01);
        sts32(own_p_lo + off_hi, l23);
      }
      // P was written through the generic proxy; the other warpgroup's wgmmas read it.
      fence_proxy_async_smem();
    };
    // The other warpgroup's new max from red: the factor 2^(m_old - m_new), and m = m_new.
    auto take_max = [&](u32 red_in, float& alpha_lo, float& alpha_hi) {
      const float mnew_lo = lds_f32(red_in + r_lo * 4);
      const float mnew_hi = lds_f32(red_in + r_hi * 4);
      alpha_lo = fast_exp2(m_lo - (mnew_lo == neg_inf() ? 0.f : mnew_lo));
      alpha_hi = fast_exp2(m_hi - (mnew_hi == neg_inf() ? 0.f : mnew_hi));
      m_lo = mnew_lo;
      m_hi = mnew_hi;
    };
    // Once a row's max settles its factor is exactly 1: skip the 128 multiplies when the whole warp's are.
    auto rescale = [&](float alpha_lo, float alpha_hi) {
      l_lo *= alpha_lo;
      l_hi *= alpha_hi;
      if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= ((i >> 1) & 1) ? alpha_hi : alpha_lo;
      }
    };
    auto pv_regs = [&](const u32 (&ph)[4][4], const u32 (&pl)[4][4]) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const u64 dvk = wgmma_desc_advance(dv_reg, ks * 2048);
        WgmmaBf16<256>::rs<1>(o, ph[ks], dvk, true);
        WgmmaBf16<256>::rs<1>(o, pl[ks], dvk, true);
      }
      wgmma_commit();
    };
    auto pv_smem = [&]() {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const u64 dvk = wgmma_desc_advance(dv_smem, ks * 2048);
        WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dph, ks * 32), dvk, true);
        WgmmaBf16<256>::ss<1>(o, wgmma_desc_advance(dpl, ks * 32), dvk, true);
      }
      wgmma_commit();
    };

    mbar_wait(bar_q, st.pieces & 1);
    ++st.pieces;

    // Full pairs in the loop, an odd last tile after it: every wgmma wait stays out of conditional
    // code (ptxas serializes wgmmas whose waits it has to place in divergent paths). The block-table
    // reads of a refill are issued before the wait that frees its columns.
    const int n_full = n_tiles / 2;
    if (wg == 0) {
      for (int k = 0; k < n_full; ++k) {
        const int ja = 2 * k;
        const u32 ph0 = (st.fills0 + k) & 1;
        const u32 red_slot = red + (k & 1) * 2 * kMlaWgRows * 4;
        // ---- S(2k): columns 0-255 (this warpgroup's part, loaded a pair ago) first ----
        float s[32];
        u32 q_rope[4][4];
        load_q_rope(q_rope);
        int pages[4];
        pages_of(ja + 1, pages);
        s_blocks(s, 0, bar_full, ph0, true);
        wgmma_commit();
        // Stage 1's columns 0-255 and RoPE block for tile 2k + 1 (free since the last pair's P V),
        // issued behind the first S wgmmas.
        if (k > 0) load_part(ja + 1, pages);
        s_blocks(s, 4, bar_full + 8, ph0, false);
        s_rope(s, q_rope);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s);

        u32 ph[4][4], pl[4][4];
        float a_lo, a_hi, sum_lo, sum_hi;
        softmax(s, ja, red_slot, ph, pl, a_lo, a_hi, sum_lo, sum_hi);
        named_barrier_sync(kBarM0, kMlaWgThreads);
        rescale(a_lo, a_hi);
        l_lo += sum_lo;
        l_hi += sum_hi;
        pv_regs(ph, pl);  // O_L += P(2k) V_L
        pages_of(ja + 2, pages);
        named_barrier_sync(kBarM1, kMlaWgThreads);
        take_max(red_slot + kMlaWgRows * 4, a_lo, a_hi);
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        // Stage 0's columns 0-255 are free: tile 2k + 2's part.
        if (ja + 2 < n_tiles) load_part(ja + 2, pages);
        rescale(a_lo, a_hi);
        named_barrier_sync(kBarPv, kMlaWgThreads);
        pv_smem();  // O_L += P(2k + 1) V_L
        wgmma_wait<0>();
        wgmma_fence_operand(o);
      }
      if (n_tiles & 1) {  // the last tile, alone
        const int ja = 2 * n_full;
        const u32 ph0 = (st.fills0 + n_full) & 1;
        const u32 red_slot = red + (n_full & 1) * 2 * kMlaWgRows * 4;
        float s[32];
        u32 q_rope[4][4];
        load_q_rope(q_rope);
        s_blocks(s, 0, bar_full, ph0, true);
        s_blocks(s, 4, bar_full + 8, ph0, false);
        s_rope(s, q_rope);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        u32 ph[4][4], pl[4][4];
        float a_lo, a_hi, sum_lo, sum_hi;
        softmax(s, ja, red_slot, ph, pl, a_lo, a_hi, sum_lo, sum_hi);
        named_barrier_sync(kBarM0, kMlaWgThreads);
        rescale(a_lo, a_hi);
        l_lo += sum_lo;
        l_hi += sum_hi;
        pv_regs(ph, pl);
        wgmma_wait<0>();
        wgmma_fence_operand(o);
      }
    } else {
      for (int k = 0; k < n_full; ++k) {
        const int ja = 2 * k;
        const u32 ph1 = (st.fills1 + k) & 1;
        const u32 red_slot = red + (k & 1) * 2 * kMlaWgRows * 4;
        // ---- S(2k + 1): columns 256-511 (this warpgroup's part) first ----
        float s[32];
        u32 q_rope[4][4];
        load_q_rope(q_rope);
        s_blocks(s, 4, bar_full + 8 * 3, ph1, true);
        wgmma_commit();
        s_blocks(s, 0, bar_full + 8 * 2, ph1, false);
        s_rope(s, q_rope);
        wgmma_commit();
        float a_lo, a_hi;
        named_barrier_sync(kBarM0, kMlaWgThreads);
        take_max(red_slot, a_lo, a_hi);
        // S(2k + 1) retires before O_R is rescaled: ptxas serializes every wgmma of a pipeline stage
        // in which a non-wgmma instruction writes an accumulator.
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        rescale(a_lo, a_hi);
        pv_smem();  // O_R += P(2k) V_R
        u32 ph[4][4], pl[4][4];
        float sum_lo, sum_hi;
        softmax(s, ja + 1, red_slot + kMlaWgRows * 4, ph, pl, a_lo, a_hi, sum_lo, sum_hi);
        named_barrier_sync(kBarM1, kMlaWgThreads);
        int pages[4];
        pages_of(ja + 2, pages);
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        // Stage 0's columns 256-575 are free: tile 2k + 2's part.
        if (ja + 2 < n_tiles) load_part(ja + 2, pages);
        rescale(a_lo, a_hi);
        l_lo += sum_lo;
        l_hi += sum_hi;
        pv_regs(ph, pl);  // O_R += P(2k + 1) V_R
        named_barrier_sync(kBarPv, kMlaWgThreads);
        pages_of(ja + 3, pages);
        wgmma_wait<0>();
        wgmma_fence_operand(o);
        // Stage 1's columns 256-511 are free: tile 2k + 3's part.
        if (ja + 3 < n_tiles) load_part(ja + 3, pages);
      }
      if (n_tiles & 1) {  // the last tile, warpgroup 0's: only its P V here
        const u32 red_slot = red + (n_full & 1) * 2 * kMlaWgRows * 4;
        float a_lo, a_hi;
        named_barrier_sync(kBarM0, kMlaWgThreads);
        take_max(red_slot, a_lo, a_hi);
        rescale(a_lo, a_hi);
        pv_smem();
        wgmma_wait<0>();
        wgmma_fence_operand(o);
      }
    }
    st.fills0 += static_cast<u32>(n_pairs);
    st.fills1 += static_cast<u32>(n_tiles / 2);
  }

  // ---- epilogue: row sums across the warpgroups, normalise, store ----
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  // The slot before the last pair's: the other warpgroup may still read the last pair's row max,
  // but has passed a kBarM0 or kBarM1 since its last read of this one.
  const u32 red_sum = red + (n_pairs & 1) * 2 * kMlaWgRows * 4;
  if (c4 == 0) {
    sts_f32(red_sum + (wg * 64 + r_lo) * 4, l_lo);
    sts_f32(red_sum + (wg * 64 + r_hi) * 4, l_hi);
  }
  named_barrier_sync(kBarSum, kMlaWgThreads);
  const float lt_lo = lds_f32(red_sum + r_lo * 4) + lds_f32(red_sum + (64 + r_lo) * 4);
  const float lt_hi = lds_f32(red_sum + r_hi * 4) + lds_f32(red_sum + (64 + r_hi) * 4);
  // Both warpgroups read red before the next piece's first write (barrier 1 at its start).

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

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
