#pragma once
// Sparse MLA decode over the NVFP4 cache, Hopper (sm_90a), with a ring of raw stages: the same
// function, block shape and grid as sparse_nvfp4_sm90_kernel (kernel_sm90.cuh), but candidates flow
// through the CTA in 32-record tiles so that more of them are in flight:
//  - WG2 (producer): a ring of four 32-record raw stages. Each thread's cp.asyncs of a stage arrive
//    on the stage's "full" mbarrier when they land (cp.async.mbarrier.arrive), so three stages
//    (96 records, 38 KB) are in flight while the fourth is decoded; a stage is gathered again once
//    every producer thread has arrived on its "empty" mbarrier (its records are in registers).
//    Gather: warp pw copies rows 8 pw .. 8 pw + 7 of a stage, a warp's lanes along one record.
//    Decode: warp pw turns part pw of all 32 records (lane = record) into a decoded tile: code
//    units 4pw..4pw+3 for pw < 2; code units 8..10 or 11..13 plus half the RoPE dims for pw >= 2
//    (a RoPE copy costs about a quarter of a code unit's decode, so the parts take equal time).
//  - Three decoded 32-candidate tiles (f16 NoPE * 2^-7, bf16 RoPE) between the producer and the
//    consumers, so the producer may run two tiles ahead of S.
//  - WG0: S = Q K^T (64 heads x 32 candidates), the online softmax, O[:, 0:256] += P V; WG1:
//    O[:, 256:512] += P V with P handed over through shared memory. As in kernel_sm90.cuh.
// A tile uses the no-swizzle core-matrix layout with 32 rows: dims 8g..8g+7 of row r at g * 512 + r * 16.
#include "sparse_nvfp4/kernel_sm90.cuh"

namespace kiln {

#ifdef __CUDACC__
namespace sparse_sm90_ring {

using sparse_sm90::kRawRow;
constexpr int kTile = kSparseSm90RingTile;       // candidates per decoded tile and per raw stage
constexpr int kTiles = 3;                        // decoded tiles
constexpr int kStages = 4;                       // raw stages
constexpr u32 kGroupStride = 16u * kTile;        // bytes between 8-dim groups of a tile
constexpr u32 kTileBytes = 64u * kGroupStride;   // 512 dims
constexpr u32 kStageBytes = kTile * kRawRow;

constexpr u32 kQOff = 0;                                // Q: 64 rows x 512 dims x 2 B (as kernel_sm90.cuh)
constexpr u32 kTileOff = kQOff + 65536u;
constexpr u32 kRawOff = kTileOff + kTiles * kTileBytes;
constexpr u32 kPOff = kRawOff + kStages * kStageBytes;  // P fragments: [k-step 2][thread 128] x 16 B
constexpr u32 kAlphaOff = kPOff + 4096u;                // float[64]
constexpr u32 kFactorOff = kAlphaOff + 256u;            // float[64]
constexpr u32 kMaskOff = kFactorOff + 256u;             // u32 per decoded tile (bit c: candidate c is valid)
constexpr u32 kBarOff = kMaskOff + 16u;
// mbarriers (8 B each): tile full [3], tile empty [3], P free, raw full [4], raw empty [4].
constexpr u32 kBarTileFull = kBarOff, kBarTileEmpty = kBarTileFull + 8u * kTiles, kBarPFree = kBarTileEmpty + 8u * kTiles;
constexpr u32 kBarRawFull = kBarPFree + 8u, kBarRawEmpty = kBarRawFull + 8u * kStages;
static_assert(kBarRawEmpty + 8u * kStages == sparse_sm90_ring_smem_bytes(), "carve-up and launch size disagree");
static_assert(sparse_sm90_ring_smem_bytes() <= 232448u, "the sm_90 opt-in limit per block");

// Decode part kPart (0..3) of a tile: code units kU0 .. kU0 + kUnits - 1 and RoPE units kRope0 ..
// kRope0 + kRopes - 1 (8 bf16 dims each); scale words kU0 / 2 and kU0 / 2 + 1 of the record.
template <int kPart>
struct Part {
  static constexpr int kU0 = kPart < 2 ? 4 * kPart : 8 + 3 * (kPart - 2);
  static constexpr int kUnits = kPart < 2 ? 4 : 3;
  static constexpr int kRope0 = kPart < 2 ? 0 : 4 * (kPart - 2);
  static constexpr int kRopes = kPart < 2 ? 0 : 4;
};

// Reads part kPart of record `row` (this lane's), releases the raw stage, waits for the decoded tile
// to be free (when `wait_tile`), then writes the part into row `tile` (this lane's row address).
template <int kPart>
__device__ __forceinline__ void decode_part(u32 row, u32 tile, u32 raw_empty, bool wait_tile, u32 tile_empty, u32 tile_parity) {
  using P = Part<kPart>;
  U32x4 code[P::kUnits], rope[P::kRopes > 0 ? P::kRopes : 1];
#pragma unroll
  for (int k = 0; k < P::kUnits; ++k) code[k] = lds128(row + 16 * (P::kU0 + k));
#pragma unroll
  for (int k = 0; k < P::kRopes; ++k) rope[k] = lds128(row + 224 + 16 * (P::kRope0 + k));
  const u32 sw[2] = {sparse_sm90::lds_u32(row + sparse_detail::kDataBytes + 4 * (P::kU0 / 2)),
                     sparse_sm90::lds_u32(row + sparse_detail::kDataBytes + 4 * (P::kU0 / 2) + 4)};
  mbar_arrive(raw_empty);
  if (wait_tile) mbar_wait(tile_empty, tile_parity);
#pragma unroll
  for (int k = 0; k < P::kRopes; ++k) sts128(tile + (56 + P::kRope0 + k) * kGroupStride, rope[k]);
#pragma unroll
  for (int k = 0; k < P::kUnits; ++k) {
    constexpr int kW0 = P::kU0 / 2;
    const int u = P::kU0 + k;
    sparse_sm90::decode_unit<kGroupStride>(code[k], sw[(u >> 1) - kW0] >> (16 * (u & 1)), tile, u);
  }
}

}  // namespace sparse_sm90_ring

// Same template arguments, grid and outputs as sparse_nvfp4_sm90_kernel.
template <int kHeads, bool kHasExtra, bool kSplit>
__global__ void __launch_bounds__(kSparseSm90Threads, 1) sparse_nvfp4_sm90_ring_kernel(const __grid_constant__ SparseNvfp4Params p) {
  using namespace sparse_detail;
  using namespace sparse_sm90;
  using namespace sparse_sm90_ring;
  using namespace sm90;
  using sparse_sm90_ring::kBarOff;
  using sparse_sm90_ring::kFactorOff;
  using sparse_sm90_ring::kAlphaOff;
  using sparse_sm90_ring::kMaskOff;
  using sparse_sm90_ring::kPOff;
  using sparse_sm90_ring::kQOff;
  using sparse_sm90_ring::kRawOff;
  using sparse_sm90_ring::kTileBytes;
  using sparse_sm90_ring::kTileOff;
  static_assert(kHeads % 8 == 0 && kHeads >= 8 && kHeads <= 128, "H must be a multiple of 8 in [8, 128]");
  constexpr int kGroups = sparse_sm90_head_groups(kHeads);

  allow_dependent_grid();  // programmatic dependent launch: sparse_detail
  extern __shared__ __align__(1024) u8 smem[];
  const u32 sbase = smem_addr(smem);
  const u32 bar_full = sbase + kBarTileFull, bar_empty = sbase + kBarTileEmpty, bar_p_free = sbase + kBarPFree;
  const u32 raw_full = sbase + kBarRawFull, raw_empty = sbase + kBarRawEmpty;

  const int tid = threadIdx.x;
  int bx = blockIdx.x;
  const int group = bx % kGroups;
  bx /= kGroups;
  const int split = kSplit ? bx % p.num_splits : 0;
  const int t = kSplit ? bx / p.num_splits : bx;
  const int head0 = group * kSparseSm90Heads;

  if (tid == 0) {
    for (int b = 0; b < kTiles; ++b) {
      mbar_init(bar_full + 8 * b, 128);
      mbar_init(bar_empty + 8 * b, kConsumers);
    }
    mbar_init(bar_p_free, 128);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(raw_full + 8 * s, 128);
      mbar_init(raw_empty + 8 * s, 128);
    }
    mbar_fence_init();
  }
  wait_for_prior_grid();  // the first read of an input
  const TokenWork work = token_work<kHasExtra>(p, t);
  const int c_begin = kSplit ? split * p.chunks_per_block : 0;
  int c_end = kSplit ? c_begin + p.chunks_per_block : work.total_chunks;
  if (c_end > work.total_chunks) c_end = work.total_chunks;
  // Two 32-candidate tiles per 64-slot chunk of the plan.
  const int n_tiles = c_end > c_begin ? 2 * (c_end - c_begin) : 0;
  __syncthreads();

  const int lane = tid & 31;
  if (tid >= kConsumers) {
    // ------------------------------ producer warpgroup ------------------------------
    setmaxnreg_dec<kRegsProducer>();
    if (n_tiles == 0) return;
    const int pw = (tid - kConsumers) >> 5;
    // Gather role: lane l < 8 holds record 8 pw + l's data address, lane 8 + l its scale address.
    const int my_rec = 8 * pw + (lane & 7);
    const bool scale_lane = (lane & 8) != 0;
    const u8* fallback = static_cast<const u8*>(p.kv);
    auto slot_of = [&](int j) {
      return j < n_tiles ? load_slot_index<kHasExtra>(p, work, t, c_begin + (j >> 1), kTile * (j & 1) + my_rec) : SlotIndex{0, false};
    };
    u32 valid_ring = 0;  // byte s: this warp's 8 valid bits of the tile in stage s
    auto gather_tile = [&](int j, SlotIndex si) {
      const int s = j & (kStages - 1);
      const u64 addr = lane < 16 ? record_addr<kHasExtra>(p, work, c_begin + (j >> 1), si, scale_lane) : 0;
      const u32 bits = __ballot_sync(0xffffffffu, addr != 0) & 0xffu;
      valid_ring = (valid_ring & ~(0xffu << (8 * s))) | (bits << (8 * s));
      gather_rows<8, false>(fallback, addr, sbase + kRawOff + u32(s) * kStageBytes + u32(8 * pw) * kRawRow, lane);
      cp_async_mbar_arrive(raw_full + 8 * s);
    };
    {
      const SlotIndex s0 = slot_of(0), s1 = slot_of(1), s2 = slot_of(2);
      gather_tile(0, s0);
      gather_tile(1, s1);
      if (n_tiles > 2) gather_tile(2, s2);
    }
    SlotIndex next = slot_of(3);
    int b = 0;
    u32 tile_phase = 0;
    for (int j = 0; j < n_tiles; ++j) {
      if (j + 3 < n_tiles) {
        // Stage (j + 3) % 4 last held tile j - 1: every producer thread has read it once its empty
        // barrier completes.
        if (j > 0) mbar_wait(raw_empty + 8 * ((j + 3) & 3), u32(((j - 1) >> 2) & 1));
        gather_tile(j + 3, next);
        next = slot_of(j + 4);
      }
      const int s = j & (kStages - 1);
      mbar_wait(raw_full + 8 * s, u32((j >> 2) & 1));
      const u32 row = sbase + kRawOff + u32(s) * kStageBytes + u32(lane) * kRawRow;
      const u32 tile = sbase + kTileOff + u32(b) * kTileBytes + u32(lane) * 16;
      const bool wait_tile = j >= kTiles;
      const u32 empty_bar = bar_empty + 8 * b, empty_parity = tile_phase ^ 1u;
      // The part is warp-uniform; each instance indexes its registers with constants.
      switch (pw) {
        case 0: decode_part<0>(row, tile, raw_empty + 8 * s, wait_tile, empty_bar, empty_parity); break;
        case 1: decode_part<1>(row, tile, raw_empty + 8 * s, wait_tile, empty_bar, empty_parity); break;
        case 2: decode_part<2>(row, tile, raw_empty + 8 * s, wait_tile, empty_bar, empty_parity); break;
        default: decode_part<3>(row, tile, raw_empty + 8 * s, wait_tile, empty_bar, empty_parity); break;
      }
      if (lane == 0) {
        const u32 bits = (valid_ring >> (8 * s)) & 0xffu;
        asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(sbase + kMaskOff + 4 * b + pw), "r"(bits));
      }
      fence_proxy_async_smem();
      mbar_arrive(bar_full + 8 * b);
      if (++b == kTiles) {
        b = 0;
        tile_phase ^= 1u;
      }
    }
    return;
  }

  // ------------------------------ consumer warpgroups ------------------------------
  const int wg = tid >> 7;
  const int wtid = tid & 127, w = wtid >> 5, g = lane >> 2, q4 = lane & 3;
  const u32 q_smem = sbase + kQOff;
  if (wg == 0) setmaxnreg_inc<kRegsWg0>();
  else setmaxnreg_inc<kRegsWg1>();
  stage_q<kHeads>(p, t, head0, q_smem, tid);
  fence_proxy_async_smem();
  named_barrier_sync(kBarQ, kConsumers);

  const int row_lo = 16 * w + g;  // this thread's accumulator rows: row_lo and row_lo + 8

  if (wg == 0) {
    // ---- WG0: S = Q K^T, softmax, O[:, 0:256] ----
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float s[16];
    // P of the tile whose P V is in flight: the wgmma reads these registers until the next wait.
    u32 pf[2][4] = {};
    float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.0f, 0.0f};
    const float scale_log2 = p.sm_scale_log2 * kKScaleUndo;
    int b = 0, b_prev = 0;
    u32 phase = 0;
    for (int j = 0; j < n_tiles; ++j) {
      const u32 kt = sbase + kTileOff + u32(b) * kTileBytes;
      mbar_wait(bar_full + 8 * b, phase);
      wgmma_fence_operand(s);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 28; ++ks)
        wgmma_m64n32k16_ss_f16(s, smem_desc(q_smem + ks * 2048, 1024, 128), smem_desc(kt + ks * 2 * kGroupStride, kGroupStride, 128), ks > 0);
#pragma unroll
      for (int ks = 28; ks < 32; ++ks)
        wgmma_m64n32k16_ss_bf16(s, smem_desc(q_smem + ks * 2048, 1024, 128), smem_desc(kt + ks * 2 * kGroupStride, kGroupStride, 128), 1);
      wgmma_commit();
      wgmma_wait<0>();  // S(j) and P V(j - 1)
      wgmma_fence_operand(s);
      wgmma_fence_operand(o);
      pin_u32(pf);
      if (j > 0) mbar_arrive(bar_empty + 8 * b_prev);
      const u32 mask = lds_u32(sbase + kMaskOff + 4 * b);
      float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int col = 8 * (e >> 2) + 2 * q4 + (e & 1);
        const float v = ((mask >> col) & 1u) ? s[e] * scale_log2 : neg_inf();
        s[e] = v;
        mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], v);
      }
      float alpha[2], m_use[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float m_new = fmaxf(m_run[hr], quad_max(mx[hr]));
        m_use[hr] = m_new == neg_inf() ? 0.0f : m_new;
        alpha[hr] = fast_exp2(m_run[hr] - m_use[hr]);
        m_run[hr] = m_new;
      }
      float psum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int e = 8 * kk + 2 * r;
          const float p0 = fast_exp2(s[e] - m_use[r & 1]);
          const float p1 = fast_exp2(s[e + 1] - m_use[r & 1]);
          psum[r & 1] += p0 + p1;
          pf[kk][r] = pack_f16x2(p0, p1);
        }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) l_run[hr] = l_run[hr] * alpha[hr] + psum[hr];
#pragma unroll
      for (int e = 0; e < 128; ++e) o[e] *= alpha[(e >> 1) & 1];

      if (j > 0) mbar_wait(bar_p_free, u32((j - 1) & 1));  // WG1 holds tile j - 1's P and alphas
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) sts128(sbase + kPOff + (kk * 128 + wtid) * 16, U32x4{pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]});
      if (q4 == 0) {
        sts_f32(sbase + kAlphaOff + row_lo * 4, alpha[0]);
        sts_f32(sbase + kAlphaOff + (row_lo + 8) * 4, alpha[1]);
      }
      named_arrive(kBarPReady, kConsumers);

      wgmma_fence_operand(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) wgmma_m64n256k16_rs_f16(o, pf[kk], smem_desc(kt + kk * 256, 128, kGroupStride));
      wgmma_commit();
      b_prev = b;
      if (++b == kTiles) {
        b = 0;
        phase ^= 1u;
      }
    }
    wgmma_wait<0>();
    wgmma_fence_operand(o);
    pin_u32(pf);
    if (n_tiles > 0) mbar_arrive(bar_empty + 8 * b_prev);
    wg0_epilogue<kHeads, kSplit>(p, o, m_run, l_run, t, split, head0, row_lo, q4, sbase + kFactorOff);
  } else {
    // ---- WG1: O[:, 256:448] (f16 P) and O[:, 448:512] (bf16 P) ----
    float o_nope[96], o_rope[32];
#pragma unroll
    for (int i = 0; i < 96; ++i) o_nope[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) o_rope[i] = 0.0f;
    int b = 0;
    u32 phase = 0;
    for (int j = 0; j < n_tiles; ++j) {
      const u32 kt = sbase + kTileOff + u32(b) * kTileBytes;
      named_barrier_sync(kBarPReady, kConsumers);
      const float alpha[2] = {lds_f32(sbase + kAlphaOff + row_lo * 4), lds_f32(sbase + kAlphaOff + (row_lo + 8) * 4)};
      u32 pf[2][4], pb[2][4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const U32x4 v = lds128(sbase + kPOff + (kk * 128 + wtid) * 16);
        pf[kk][0] = v.x;
        pf[kk][1] = v.y;
        pf[kk][2] = v.z;
        pf[kk][3] = v.w;
      }
      if (j + 1 < n_tiles) mbar_arrive(bar_p_free);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) pb[kk][r] = f16x2_to_bf16x2(pf[kk][r]);
#pragma unroll
      for (int e = 0; e < 96; ++e) o_nope[e] *= alpha[(e >> 1) & 1];
#pragma unroll
      for (int e = 0; e < 32; ++e) o_rope[e] *= alpha[(e >> 1) & 1];
      mbar_wait(bar_full + 8 * b, phase);  // orders the producer's tile writes before the reads below
      wgmma_fence_operand(o_nope);
      wgmma_fence_operand(o_rope);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        wgmma_m64n192k16_rs_f16(o_nope, pf[kk], smem_desc(kt + 32 * kGroupStride + kk * 256, 128, kGroupStride));
        wgmma_m64n64k16_rs_bf16(o_rope, pb[kk], smem_desc(kt + 56 * kGroupStride + kk * 256, 128, kGroupStride));
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(o_nope);
      wgmma_fence_operand(o_rope);
      pin_u32(pf);
      pin_u32(pb);
      mbar_arrive(bar_empty + 8 * b);
      if (++b == kTiles) {
        b = 0;
        phase ^= 1u;
      }
    }
    wg1_epilogue<kHeads, kSplit>(p, o_nope, o_rope, t, split, head0, row_lo, q4, sbase + kFactorOff);
  }
}

#endif  // __CUDACC__

}  // namespace kiln
