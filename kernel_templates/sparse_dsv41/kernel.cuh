#pragma once
// Sparse MLA decode over the DeepSeek-V4.1 cache (528 B FP8 main records, optional 288 B FP4 extra
// records), portable configuration: the NVFP4 family's compact mma.sync decode body
// (sparse_nvfp4/kernel.cuh, fits 99 KiB) with this format's Q staging, gather and record decode.
// Q stays bf16 and every decoded row is exact bf16, so QK and PV run on bf16 operands throughout and
// P is rounded to bf16 once.
#include "sparse_dsv41/decode.cuh"
#include "sparse_dsv41/params.cuh"
#include "sparse_nvfp4/kernel.cuh"

namespace kiln {

#ifdef __CUDACC__
namespace dsv41 {

// One candidate's record half in registers: units 2k + half of the data row (16 of 32 main units,
// or 8 of 16 extra ones, so a lane pair reads whole 32-byte sectors) and the scale bytes they need.
struct Record {
  U32x4 data[16];
  U32x4 scales[2];  // main: scales[0] holds all 16 UE8M0 bytes; extra: the 32 E4M3 bytes
  bool extra;
};

struct Format {
  static constexpr bool kF16Nope = false;
  static constexpr float kNopeUndo = 1.0f;
  using Record = dsv41::Record;

  template <bool kHasExtra>
  __device__ static __forceinline__ bool load(const SparseNvfp4Params& p, const sparse_detail::TokenWork& w, int t, int chunk, int cand,
                                              int half, Record& rec) {
    const sparse_detail::CandidateRecord r =
        sparse_detail::locate_candidate<kHasExtra, kDsv41MainDataBytes, kDsv41MainScaleBytes, kDsv41ExtraDataBytes, kDsv41ExtraScaleBytes>(
            p, w, t, chunk, cand, half * 16, 0);
    rec.extra = kHasExtra && chunk >= w.main_chunks;
    if (!rec.extra) {
#pragma unroll
      for (int k = 0; k < 16; ++k) rec.data[k] = ldg128_if(r.data + 32 * k, r.valid);
      rec.scales[0] = ldg128_if(r.scales, r.valid);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) rec.data[k] = ldg128_if(r.data + 32 * k, r.valid);
      rec.scales[0] = ldg128_if(r.scales, r.valid);
      rec.scales[1] = ldg128_if(r.scales + 16, r.valid);
    }
    return r.valid;
  }

  // Tile row layout as in the NVFP4 body: 16-byte piece j (dims 8j .. 8j + 7) at (j ^ (cand & 7)) * 16.
  // `unit(k)` is the record half's k-th 16-byte data unit (unit 2k + half of the row), `sc` its
  // scale bytes as words: a main record's 16 UE8M0 bytes, an extra record's 32 E4M3 bytes.
  __device__ static __forceinline__ void put(u8* tile_row, int cand, int piece, u32 a, u32 b, u32 c, u32 d) {
    *reinterpret_cast<uint4*>(tile_row + ((piece ^ (cand & 7)) * 16)) = make_uint4(a, b, c, d);
  }
  template <class Unit>
  __device__ static __forceinline__ void decode_main(Unit unit, const u32 (&sc)[4], u8* tile_row, int cand, int half) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int u = 2 * k + half;  // dims 16u .. 16u + 15, scale group u / 2 = k
      u32 o[8];
      e4m3x16_to_bf16(unit(k), ue8m0_to_bf16x2(sc[k >> 2], u32(k & 3)), o);
      put(tile_row, cand, 2 * u, o[0], o[1], o[2], o[3]);
      put(tile_row, cand, 2 * u + 1, o[4], o[5], o[6], o[7]);
    }
  }
  template <class Unit>
  __device__ static __forceinline__ void decode_extra(Unit unit, const u32 (&sc)[8], u8* tile_row, int cand, int half) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int u = 2 * k + half;  // dims 32u .. 32u + 31, scale groups 2u, 2u + 1 (bytes 4k + 2 half ..)
      const U32x4 c = unit(k);
      const u32 words[4] = {c.x, c.y, c.z, c.w};
      u32 o[4][4];
      e2m1x32_to_bf16(words, u16(sc[k] >> (16 * half)), o);
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) put(tile_row, cand, 4 * u + wi, o[wi][0], o[wi][1], o[wi][2], o[wi][3]);
    }
  }

  __device__ static __forceinline__ void decode(const Record& rec, u8* tile_row, int cand, int half) {
    const auto unit = [&](int k) { return rec.data[k]; };
    if (!rec.extra) {
      const u32 sc[4] = {rec.scales[0].x, rec.scales[0].y, rec.scales[0].z, rec.scales[0].w};
      decode_main(unit, sc, tile_row, cand, half);
    } else {
      const u32 sc[8] = {rec.scales[0].x, rec.scales[0].y, rec.scales[0].z, rec.scales[0].w,
                         rec.scales[1].x, rec.scales[1].y, rec.scales[1].z, rec.scales[1].w};
      decode_extra(unit, sc, tile_row, cand, half);
    }
  }

  // Staged configuration (sm_90a): raw stage rows of kDsv41StageRowBytes.
  static constexpr unsigned kStageRowBytes = kDsv41StageRowBytes;
  static constexpr bool kAsyncGather = false;
  template <bool kHasExtra>
  __device__ static __forceinline__ bool gather_bulk(const SparseNvfp4Params& p, const sparse_detail::TokenWork& w, int t, int chunk,
                                                     int cand, int half, u8* stage_row, u32 bar_raw, u32& bytes) {
    return sparse_detail::load_candidate_bulk<kHasExtra, kDsv41MainDataBytes, kDsv41MainScaleBytes, kDsv41ExtraDataBytes,
                                              kDsv41ExtraScaleBytes>(p, w, t, chunk, cand, half, stage_row, bar_raw, bytes);
  }
  __device__ static __forceinline__ void decode_staged(const u8* stage_row, u8* tile_row, int cand, int half, bool extra) {
    const auto unit = [&](int k) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage_row + (2 * k + half) * 16);
      return U32x4{v.x, v.y, v.z, v.w};
    };
    if (!extra) {
      const uint4 s0 = *reinterpret_cast<const uint4*>(stage_row + kDsv41MainDataBytes);
      const u32 sc[4] = {s0.x, s0.y, s0.z, s0.w};
      decode_main(unit, sc, tile_row, cand, half);
    } else {
      const uint4 s0 = *reinterpret_cast<const uint4*>(stage_row + kDsv41ExtraDataBytes);
      const uint4 s1 = *reinterpret_cast<const uint4*>(stage_row + kDsv41ExtraDataBytes + 16);
      const u32 sc[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      decode_extra(unit, sc, tile_row, cand, half);
    }
  }

  // Q rows head0 .. head0 + kRows - 1 copied as bf16 (rows past H are zero); the rows' 64 pieces are
  // dealt round-robin to kThreads threads, every load issued before the first store.
  template <int kRows, int kThreads>
  __device__ static __forceinline__ void stage_q(const SparseNvfp4Params& p, int t, int head0, u8* q_smem, int idx) {
    constexpr int kPieces = kRows * 64, kPer = (kPieces + kThreads - 1) / kThreads;
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.q) + (long long)t * p.heads * 512);
    uint4 v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int u = idx + k * kThreads, r = u / 64, head = head0 + r;
      v[k] = make_uint4(0u, 0u, 0u, 0u);
      if (u < kPieces && head < p.heads) v[k] = __ldg(q + (long long)head * 64 + (u - r * 64));
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int u = idx + k * kThreads, r = u / 64, j = u - r * 64;
      if (u < kPieces) *reinterpret_cast<uint4*>(q_smem + r * sparse_detail::kTileRow + ((j ^ (r & 7)) * 16)) = v[k];
    }
  }
};

}  // namespace dsv41

// H (p.heads: 8, 16, 32, 48, ..., 128) is a run-time value. kHasExtra: an FP4 extra cache shares the softmax.
// At run time p.split: write mid_out/mid_lse, merged by sparse_nvfp4_merge_kernel. This kernel is
// the compact body, every target's.
template <bool kHasExtra>
__global__ void __launch_bounds__(kDsv41SmallThreads, 1) sparse_dsv41_decode_kernel(const __grid_constant__ SparseNvfp4Params p) {
  static_assert(kDsv41SmallThreads == sparse_block_threads(1), "the portable variant is the compact body");
  sparse_detail::sparse_decode<dsv41::Format, 1, kHasExtra, true>(p);
}

// The staged body (sm_90a; SparseNvfp4Params::bulk_gather set, sparse_dsv41_staged_smem_bytes): records
// by bulk copies into raw stages, two decoded tiles. A kernel of its own, so that the compact one
// keeps its own registers and code. Elsewhere an empty kernel, which the launcher never picks.
template <bool kHasExtra>
__global__ void __launch_bounds__(kDsv41SmallThreads, 1) sparse_dsv41_staged_kernel(const __grid_constant__ SparseNvfp4Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  sparse_detail::sparse_decode<dsv41::Format, 1, kHasExtra, false>(p);
#endif
}

#endif  // __CUDACC__

}  // namespace kiln
