#pragma once
// The combine of split MLA requests: its own module (family mla_combine), shared by every decode key
// with the same heads, query rows and packing, whatever their dtype, mask or precision.
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/pdl.cuh"
#include "common/softmax.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

// 16 bytes from global memory when `pred`, else zeros: a plain (coherent) load, since the data was
// written by the preceding kernel, and volatile so it stays after the dependency wait.
__device__ __forceinline__ U32x4 ld128_if(const void* p, bool pred) {
  U32x4 v{0u, 0u, 0u, 0u};
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n @q ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
               : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
               : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}

__device__ __forceinline__ float ld_f32(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ int ld_s32(const int* p) {
  int v;
  asm volatile("ld.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

}  // namespace mla_detail

// The combine merges the pieces of a split request: out = bmm2_scale * sum_s w_s O_s / sum_s w_s
// with w_s = 2^(lse_s - max lse). Pieces that saw no key (lse -inf) are skipped without reading their
// O, which the decode kernel never wrote. A row's warps take its pieces in turn (all 512 columns, 16
// per lane, four pieces' loads in flight per warp); several warps' sums meet in shared memory.
// Requests in one piece were written by the decode kernel itself. Three forms, as the planner picks
// from the pieces a request is expected to have: a warp per row, four rows per CTA (a few pieces),
// 4 warps per row (tens: few registers, many CTAs per SM), both one kernel, and 8 warps with every
// piece's weight read into registers first (a request in up to 65 pieces: its loads in two rounds).
namespace mla_detail {

// Before the combine's first global read (qo_indptr too: with the decode grid launched early, the
// kernel that wrote it may not have completed when this grid starts). The next kernel in the stream
// may be scheduled at once: it waits for this grid in turn.
__device__ __forceinline__ void mla_combine_wait() {
  pdl_launch_dependents();
  pdl_wait();  // the decode kernel's pieces and split records are complete and visible
}

// Where the combine of (row, request b) reads: the request's rows and its split record. Returns
// false when the CTA has nothing to do (a row past the request's, or an unsplit request).
template <int kHeads, int kMaxSeqLenQ, bool kPacked>
__device__ __forceinline__ bool mla_combine_begin(const MlaDecodeParams& p, int b, int row, int& tok0, int& first, int& n) {
  int q_len;
  if constexpr (kPacked) {
    tok0 = load_i32(p.qo_indptr, b);
    q_len = load_i32(p.qo_indptr, b + 1) - tok0;
  } else {
    tok0 = b * kMaxSeqLenQ;
    q_len = kMaxSeqLenQ;
  }
  if (row >= q_len * kHeads) return false;
  const int* meta = static_cast<const int*>(p.split_meta) + 2 * b;
  first = ld_s32(meta);
  n = ld_s32(meta + 1);
  return n > 1;
}

// A piece's weight 2^(lse - mx): 0 for a piece that saw no key (lse -inf).
__device__ __forceinline__ float mla_combine_weight(float lse, float mx) {
  return lse == neg_inf() ? 0.f : fast_exp2(lse - mx);
}

// The max and the weight sum over a row's n pieces (their lse `stride` floats apart), every lane
// of the warp getting both.
__device__ __forceinline__ void mla_combine_max_wsum(const float* lse, int n, int stride, int lane, float& mx, float& wsum) {
  mx = neg_inf();
  for (int s = lane; s < n; s += 32) mx = fmaxf(mx, ld_f32(lse + s * stride));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  wsum = 0.f;
  for (int s = lane; s < n; s += 32) {
    const float l = ld_f32(lse + s * stride);
    wsum += mla_combine_weight(l, mx);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
}

// acc += w * O of piece s (this lane's 16 columns), for kBatch pieces whose weights are ws[].
template <int kBatch>
__device__ __forceinline__ void mla_combine_accumulate(const float* o, long long slot_stride, const int (&s)[kBatch],
                                                       const float (&ws)[kBatch], float (&acc)[16]) {
  U32x4 v[kBatch][4];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[u][k] = ld128_if(o + s[u] * slot_stride + 128 * k, ws[u] > 0.f);
  }
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc[4 * k + 0] += ws[u] * __uint_as_float(v[u][k].x);
      acc[4 * k + 1] += ws[u] * __uint_as_float(v[u][k].y);
      acc[4 * k + 2] += ws[u] * __uint_as_float(v[u][k].z);
      acc[4 * k + 3] += ws[u] * __uint_as_float(v[u][k].w);
    }
  }
}

// The warps' sums meet in shared memory; thread t writes columns 2 t and 2 t + 1.
template <int kHeads, int kWarps>
__device__ __forceinline__ void mla_combine_store(const MlaDecodeParams& p, float (&part_sum)[kWarps][kMlaDimV],
                                                  const float (&acc)[16], float wsum, int tok0, int row) {
  constexpr int kCols = kMlaDimV / (32 * kWarps);
  static_assert(kCols == 2, "eight warps: a column pair per thread");
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    *reinterpret_cast<float4*>(&part_sum[warp][128 * k + 4 * lane]) =
        make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]);
  }
  __syncthreads();
  const int col = kCols * threadIdx.x;
  float r[kCols] = {};
#pragma unroll
  for (int w2 = 0; w2 < kWarps; ++w2) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) r[c] += part_sum[w2][col + c];
  }
  const float inv = wsum > 0.f ? p.out_scale / wsum : 0.f;
  u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * kHeads + row) * kMlaDimV + col;
  *reinterpret_cast<u32*>(out) = pack_bf16x2(r[0] * inv, r[1] * inv);
}

// The combine of one row by one warp (p.combine_row_warps == 1): for requests in a few pieces, where
// a warp holds all of a row's loads in flight at once and a CTA per row would spend its time starting
// and stopping (an unsplit request's rows, which have nothing to merge, cost a CTA each there).
template <int kHeads, int kMaxSeqLenQ, bool kPacked>
__device__ __forceinline__ void mla_combine_row_by_warp(const MlaDecodeParams& p, int b, int row) {
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
  const int lane = threadIdx.x & 31;
  int tok0, first, n;
  if (!mla_combine_begin<kHeads, kMaxSeqLenQ, kPacked>(p, b, row, tok0, first, n)) return;

  const long long slot0 = static_cast<long long>(b) + first;
  const float* lse = static_cast<const float*>(p.lse_partial) + slot0 * kMaxRows + row;
  float mx, wsum;
  mla_combine_max_wsum(lse, n, kMaxRows, lane, mx, wsum);

  float acc[16] = {};
  const float* o = static_cast<const float*>(p.o_partial) + (slot0 * kMaxRows + row) * kMlaDimV + 4 * lane;
  constexpr int kBatch = 4;
  for (int s0 = 0; s0 < n; s0 += kBatch) {
    int s[kBatch];
    float ws[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      s[u] = s0 + u;
      const float l = s[u] < n ? ld_f32(lse + s[u] * kMaxRows) : neg_inf();
      ws[u] = mla_combine_weight(l, mx);
    }
    mla_combine_accumulate<kBatch>(o, static_cast<long long>(kMaxRows) * kMlaDimV, s, ws, acc);
  }
  const float inv = wsum > 0.f ? p.out_scale / wsum : 0.f;
  u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * kHeads + row) * kMlaDimV + 4 * lane;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint2 packed;
    packed.x = pack_bf16x2(acc[4 * k] * inv, acc[4 * k + 1] * inv);
    packed.y = pack_bf16x2(acc[4 * k + 2] * inv, acc[4 * k + 3] * inv);
    *reinterpret_cast<uint2*>(out + 128 * k) = packed;
  }
}

}  // namespace mla_detail

// 4 warps: with p.combine_row_warps == 1 a row per warp (above); else a row per CTA, each warp reading
// the lse it needs per batch of pieces (from L1 after the first pass). Its piece loop is not
// mla_combine_accumulate: in that form it ran 1.5-4% slower at B 8-64 on the H200 (NOTES.md).
template <int kHeads, int kMaxSeqLenQ, bool kPacked>
__global__ void __launch_bounds__(kMlaCombineThreads) mla_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
  using namespace mla_detail;
  constexpr int kWarps = kMlaCombineThreads / 32;
  static_assert(kWarps == 4 && kMlaDimV == 512, "four warps, 16 columns per lane");
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
  __shared__ __align__(16) float part_sum[kWarps][kMlaDimV];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int b = blockIdx.y;
  mla_combine_wait();
  if (p.combine_row_warps == 1) {  // CTA-uniform
    mla_combine_row_by_warp<kHeads, kMaxSeqLenQ, kPacked>(p, b, blockIdx.x * kMlaCombineRowsPerCta + warp);
    return;
  }
  const int row = blockIdx.x;
  int tok0, q_len;
  if constexpr (kPacked) {
    tok0 = load_i32(p.qo_indptr, b);
    q_len = load_i32(p.qo_indptr, b + 1) - tok0;
  } else {
    tok0 = b * kMaxSeqLenQ;
    q_len = kMaxSeqLenQ;
  }
  if (row >= q_len * kHeads) return;  // CTA-uniform

  const int* meta = static_cast<const int*>(p.split_meta) + 2 * b;
  const int first = ld_s32(meta);
  const int n = ld_s32(meta + 1);
  if (n <= 1) return;  // CTA-uniform

  const long long slot0 = static_cast<long long>(b) + first;
  const float* lse = static_cast<const float*>(p.lse_partial) + slot0 * kMaxRows + row;
  constexpr long long kSlotStride = static_cast<long long>(kMaxRows) * kMlaDimV;
  // Every warp finds the max and the weight sum over all pieces (n is small: one lse per piece).
  float mx, wsum;
  mla_combine_max_wsum(lse, n, kMaxRows, lane, mx, wsum);

  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.f;
  const float* o = static_cast<const float*>(p.o_partial) + (slot0 * kMaxRows + row) * kMlaDimV + 4 * lane;
  constexpr int kBatch = 4;
  for (int s0 = warp; s0 < n; s0 += kWarps * kBatch) {
    float w[kBatch];
    U32x4 v[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u * kWarps;
      const float l = s < n ? ld_f32(lse + s * kMaxRows) : neg_inf();
      w[u] = mla_combine_weight(l, mx);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[u][k] = ld128_if(o + s * kSlotStride + 128 * k, w[u] > 0.f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[4 * k + 0] += w[u] * __uint_as_float(v[u][k].x);
        acc[4 * k + 1] += w[u] * __uint_as_float(v[u][k].y);
        acc[4 * k + 2] += w[u] * __uint_as_float(v[u][k].z);
        acc[4 * k + 3] += w[u] * __uint_as_float(v[u][k].w);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    *reinterpret_cast<float4*>(&part_sum[warp][128 * k + 4 * lane]) =
        make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]);
  }
  __syncthreads();
  // Thread t writes columns 4 t .. 4 t + 3.
  const int col = 4 * threadIdx.x;
  float r[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int w2 = 0; w2 < kWarps; ++w2) {
    const float4 x = *reinterpret_cast<const float4*>(&part_sum[w2][col]);
    r[0] += x.x;
    r[1] += x.y;
    r[2] += x.z;
    r[3] += x.w;
  }
  const float inv = wsum > 0.f ? p.out_scale / wsum : 0.f;
  u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * kHeads + row) * kMlaDimV + col;
  uint2 packed;
  packed.x = pack_bf16x2(r[0] * inv, r[1] * inv);
  packed.y = pack_bf16x2(r[2] * inv, r[3] * inv);
  *reinterpret_cast<uint2*>(out) = packed;
}

// 8 warps: lane l reads the lse of pieces l, l + 32, l + 64 once, so every weight is in a register
// before any O load.
template <int kHeads, int kMaxSeqLenQ, bool kPacked>
__global__ void __launch_bounds__(kMlaCombineWideThreads, 2) mla_combine_wide_kernel(const __grid_constant__ MlaDecodeParams p) {
  using namespace mla_detail;
  constexpr int kWarps = kMlaCombineWideThreads / 32;
  static_assert(kWarps == 8 && kMlaDimV == 512, "eight warps, 16 columns per lane");
  // A request's blocks span at most kMlaMaxPieces + 1 parts (the width keeps blocks / width <=
  // kMlaMaxPieces; a start inside a part adds one).
  constexpr int kLsePerLane = (kMlaMaxPieces + 1 + 31) / 32;
  static_assert(kLsePerLane == 3, "the weight registers below are w[0..2]");
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
  __shared__ __align__(16) float part_sum[kWarps][kMlaDimV];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int b = blockIdx.y;
  const int row = blockIdx.x;
  mla_combine_wait();
  int tok0, first, n;
  if (!mla_combine_begin<kHeads, kMaxSeqLenQ, kPacked>(p, b, row, tok0, first, n)) return;  // CTA-uniform

  const long long slot0 = static_cast<long long>(b) + first;
  const float* lse = static_cast<const float*>(p.lse_partial) + slot0 * kMaxRows + row;
  float w[kLsePerLane];
  float mx = neg_inf();
#pragma unroll
  for (int k = 0; k < kLsePerLane; ++k) {
    const int s = lane + 32 * k;
    w[k] = s < n ? ld_f32(lse + s * kMaxRows) : neg_inf();
    mx = fmaxf(mx, w[k]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kLsePerLane; ++k) {
    w[k] = mla_combine_weight(w[k], mx);
    wsum += w[k];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);

  float acc[16] = {};
  const float* o = static_cast<const float*>(p.o_partial) + (slot0 * kMaxRows + row) * kMlaDimV + 4 * lane;
  constexpr int kBatch = 4;
  for (int s0 = warp; s0 < n; s0 += kWarps * kBatch) {
    int s[kBatch];
    float ws[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      s[u] = s0 + u * kWarps;  // warp-uniform
      const float mine = (s[u] >> 5) == 0 ? w[0] : (s[u] >> 5) == 1 ? w[1] : w[2];
      const float wt = __shfl_sync(0xffffffffu, mine, s[u] & 31);
      ws[u] = s[u] < n ? wt : 0.f;
    }
    mla_combine_accumulate<kBatch>(o, static_cast<long long>(kMaxRows) * kMlaDimV, s, ws, acc);
  }
  mla_combine_store<kHeads, kWarps>(p, part_sum, acc, wsum, tok0, row);
}

#endif  // __CUDACC__

}  // namespace kiln
