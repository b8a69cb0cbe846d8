#pragma once
// Paged MLA decode on Hopper warpgroup MMAs (sm_90a), one piece at a time (schedule.cuh).
//
// One CTA = 64 query rows (row = i * H + h) of one part; two warpgroups. Per 64-token KV tile:
//   S = Q K^T split over the 576 columns: warpgroup 0 takes columns 0-287, warpgroup 1 288-575, each
//     as 18 m64n64k16 wgmmas over all 64 tokens (14 with Q from shared memory, 4 with the Q columns
//     it keeps in registers: 0-63 and the RoPE 512-575);
//   the two fp32 partials cross through shared memory (the one meeting per tile), so each
//     warpgroup holds the whole S and runs the same softmax: no row-max or P exchange;
//   P = exp2(S - m) as bf16 hi + lo (P - hi) register fragments (a single bf16 P misses the
//     contract's 1e-2 / 5e-4 tolerances);
//   O += P V: warpgroup w owns output columns [256 w, 256 w + 256): 8 m64n256k16 wgmmas (4 token
//     steps x hi, lo) with P from registers and B the same shared K tile read MN-major: V is never
//     loaded twice.
// Loads are cp.async into 128-byte-swizzled tiles (any page size works; zero-fill past the range),
// completing on one mbarrier per stage. Two stages: warpgroup w refills the columns its own P V reads
// (w = 0: 0-255, w = 1: 256-575); what the other warpgroup read there (its S columns, the exchange
// in the RoPE block) precedes the meeting of the tile or releases the exchange mbarrier.
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
  u32 tiles;   // KV tiles consumed so far: stage = tiles % 2, its phase = (tiles / 2) % 2
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

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // warpgroup: S columns [288 wg, 288 wg + 288), output columns [256 wg, 256 wg + 256)
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

  const u32 q_smem = base + kMlaWgQOffset;  // column blocks 1..7
  const u32 stage_smem = base + kMlaWgStageOffset;
  const u32 x0 = base + kMlaWgXOffset;          // warpgroup 0's partial S
  const u32 x1 = x0 + kMlaWgXBytes;             // second half of warpgroup 1's
  const u32 bar_q = base + kMlaWgBarOffset;
  const u32 bar_full = bar_q + 8;               // + 8 * stage
  const u32 bar_xfree = bar_full + 8 * kMlaWgStages;  // + 8 * writer: the reader is done with it

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  // Every thread of both warpgroups is done with the previous piece's Q, stages and exchange.
  named_barrier_sync(1, kMlaWgThreads);
  if (n_tiles > 0) {
    const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
    const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(b) * p.block_table_stride;
    const unsigned char* q_rows =
        static_cast<const unsigned char*>(p.q) + (static_cast<long long>(tok0) * kHeads + row0) * kRowBytes;

    // Each warp instruction copies 4 token rows x 8 chunks (one 128-byte swizzled row of one 64-column
    // block each): conflict-free shared stores and 128-byte global segments. Thread (warp w, lane l)
    // owns tokens 16 q + 4 w + l / 8 (q = 0..3) and chunk l % 8 of each of its warpgroup's column
    // blocks (warpgroup 0: blocks 0-3 = columns 0-255; warpgroup 1: blocks 4-8 = columns 256-575).
    // The block-table entries are read one tile ahead, off the issue path.
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
    auto load_tile = [&](int j, const int (&pages)[4], u32 stage) {
      const u32 dst0 = stage_smem + stage * kMlaWgStageBytes + ld_dst;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int t = t0 + j * kMlaWgTileTokens + 16 * q + ld_tok;
        // Rows past the range are zero-filled: masked P is 0, and 0 * stale NaN would be NaN.
        const bool valid = pages[q] >= 0;
        const unsigned char* src =
            valid ? kv + (static_cast<long long>(pages[q]) * kPageSize + t % kPageSize) * kRowBytes + ld_chunk * 16 : kv;
        const u32 bytes = valid ? 16u : 0u;
        if (wg == 0) {
#pragma unroll
          for (int blk = 0; blk < 4; ++blk) cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
        } else {
#pragma unroll
          for (int blk = 4; blk < 9; ++blk) cp_async_16_addr(dst0 + blk * 8192 + q * 2048, src + blk * 128, bytes);
        }
      }
      cp_async_mbar_arrive(bar_full + 8 * stage);
    };

    // Q columns 64-511 (chunks 8..63 of each row), shared by all 256 threads.
#pragma unroll 4
    for (int i = 0; i < kMlaWgRows * 64 / kMlaWgThreads; ++i) {
      const int idx = i * kMlaWgThreads + tid;
      const int r = idx >> 6;
      const int ch = idx & 63;
      const bool valid = row0 + r < rows_b;
      if (ch >= 8) {
        cp_async_16_addr(q_smem + ((ch >> 3) - 1) * 8192 + sw128(r, ch & 7),
                         valid ? q_rows + r * kRowBytes + ch * 16 : q_rows, valid ? 16u : 0u);
      }
    }
    cp_async_mbar_arrive(bar_q);
    int pages[4];
    pages_of(0, pages);
    load_tile(0, pages, st.tiles & 1);
    pages_of(1, pages);

    // This warpgroup's register Q columns (0-63 or 512-575) as A fragments of 4 k-steps.
    u32 q_reg[4][4];
    {
      const int qc = wg ? kMlaDimV : 0;
      const bool v_lo = row0 + r_lo < rows_b, v_hi = row0 + r_hi < rows_b;
      const unsigned char* q_lo = q_rows + r_lo * kRowBytes + (qc + 2 * c4) * 2;
      const unsigned char* q_hi = q_rows + r_hi * kRowBytes + (qc + 2 * c4) * 2;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        q_reg[ks][0] = ld_u32_if(q_lo + ks * 32, v_lo);
        q_reg[ks][1] = ld_u32_if(q_hi + ks * 32, v_hi);
        q_reg[ks][2] = ld_u32_if(q_lo + ks * 32 + 16, v_lo);
        q_reg[ks][3] = ld_u32_if(q_hi + ks * 32 + 16, v_hi);
      }
    }

    int lim_lo = 0x7fffffff, lim_hi = 0x7fffffff;
    if constexpr (kCausal) {
      lim_lo = seq_len - q_len + (row0 + r_lo) / kHeads;
      lim_hi = seq_len - q_len + (row0 + r_hi) / kHeads;
    }
    const float scale = p.scale_log2;
    const u64 dq = wgmma_desc_sw128(q_smem, 16, 1024);  // column block kb at (kb - 1) * 8192

    mbar_wait(bar_q, st.pieces & 1);
    ++st.pieces;

    for (int j = 0; j < n_tiles; ++j) {
      // ---- partial S = Q K^T over this warpgroup's 288 columns ----
      const u32 n = st.tiles;  // this tile's index over the CTA's life: stage n % 2, exchange n
      const u32 stage = n & 1u;
      mbar_wait(bar_full + 8 * stage, (n >> 1) & 1u);
      ++st.tiles;
      // cp.async wrote the tile through the generic proxy; wgmma reads it through the async proxy.
      fence_proxy_async_smem();
      const u32 k_smem = stage_smem + stage * kMlaWgStageBytes;
      // Warpgroup 0: column block 0 (Q in registers), blocks 1-3, the first half of block 4;
      // warpgroup 1: block 8 (RoPE, Q in registers), blocks 5-7, the second half of block 4. The
      // same instruction sequence in both (only descriptors differ) keeps the wgmmas convergent.
      const u64 dk = wgmma_desc_sw128(k_smem, 16, 1024);
      const u32 blk0 = 1 + 4 * wg;
      const u64 dq_main = wgmma_desc_advance(dq, (blk0 - 1) * 8192);
      const u64 dk_main = wgmma_desc_advance(dk, blk0 * 8192);
      const u64 dq_b4 = wgmma_desc_advance(dq, 3 * 8192 + wg * 64);
      const u64 dk_b4 = wgmma_desc_advance(dk, 4 * 8192 + wg * 64);
      const u64 dk_reg = wgmma_desc_advance(dk, wg * kMlaWgRopeBlockOffset);
      float s[32];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) WgmmaBf16<64>::rs<0>(s, q_reg[ks], wgmma_desc_advance(dk_reg, ks * 32), ks > 0);
#pragma unroll
      for (int ks = 0; ks < 12; ++ks) {
        const u32 off = (ks >> 2) * 8192 + (ks & 3) * 32;
        WgmmaBf16<64>::ss<0>(s, wgmma_desc_advance(dq_main, off), wgmma_desc_advance(dk_main, off), true);
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        WgmmaBf16<64>::ss<0>(s, wgmma_desc_advance(dq_b4, ks * 32), wgmma_desc_advance(dk_b4, ks * 32), true);
      }
      wgmma_commit();
      // The exchange of tile n - 1 sits in the RoPE block that warpgroup 1 refills next, and both
      // warpgroups write this tile's exchange below: the other warpgroup has read the previous one.
      if (n > 0) mbar_wait(bar_xfree + 8 * wg, (n - 1) & 1u);
      // Tile j + 1 streams into the other stage while S runs.
      if (j + 1 < n_tiles) {
        load_tile(j + 1, pages, stage ^ 1u);
        pages_of(j + 2, pages);
      }
      wgmma_wait<0>();
      wgmma_fence_operand(s);

      // Register i of thread t sits at float4 (i / 4) * 128 + t of the exchange. Warpgroup 1's
      // first half overwrites the RoPE block its wgmmas just read (async proxy).
      const u32 xw_lo = wg ? k_smem + kMlaWgRopeBlockOffset : x0;
      const u32 xw_hi = wg ? x1 : x0 + kMlaWgXBytes / 2;
      const u32 xr_lo = wg ? x0 : k_smem + kMlaWgRopeBlockOffset;
      const u32 xr_hi = wg ? x0 + kMlaWgXBytes / 2 : x1;
      fence_proxy_async_smem();
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const u32 addr = (v < 4 ? xw_lo : xw_hi) + ((v & 3) * 128 + wt) * 16;
        sts128(addr, U32x4{__float_as_uint(s[4 * v]), __float_as_uint(s[4 * v + 1]), __float_as_uint(s[4 * v + 2]),
                           __float_as_uint(s[4 * v + 3])});
      }
      named_barrier_sync(2, kMlaWgThreads);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const U32x4 x = lds128((v < 4 ? xr_lo : xr_hi) + ((v & 3) * 128 + wt) * 16);
        s[4 * v] += __uint_as_float(x.x);
        s[4 * v + 1] += __uint_as_float(x.y);
        s[4 * v + 2] += __uint_as_float(x.z);
        s[4 * v + 3] += __uint_as_float(x.w);
      }
      mbar_arrive(bar_xfree + 8 * (wg ^ 1));

      // ---- mask, scale, row max (both warpgroups compute the same values) ----
      const int tok_base = t0 + j * kMlaWgTileTokens + 2 * c4;
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
      // A row that has seen nothing yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
      const float muse_lo = mnew_lo == neg_inf() ? 0.f : mnew_lo;
      const float muse_hi = mnew_hi == neg_inf() ? 0.f : mnew_hi;
      const float alpha_lo = fast_exp2(m_lo - muse_lo);
      const float alpha_hi = fast_exp2(m_hi - muse_hi);
      m_lo = mnew_lo;
      m_hi = mnew_hi;

      // ---- P = exp2(S - m) as bf16 hi + lo A fragments: k-step ks holds S registers 8 ks .. 8 ks + 7 ----
      u32 ph[4][4], pl[4][4];
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float muse = (k & 1) ? muse_hi : muse_lo;
          const float p0 = fast_exp2(s[8 * ks + 2 * k] - muse);
          const float p1 = fast_exp2(s[8 * ks + 2 * k + 1] - muse);
          if (k & 1) sum_hi += p0 + p1;
          else sum_lo += p0 + p1;
          const u32 h = pack_bf16x2(p0, p1);
          ph[ks][k] = h;
          pl[ks][k] = pack_bf16x2(p0 - bf16x2_lo(h), p1 - bf16x2_hi(h));
        }
      }
      l_lo = l_lo * alpha_lo + sum_lo;
      l_hi = l_hi * alpha_hi + sum_hi;
      // Once a row's max settles its alpha is exactly 1: skip the 128 multiplies when the whole warp's are.
      if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= ((i >> 1) & 1) ? alpha_hi : alpha_lo;
      }

      // ---- O += P V over this warpgroup's 256 columns ----
      const u64 dv = wgmma_desc_sw128(k_smem + wg * 4 * 8192, 8192, 1024);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const u64 dvk = wgmma_desc_advance(dv, ks * 2048);
        WgmmaBf16<256>::rs<1>(o, ph[ks], dvk, true);
        WgmmaBf16<256>::rs<1>(o, pl[ks], dvk, true);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(o);
    }
  }

  // ---- epilogue: each warpgroup holds its rows' whole sums; normalise, store ----
  const float lt_lo = quad_sum(l_lo);
  const float lt_hi = quad_sum(l_hi);

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
