#pragma once
// Paged MLA decode on mma.sync tensor cores (sm_80+ PTX: sm_90a and sm_120a), one piece at a time
// (schedule.cuh). One CTA = one row tile (rows fold the query positions and heads: row = i * H + h)
// of one part, so each KV tile is read once per row tile and shared by every row in it.
//
// Warp roles: warp (rg, cg) owns rows [16 rg, 16 rg + 16) of the tile. For S = Q K^T it takes token
// slice cg of the KV tile; the row max crosses warps through shared memory, P goes to shared memory,
// and for O += P V it takes output column slice cg (512 / C columns), so O never needs more than
// 128 fp32 registers per thread.
//
// fp8 (e4m3) inputs are widened to f16 in shared memory (exact: every e4m3 value is an f16) and run
// on the f16 MMA with P in f16. The bf16 path splits P into bf16 hi + lo (two MMAs per V fragment),
// or with kSplitP false keeps the one bf16 P (kMlaPrecisionBf16).
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/softmax.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

// 16 e4m3 bytes -> 16 f16 values (two 16-byte vectors), memory order preserved.
__device__ __forceinline__ void e4m3x16_to_f16(const U32x4& v, U32x4& lo, U32x4& hi) {
  lo.x = e4m3x2_to_f16x2(u16(v.x & 0xffffu));
  lo.y = e4m3x2_to_f16x2(u16(v.x >> 16));
  lo.z = e4m3x2_to_f16x2(u16(v.y & 0xffffu));
  lo.w = e4m3x2_to_f16x2(u16(v.y >> 16));
  hi.x = e4m3x2_to_f16x2(u16(v.z & 0xffffu));
  hi.y = e4m3x2_to_f16x2(u16(v.z >> 16));
  hi.z = e4m3x2_to_f16x2(u16(v.w & 0xffffu));
  hi.w = e4m3x2_to_f16x2(u16(v.w >> 16));
}

template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  if constexpr (kF16) {
    mma_f16_16816(d, a, b);
  } else {
    mma_bf16_16816(d, a, b);
  }
}

template <bool kF16>
__device__ __forceinline__ u32 pack_p(float lo, float hi) {
  if constexpr (kF16) {
    return pack_f16x2(lo, hi);
  } else {
    return pack_bf16x2(lo, hi);
  }
}

// Rows [row0, row0 + 16 * kRowGroups) of `piece`; slot < 0: the piece is the whole request, write
// `out`; else write the normalised partial O and its LSE to `slot`.
template <int kPageSize, bool kFp8, int kRowGroups, int kColGroups, int kTileTokens, int kStages, bool kSplitP>
__device__ __forceinline__ void mla_mma_piece(const MlaDecodeParams& p, unsigned char* smem, const MlaPiece& piece,
                                              int row0, int slot) {
  static_assert(!(kFp8 && kSplitP), "fp8 pages run on one f16 P");
  constexpr MlaTileConfig kCfg{kRowGroups, kColGroups, kTileTokens, kStages};
  constexpr MlaSmemLayout kLayout = mla_smem_layout(kCfg, kFp8);
  constexpr int kThreads = mla_threads(kCfg);
  constexpr int kRows = mla_tile_rows(kCfg);
  const int max_rows = mla_max_rows(p.heads, p.max_seq_len_q);
  constexpr int kWarpTokens = kTileTokens / kColGroups;  // S columns per warp
  constexpr int kNT = kWarpTokens / 8;                   // S n8 tiles per warp
  constexpr int kWarpCols = kMlaDimV / kColGroups;       // O columns per warp
  constexpr int kOT = kWarpCols / 8;                     // O n8 tiles per warp
  constexpr int kRowBytes = kFp8 ? kMlaDimQk : kMlaDimQk * 2;
  constexpr int kChunks = kRowBytes / 16;
  constexpr int kThreadsPerToken = kThreads / kTileTokens;
  constexpr int kChunksPerThread = (kChunks + kThreadsPerToken - 1) / kThreadsPerToken;
  constexpr int kPitchBytes = kMlaSmemPitch * 2;
  constexpr int kStagePitch = kFp8 ? kMlaDimQk : kPitchBytes;
  constexpr int kPPitchBytes = kLayout.p_pitch * 2;
  constexpr int kPLoBytes = kRows * kPPitchBytes;  // bf16: offset of the P residual tile
  // With one S tile per warp a single accumulator chain would serialise 36 dependent MMAs.
  constexpr int kKSplit = kNT == 1 ? 4 : (kNT == 2 ? 2 : 1);

  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  static_assert(kWarpTokens % 8 == 0 && kTileTokens % 16 == 0, "token slice per warp must be whole n8 tiles");
  static_assert(kOT % 2 == 0, "output slice per warp must be whole n16 pairs");
  static_assert(kThreads % kTileTokens == 0, "tile loader maps a fixed thread group to each token");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(kLayout.total <= 232448, "shared memory over the sm_90 per-block limit");

  const u32 sbase = smem_addr(smem);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int rg = warp / kColGroups;
  const int cg = warp % kColGroups;
  const int g = lane >> 2;
  const int q4 = lane & 3;
  const MlaPieceRows pv = mla_piece_rows<kRows, kTileTokens>(p, piece, row0);

  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(pv.b) * p.block_table_stride;

  const u32 q_smem = sbase + kLayout.q_offset;
  const u32 stage_smem = sbase + kLayout.stage_offset;

  // Token tid / kThreadsPerToken of the tile, chunks sub, sub + kThreadsPerToken, ...
  auto load_tile = [&](int tile, int stage) {
    const int tok_local = tid / kThreadsPerToken;
    const int sub = tid % kThreadsPerToken;
    const int t = pv.t0 + tile * kTileTokens + tok_local;
    const bool valid = t < pv.t1;
    const unsigned char* src = kv;
    if (valid) {
      const int page = __ldg(bt_row + t / kPageSize);
      src = kv + (static_cast<long long>(page) * kPageSize + t % kPageSize) * kRowBytes;
    }
    const u32 dst = stage_smem + stage * kLayout.stage_bytes + tok_local * kStagePitch;
#pragma unroll
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int c = sub + k * kThreadsPerToken;
      if (kChunks % kThreadsPerToken == 0 || c < kChunks) {
        // Rows past the range are zero-filled: masked P is 0, and 0 * garbage could be NaN.
        cp_async_16_addr(dst + c * 16, valid ? src + c * 16 : src, valid ? 16u : 0u);
      }
    }
  };

  const unsigned char* q_rows =
      static_cast<const unsigned char*>(p.q) + (static_cast<long long>(pv.tok0) * p.heads + row0) * kRowBytes;
  if (pv.n_tiles > 0) {
    if constexpr (!kFp8) {
#pragma unroll
      for (int k = 0; k < (kRows * kChunks + kThreads - 1) / kThreads; ++k) {
        const int c = tid + k * kThreads;
        if ((kRows * kChunks) % kThreads == 0 || c < kRows * kChunks) {
          const int r = c / kChunks;
          const int ch = c % kChunks;
          const bool valid = row0 + r < pv.rows_b;
          cp_async_16_addr(q_smem + r * kPitchBytes + ch * 16, valid ? q_rows + r * kRowBytes + ch * 16 : q_rows,
                           valid ? 16u : 0u);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < pv.n_tiles) load_tile(s, s);
      cp_async_commit();
    }
    if constexpr (kFp8) {
      // Q is small and read once: plain loads, widened while the KV prologue is in flight.
#pragma unroll
      for (int k = 0; k < (kRows * kChunks + kThreads - 1) / kThreads; ++k) {
        const int c = tid + k * kThreads;
        if ((kRows * kChunks) % kThreads == 0 || c < kRows * kChunks) {
          const int r = c / kChunks;
          const int ch = c % kChunks;
          U32x4 v{0u, 0u, 0u, 0u};
          if (row0 + r < pv.rows_b) v = ldg128_stream(q_rows + r * kRowBytes + ch * 16);
          U32x4 lo, hi;
          e4m3x16_to_f16(v, lo, hi);
          sts128(q_smem + r * kPitchBytes + ch * 32, lo);
          sts128(q_smem + r * kPitchBytes + ch * 32 + 16, hi);
        }
      }
    }
  }

  // Per-lane ldmatrix base addresses (bytes). A operands: lanes 0-15 rows 0-15 at k 0, lanes 16-31
  // rows 0-15 at k 8. K as B (non-trans): lane picks token lane%8, k offset 8*(lane/8) covering two
  // k16 steps. V as B (trans): lane picks token (lane%8) + 8*((lane/8)%2), column 8*(lane/16).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const u32 q_lane = q_smem + (rg * 16 + a_row) * kPitchBytes + (lane >> 4) * 16;
  const u32 k_lane = (cg * kWarpTokens + (lane & 7)) * kPitchBytes + (lane >> 3) * 16;
  const u32 p_lane = sbase + kLayout.p_offset + (rg * 16 + a_row) * kPPitchBytes + (lane >> 4) * 16;
  const u32 v_lane = a_row * kPitchBytes + (cg * kWarpCols + (lane >> 4) * 8) * 2;
  const u32 p_store = sbase + kLayout.p_offset + (rg * 16 + g) * kPPitchBytes + (cg * kWarpTokens + 2 * q4) * 2;
  const u32 red_max = sbase + kLayout.red_max_offset;
  const u32 red_sum = sbase + kLayout.red_sum_offset;
  const int row_lo = rg * 16 + g;  // tile-local rows of this thread: row_lo and row_lo + 8

  const int last_lo = mla_row_last(p, pv, row0 + row_lo);
  const int last_hi = mla_row_last(p, pv, row0 + row_lo + 8);
  const float scale = p.scale_log2;

  float o[kOT][4];
#pragma unroll
  for (int n = 0; n < kOT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  for (int it = 0; it < pv.n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; everyone is done with iteration it - 1
    {
      const int next = it + kStages - 1;
      if (next < pv.n_tiles) load_tile(next, next % kStages);
      cp_async_commit();
    }
    const int stage = it % kStages;
    u32 kt;
    if constexpr (kFp8) {
      const u32 src = stage_smem + stage * kLayout.stage_bytes;
      kt = sbase + kLayout.tile_offset;
#pragma unroll
      for (int k = 0; k < (kTileTokens * kChunks + kThreads - 1) / kThreads; ++k) {
        const int c = tid + k * kThreads;
        if ((kTileTokens * kChunks) % kThreads == 0 || c < kTileTokens * kChunks) {
          const int r = c / kChunks;
          const int ch = c % kChunks;
          U32x4 lo, hi;
          e4m3x16_to_f16(lds128(src + r * kStagePitch + ch * 16), lo, hi);
          sts128(kt + r * kPitchBytes + ch * 32, lo);
          sts128(kt + r * kPitchBytes + ch * 32 + 16, hi);
        }
      }
      __syncthreads();
    } else {
      kt = stage_smem + stage * kLayout.stage_bytes;
    }

    // ---- S = Q K^T over this warp's token slice ----
    float sacc[kKSplit][kNT][4];
#pragma unroll
    for (int a = 0; a < kKSplit; ++a)
#pragma unroll
      for (int j = 0; j < kNT; ++j) sacc[a][j][0] = sacc[a][j][1] = sacc[a][j][2] = sacc[a][j][3] = 0.f;
#pragma unroll
    for (int ks2 = 0; ks2 < kMlaDimQk / 32; ++ks2) {
      u32 a0[4], a1[4];
      ldsm_x4(a0, q_lane + ks2 * 64);
      ldsm_x4(a1, q_lane + ks2 * 64 + 32);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        u32 bk[4];
        ldsm_x4(bk, kt + k_lane + j * 8 * kPitchBytes + ks2 * 64);
        const u32 b0[2] = {bk[0], bk[1]};
        const u32 b1[2] = {bk[2], bk[3]};
        mma_16816<kFp8>(sacc[(2 * ks2) % kKSplit][j], a0, b0);
        mma_16816<kFp8>(sacc[(2 * ks2 + 1) % kKSplit][j], a1, b1);
      }
    }
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = sacc[0][j][e];
#pragma unroll
        for (int a = 1; a < kKSplit; ++a) v += sacc[a][j][e];
        s[j][e] = v;
      }

    // ---- mask, scale, row max across the column-group warps ----
    const int tile_t0 = pv.t0 + it * kTileTokens + cg * kWarpTokens + 2 * q4;
    float mx_lo = neg_inf(), mx_hi = neg_inf();
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = tile_t0 + j * 8 + (e & 1);
        const float x = t <= (e < 2 ? last_lo : last_hi) ? s[j][e] * scale : neg_inf();
        s[j][e] = x;
        if (e < 2) mx_lo = fmaxf(mx_lo, x);
        else mx_hi = fmaxf(mx_hi, x);
      }
    mx_lo = quad_max(mx_lo);
    mx_hi = quad_max(mx_hi);
    if (q4 == 0) {
      sts_f32(red_max + (cg * kRows + row_lo) * 4, mx_lo);
      sts_f32(red_max + (cg * kRows + row_lo + 8) * 4, mx_hi);
    }
    __syncthreads();
    float tmax_lo = neg_inf(), tmax_hi = neg_inf();
#pragma unroll
    for (int c = 0; c < kColGroups; ++c) {
      tmax_lo = fmaxf(tmax_lo, lds_f32(red_max + (c * kRows + row_lo) * 4));
      tmax_hi = fmaxf(tmax_hi, lds_f32(red_max + (c * kRows + row_lo + 8) * 4));
    }
    const auto [muse_lo, alpha_lo] = online_softmax_step(m_lo, tmax_lo);
    const auto [muse_hi, alpha_hi] = online_softmax_step(m_hi, tmax_hi);
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const float p0 = fast_exp2(s[j][0] - muse_lo);
      const float p1 = fast_exp2(s[j][1] - muse_lo);
      const float p2 = fast_exp2(s[j][2] - muse_hi);
      const float p3 = fast_exp2(s[j][3] - muse_hi);
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      const u32 hi01 = pack_p<kFp8>(p0, p1);
      const u32 hi23 = pack_p<kFp8>(p2, p3);
      sts32(p_store + j * 16, hi01);
      sts32(p_store + 8 * kPPitchBytes + j * 16, hi23);
      if constexpr (kSplitP) {
        // Residual of the bf16 rounding: P = hi + lo to ~16 bits.
        sts32(p_store + kPLoBytes + j * 16, pack_bf16x2(p0 - bf16x2_lo(hi01), p1 - bf16x2_hi(hi01)));
        sts32(p_store + kPLoBytes + 8 * kPPitchBytes + j * 16, pack_bf16x2(p2 - bf16x2_lo(hi23), p3 - bf16x2_hi(hi23)));
      }
    }
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
    for (int n = 0; n < kOT; ++n) {
      o[n][0] *= alpha_lo;
      o[n][1] *= alpha_lo;
      o[n][2] *= alpha_hi;
      o[n][3] *= alpha_hi;
    }
    __syncthreads();  // P complete for the whole tile

    // ---- O += P V over this warp's column slice ----
#pragma unroll
    for (int ks = 0; ks < kTileTokens / 16; ++ks) {
      u32 a[4], a_lo[4];
      ldsm_x4(a, p_lane + ks * 32);
      if constexpr (kSplitP) ldsm_x4(a_lo, p_lane + kPLoBytes + ks * 32);
#pragma unroll
      for (int jn = 0; jn < kOT / 2; ++jn) {
        u32 bv[4];
        ldsm_x4_trans(bv, kt + v_lane + ks * 16 * kPitchBytes + jn * 32);
        const u32 b0[2] = {bv[0], bv[1]};
        const u32 b1[2] = {bv[2], bv[3]};
        mma_16816<kFp8>(o[2 * jn], a, b0);
        mma_16816<kFp8>(o[2 * jn + 1], a, b1);
        if constexpr (kSplitP) {
          mma_16816<kFp8>(o[2 * jn], a_lo, b0);
          mma_16816<kFp8>(o[2 * jn + 1], a_lo, b1);
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: row sums across column groups, normalise, store ----
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  if (q4 == 0) {
    sts_f32(red_sum + (cg * kRows + row_lo) * 4, l_lo);
    sts_f32(red_sum + (cg * kRows + row_lo + 8) * 4, l_hi);
  }
  __syncthreads();
  float lt_lo = 0.f, lt_hi = 0.f;
#pragma unroll
  for (int c = 0; c < kColGroups; ++c) {
    lt_lo += lds_f32(red_sum + (c * kRows + row_lo) * 4);
    lt_hi += lds_f32(red_sum + (c * kRows + row_lo + 8) * 4);
  }

  const int col0 = cg * kWarpCols + 2 * q4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + row_lo + half * 8;
    if (row >= pv.rows_b) continue;
    const float lt = half ? lt_hi : lt_lo;
    const float m = half ? m_hi : m_lo;
    if (slot < 0) {
      const float inv = lt > 0.f ? p.out_scale / lt : 0.f;  // nothing visible -> zeros
      u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(pv.tok0) * p.heads + row) * kMlaDimV + col0;
#pragma unroll
      for (int n = 0; n < kOT; ++n) {
        *reinterpret_cast<u32*>(out + n * 8) = pack_bf16x2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
      }
    } else {
      const long long idx = static_cast<long long>(slot) * max_rows + row;
      if (lt > 0.f) {
        const float inv = 1.f / lt;
        float* op = static_cast<float*>(p.o_partial) + idx * kMlaDimV + col0;
#pragma unroll
        for (int n = 0; n < kOT; ++n) {
          *reinterpret_cast<float2*>(op + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
        }
      }
      if (cg == 0 && q4 == 0) {
        static_cast<float*>(p.lse_partial)[idx] = lt > 0.f ? m + __log2f(lt) : neg_inf();
      }
    }
  }
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
