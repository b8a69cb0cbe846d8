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

// Compile-time geometry of one mma.sync configuration: the CTA's row tile, each warp's share of S
// and O, and the byte layout of Q, the KV stages and P in shared memory.
template <int kPageSize, bool kFp8, int kRowGroups, int kColGroups, int kTileTokens, int kStages>
struct MlaMmaGeometry {
  static constexpr int kPage = kPageSize;
  static constexpr bool kF16 = kFp8;
  static constexpr int kColGroupCount = kColGroups;
  static constexpr int kTile = kTileTokens;
  static constexpr MlaTileConfig kConfig{kRowGroups, kColGroups, kTileTokens, kStages};
  static constexpr MlaSmemLayout kLayout = mla_smem_layout(kConfig, kFp8);
  static constexpr int kThreads = mla_threads(kConfig);
  static constexpr int kRows = mla_tile_rows(kConfig);
  static constexpr int kWarpTokens = kTileTokens / kColGroups;  // S columns per warp
  static constexpr int kNT = kWarpTokens / 8;                   // S n8 tiles per warp
  static constexpr int kWarpCols = kMlaDimV / kColGroups;       // O columns per warp
  static constexpr int kOT = kWarpCols / 8;                     // O n8 tiles per warp
  static constexpr int kRowBytes = kFp8 ? kMlaDimQk : kMlaDimQk * 2;
  static constexpr int kChunks = kRowBytes / 16;
  static constexpr int kThreadsPerToken = kThreads / kTileTokens;
  static constexpr int kChunksPerThread = (kChunks + kThreadsPerToken - 1) / kThreadsPerToken;
  static constexpr int kPitchBytes = kMlaSmemPitch * 2;
  static constexpr int kStagePitch = kFp8 ? kMlaDimQk : kPitchBytes;
  static constexpr int kPPitchBytes = kLayout.p_pitch * 2;
  static constexpr int kPLoBytes = kRows * kPPitchBytes;  // bf16: offset of the P residual tile
  // With one S tile per warp a single accumulator chain would serialise 36 dependent MMAs.
  static constexpr int kKSplit = kNT == 1 ? 4 : (kNT == 2 ? 2 : 1);

  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "kPageSize must be a power of two");
  static_assert(kWarpTokens % 8 == 0 && kTileTokens % 16 == 0, "token slice per warp must be whole n8 tiles");
  static_assert(kOT % 2 == 0, "output slice per warp must be whole n16 pairs");
  static_assert(kThreads % kTileTokens == 0, "tile loader maps a fixed thread group to each token");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(kLayout.total <= 232448, "shared memory over the sm_90 per-block limit");
};

// One thread's place in the tile: its warp's row group and column group, its rows of the mma
// fragments (row_lo and row_lo + 8), and its ldmatrix / P-store base addresses (bytes).
// A operands: lanes 0-15 rows 0-15 at k 0, lanes 16-31 rows 0-15 at k 8. K as B (non-trans): lane
// picks token lane%8, k offset 8*(lane/8) covering two k16 steps. V as B (trans): lane picks token
// (lane%8) + 8*((lane/8)%2), column 8*(lane/16).
struct MlaMmaLane {
  int tid, cg, q4, row_lo;
  u32 q_lane, k_lane, p_lane, v_lane, p_store, red_max, red_sum;

  template <class G>
  __device__ __forceinline__ static MlaMmaLane make(u32 sbase, u32 q_smem) {
    MlaMmaLane l;
    l.tid = threadIdx.x;
    const int lane = l.tid & 31;
    const int warp = l.tid >> 5;
    const int rg = warp / G::kColGroupCount;
    l.cg = warp % G::kColGroupCount;
    const int g = lane >> 2;
    l.q4 = lane & 3;
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
    l.q_lane = q_smem + (rg * 16 + a_row) * G::kPitchBytes + (lane >> 4) * 16;
    l.k_lane = (l.cg * G::kWarpTokens + (lane & 7)) * G::kPitchBytes + (lane >> 3) * 16;
    l.p_lane = sbase + G::kLayout.p_offset + (rg * 16 + a_row) * G::kPPitchBytes + (lane >> 4) * 16;
    l.v_lane = a_row * G::kPitchBytes + (l.cg * G::kWarpCols + (lane >> 4) * 8) * 2;
    l.p_store = sbase + G::kLayout.p_offset + (rg * 16 + g) * G::kPPitchBytes + (l.cg * G::kWarpTokens + 2 * l.q4) * 2;
    l.red_max = sbase + G::kLayout.red_max_offset;
    l.red_sum = sbase + G::kLayout.red_sum_offset;
    l.row_lo = rg * 16 + g;
    return l;
  }
};

// Tile `tile` of the piece into `stage`: token tid / kThreadsPerToken of the tile, chunks sub,
// sub + kThreadsPerToken, ... Tokens past the piece are zero-filled: masked P is 0, and 0 * garbage
// could be NaN.
template <class G>
__device__ __forceinline__ void mla_mma_load_tile(const unsigned char* kv, const int* bt_row, const MlaPieceRows& pv,
                                                  u32 stage_smem, int tid, int tile, int stage) {
  const int tok_local = tid / G::kThreadsPerToken;
  const int sub = tid % G::kThreadsPerToken;
  const int t = pv.t0 + tile * G::kTile + tok_local;
  const bool valid = t < pv.t1;
  const unsigned char* src = kv;
  if (valid) {
    const int page = __ldg(bt_row + t / G::kPage);
    src = kv + (static_cast<long long>(page) * G::kPage + t % G::kPage) * G::kRowBytes;
  }
  const u32 dst = stage_smem + stage * G::kLayout.stage_bytes + tok_local * G::kStagePitch;
#pragma unroll
  for (int k = 0; k < G::kChunksPerThread; ++k) {
    const int c = sub + k * G::kThreadsPerToken;
    if (G::kChunks % G::kThreadsPerToken == 0 || c < G::kChunks) {
      cp_async_16_addr(dst + c * 16, valid ? src + c * 16 : src, valid ? 16u : 0u);
    }
  }
}

// f(r, ch) for every 16-byte chunk ch of rows [0, kRowCount), the CTA's threads taking chunks in turn.
template <class G, int kRowCount, class F>
__device__ __forceinline__ void mla_mma_for_chunks(int tid, F&& f) {
  constexpr int kTotal = kRowCount * G::kChunks;
#pragma unroll
  for (int k = 0; k < (kTotal + G::kThreads - 1) / G::kThreads; ++k) {
    const int c = tid + k * G::kThreads;
    if (kTotal % G::kThreads == 0 || c < kTotal) f(c / G::kChunks, c % G::kChunks);
  }
}

// bf16 Q rows [row0, row0 + kRows) into shared memory by cp.async (rows from rows_b on zero-filled).
template <class G>
__device__ __forceinline__ void mla_mma_load_q_async(u32 q_smem, const unsigned char* q_rows, int row0, int rows_b,
                                                      int tid) {
  mla_mma_for_chunks<G, G::kRows>(tid, [&](int r, int ch) {
    const bool valid = row0 + r < rows_b;
    cp_async_16_addr(q_smem + r * G::kPitchBytes + ch * 16, valid ? q_rows + r * G::kRowBytes + ch * 16 : q_rows,
                     valid ? 16u : 0u);
  });
}

// fp8 Q rows: small and read once, so plain loads widened to f16 on their way to shared memory.
template <class G>
__device__ __forceinline__ void mla_mma_load_q_widened(u32 q_smem, const unsigned char* q_rows, int row0, int rows_b,
                                                      int tid) {
  mla_mma_for_chunks<G, G::kRows>(tid, [&](int r, int ch) {
    U32x4 v{0u, 0u, 0u, 0u};
    if (row0 + r < rows_b) v = ldg128_stream(q_rows + r * G::kRowBytes + ch * 16);
    U32x4 lo, hi;
    e4m3x16_to_f16(v, lo, hi);
    sts128(q_smem + r * G::kPitchBytes + ch * 32, lo);
    sts128(q_smem + r * G::kPitchBytes + ch * 32 + 16, hi);
  });
}

// fp8: the staged e4m3 tile widened to f16 at `dst` (the MMA's operand layout).
template <class G>
__device__ __forceinline__ void mla_mma_widen_tile(u32 src, u32 dst, int tid) {
  mla_mma_for_chunks<G, G::kTile>(tid, [&](int r, int ch) {
    U32x4 lo, hi;
    e4m3x16_to_f16(lds128(src + r * G::kStagePitch + ch * 16), lo, hi);
    sts128(dst + r * G::kPitchBytes + ch * 32, lo);
    sts128(dst + r * G::kPitchBytes + ch * 32 + 16, hi);
  });
}

// S = Q K^T over the warp's token slice of the tile at `kt`, accumulated in kKSplit chains.
template <class G>
__device__ __forceinline__ void mla_mma_scores(float (&s)[G::kNT][4], const MlaMmaLane& ln, u32 kt) {
  float sacc[G::kKSplit][G::kNT][4];
#pragma unroll
  for (int a = 0; a < G::kKSplit; ++a)
#pragma unroll
    for (int j = 0; j < G::kNT; ++j) sacc[a][j][0] = sacc[a][j][1] = sacc[a][j][2] = sacc[a][j][3] = 0.f;
#pragma unroll
  for (int ks2 = 0; ks2 < kMlaDimQk / 32; ++ks2) {
    u32 a0[4], a1[4];
    ldsm_x4(a0, ln.q_lane + ks2 * 64);
    ldsm_x4(a1, ln.q_lane + ks2 * 64 + 32);
#pragma unroll
    for (int j = 0; j < G::kNT; ++j) {
      u32 bk[4];
      ldsm_x4(bk, kt + ln.k_lane + j * 8 * G::kPitchBytes + ks2 * 64);
      const u32 b0[2] = {bk[0], bk[1]};
      const u32 b1[2] = {bk[2], bk[3]};
      mma_16816<G::kF16>(sacc[(2 * ks2) % G::kKSplit][j], a0, b0);
      mma_16816<G::kF16>(sacc[(2 * ks2 + 1) % G::kKSplit][j], a1, b1);
    }
  }
#pragma unroll
  for (int j = 0; j < G::kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = sacc[0][j][e];
#pragma unroll
      for (int a = 1; a < G::kKSplit; ++a) v += sacc[a][j][e];
      s[j][e] = v;
    }
}

// A row pair's value across the column-group warps: lane 0 of each quad posts its warp's lo / hi row
// values at `red`, then every thread folds the kColGroups values of its rows with `op` from `init`.
template <class G, class Op>
__device__ __forceinline__ void mla_mma_across_warps(const MlaMmaLane& ln, u32 red, float lo, float hi, float init, Op op,
                                                     float& out_lo, float& out_hi) {
  if (ln.q4 == 0) {
    sts_f32(red + (ln.cg * G::kRows + ln.row_lo) * 4, lo);
    sts_f32(red + (ln.cg * G::kRows + ln.row_lo + 8) * 4, hi);
  }
  __syncthreads();
  out_lo = init;
  out_hi = init;
#pragma unroll
  for (int c = 0; c < G::kColGroupCount; ++c) {
    out_lo = op(out_lo, lds_f32(red + (c * G::kRows + ln.row_lo) * 4));
    out_hi = op(out_hi, lds_f32(red + (c * G::kRows + ln.row_lo + 8) * 4));
  }
}

// Masks and scales S (tokens from tile_t0), and returns the tile's row maxima across the column-group
// warps (through shared memory; ends with a CTA barrier).
template <class G>
__device__ __forceinline__ void mla_mma_row_max(float (&s)[G::kNT][4], const MlaMmaLane& ln, int tile_t0, int last_lo,
                                                int last_hi, float scale, float& tmax_lo, float& tmax_hi) {
  float mx_lo = neg_inf(), mx_hi = neg_inf();
#pragma unroll
  for (int j = 0; j < G::kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = tile_t0 + j * 8 + (e & 1);
      const float x = t <= (e < 2 ? last_lo : last_hi) ? s[j][e] * scale : neg_inf();
      s[j][e] = x;
      if (e < 2) mx_lo = fmaxf(mx_lo, x);
      else mx_hi = fmaxf(mx_hi, x);
    }
  mla_mma_across_warps<G>(ln, ln.red_max, quad_max(mx_lo), quad_max(mx_hi), neg_inf(),
                          [](float a, float b) { return fmaxf(a, b); }, tmax_lo, tmax_hi);
}

// P = exp2(S - m) into shared memory (bf16 with kSplitP: hi and the residual lo = P - hi, so P is
// kept to ~16 bits), the running sums l and O rescaled by alpha.
template <class G, bool kSplitP>
__device__ __forceinline__ void mla_mma_store_p(const float (&s)[G::kNT][4], const MlaMmaLane& ln, float muse_lo,
                                                float muse_hi, float alpha_lo, float alpha_hi, float& l_lo, float& l_hi,
                                                float (&o)[G::kOT][4]) {
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int j = 0; j < G::kNT; ++j) {
    const float p0 = fast_exp2(s[j][0] - muse_lo);
    const float p1 = fast_exp2(s[j][1] - muse_lo);
    const float p2 = fast_exp2(s[j][2] - muse_hi);
    const float p3 = fast_exp2(s[j][3] - muse_hi);
    sum_lo += p0 + p1;
    sum_hi += p2 + p3;
    const u32 hi01 = pack_p<G::kF16>(p0, p1);
    const u32 hi23 = pack_p<G::kF16>(p2, p3);
    sts32(ln.p_store + j * 16, hi01);
    sts32(ln.p_store + 8 * G::kPPitchBytes + j * 16, hi23);
    if constexpr (kSplitP) {
      sts32(ln.p_store + G::kPLoBytes + j * 16, pack_bf16x2(p0 - bf16x2_lo(hi01), p1 - bf16x2_hi(hi01)));
      sts32(ln.p_store + G::kPLoBytes + 8 * G::kPPitchBytes + j * 16,
            pack_bf16x2(p2 - bf16x2_lo(hi23), p3 - bf16x2_hi(hi23)));
    }
  }
  l_lo = l_lo * alpha_lo + sum_lo;
  l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
  for (int n = 0; n < G::kOT; ++n) {
    o[n][0] *= alpha_lo;
    o[n][1] *= alpha_lo;
    o[n][2] *= alpha_hi;
    o[n][3] *= alpha_hi;
  }
}

// O += P V over the warp's output column slice of the tile at `kt`.
template <class G, bool kSplitP>
__device__ __forceinline__ void mla_mma_pv(float (&o)[G::kOT][4], const MlaMmaLane& ln, u32 kt) {
#pragma unroll
  for (int ks = 0; ks < G::kTile / 16; ++ks) {
    u32 a[4], a_lo[4];
    ldsm_x4(a, ln.p_lane + ks * 32);
    if constexpr (kSplitP) ldsm_x4(a_lo, ln.p_lane + G::kPLoBytes + ks * 32);
#pragma unroll
    for (int jn = 0; jn < G::kOT / 2; ++jn) {
      u32 bv[4];
      ldsm_x4_trans(bv, kt + ln.v_lane + ks * 16 * G::kPitchBytes + jn * 32);
      const u32 b0[2] = {bv[0], bv[1]};
      const u32 b1[2] = {bv[2], bv[3]};
      mma_16816<G::kF16>(o[2 * jn], a, b0);
      mma_16816<G::kF16>(o[2 * jn + 1], a, b1);
      if constexpr (kSplitP) {
        mma_16816<G::kF16>(o[2 * jn], a_lo, b0);
        mma_16816<G::kF16>(o[2 * jn + 1], a_lo, b1);
      }
    }
  }
}

// Row sums across the column groups, then O / l to `out` (slot < 0: the piece is the whole request)
// or the normalised partial O and its LSE to `slot`.
template <class G>
__device__ __forceinline__ void mla_mma_epilogue(const MlaDecodeParams& p, const MlaPieceRows& pv, const MlaMmaLane& ln,
                                                 const float (&o)[G::kOT][4], float m_lo, float m_hi, float l_lo,
                                                 float l_hi, int row0, int slot) {
  float lt_lo, lt_hi;
  mla_mma_across_warps<G>(ln, ln.red_sum, quad_sum(l_lo), quad_sum(l_hi), 0.f, [](float a, float b) { return a + b; },
                          lt_lo, lt_hi);

  const int max_rows = mla_max_rows(p.heads, p.max_seq_len_q);
  const int col0 = ln.cg * G::kWarpCols + 2 * ln.q4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + ln.row_lo + half * 8;
    if (row >= pv.rows_b) continue;
    const float lt = half ? lt_hi : lt_lo;
    const float m = half ? m_hi : m_lo;
    if (slot < 0) {
      const float inv = lt > 0.f ? p.out_scale / lt : 0.f;  // nothing visible -> zeros
      u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(pv.tok0) * p.heads + row) * kMlaDimV + col0;
#pragma unroll
      for (int n = 0; n < G::kOT; ++n) {
        *reinterpret_cast<u32*>(out + n * 8) = pack_bf16x2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
      }
    } else {
      const long long idx = static_cast<long long>(slot) * max_rows + row;
      if (lt > 0.f) {
        const float inv = 1.f / lt;
        float* op = static_cast<float*>(p.o_partial) + idx * kMlaDimV + col0;
#pragma unroll
        for (int n = 0; n < G::kOT; ++n) {
          *reinterpret_cast<float2*>(op + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
        }
      }
      if (ln.cg == 0 && ln.q4 == 0) {
        static_cast<float*>(p.lse_partial)[idx] = lt > 0.f ? m + __log2f(lt) : neg_inf();
      }
    }
  }
}

// Rows [row0, row0 + 16 * kRowGroups) of `piece`; slot < 0: the piece is the whole request, write
// `out`; else write the normalised partial O and its LSE to `slot`.
template <int kPageSize, bool kFp8, int kRowGroups, int kColGroups, int kTileTokens, int kStages, bool kSplitP>
__device__ __forceinline__ void mla_mma_piece(const MlaDecodeParams& p, unsigned char* smem, const MlaPiece& piece,
                                              int row0, int slot) {
  static_assert(!(kFp8 && kSplitP), "fp8 pages run on one f16 P");
  using G = MlaMmaGeometry<kPageSize, kFp8, kRowGroups, kColGroups, kTileTokens, kStages>;
  const u32 sbase = smem_addr(smem);
  const u32 q_smem = sbase + G::kLayout.q_offset;
  const u32 stage_smem = sbase + G::kLayout.stage_offset;
  const MlaMmaLane ln = MlaMmaLane::make<G>(sbase, q_smem);
  const MlaPieceRows pv = mla_piece_rows<G::kRows, kTileTokens>(p, piece, row0);

  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  const int* bt_row = static_cast<const int*>(p.block_tables) + static_cast<long long>(pv.b) * p.block_table_stride;
  const unsigned char* q_rows =
      static_cast<const unsigned char*>(p.q) + (static_cast<long long>(pv.tok0) * p.heads + row0) * G::kRowBytes;
  if (pv.n_tiles > 0) {
    if constexpr (!kFp8) mla_mma_load_q_async<G>(q_smem, q_rows, row0, pv.rows_b, ln.tid);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < pv.n_tiles) mla_mma_load_tile<G>(kv, bt_row, pv, stage_smem, ln.tid, s, s);
      cp_async_commit();
    }
    // fp8 Q is widened while the KV prologue is in flight.
    if constexpr (kFp8) mla_mma_load_q_widened<G>(q_smem, q_rows, row0, pv.rows_b, ln.tid);
  }

  const int last_lo = mla_row_last(p, pv, row0 + ln.row_lo);
  const int last_hi = mla_row_last(p, pv, row0 + ln.row_lo + 8);
  const float scale = p.scale_log2;

  float o[G::kOT][4];
#pragma unroll
  for (int n = 0; n < G::kOT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_lo = neg_inf(), m_hi = neg_inf();
  float l_lo = 0.f, l_hi = 0.f;

  for (int it = 0; it < pv.n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; everyone is done with iteration it - 1
    {
      const int next = it + kStages - 1;
      if (next < pv.n_tiles) mla_mma_load_tile<G>(kv, bt_row, pv, stage_smem, ln.tid, next, next % kStages);
      cp_async_commit();
    }
    const u32 staged = stage_smem + (it % kStages) * G::kLayout.stage_bytes;
    u32 kt = staged;
    if constexpr (kFp8) {
      kt = sbase + G::kLayout.tile_offset;
      mla_mma_widen_tile<G>(staged, kt, ln.tid);
      __syncthreads();
    }

    float s[G::kNT][4];
    mla_mma_scores<G>(s, ln, kt);
    float tmax_lo, tmax_hi;
    mla_mma_row_max<G>(s, ln, pv.t0 + it * kTileTokens + ln.cg * G::kWarpTokens + 2 * ln.q4, last_lo, last_hi, scale,
                       tmax_lo, tmax_hi);
    const auto [muse_lo, alpha_lo] = online_softmax_step(m_lo, tmax_lo);
    const auto [muse_hi, alpha_hi] = online_softmax_step(m_hi, tmax_hi);
    mla_mma_store_p<G, kSplitP>(s, ln, muse_lo, muse_hi, alpha_lo, alpha_hi, l_lo, l_hi, o);
    __syncthreads();  // P complete for the whole tile
    mla_mma_pv<G, kSplitP>(o, ln, kt);
  }
  cp_async_wait<0>();
  mla_mma_epilogue<G>(p, pv, ln, o, m_lo, m_hi, l_lo, l_hi, row0, slot);
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
