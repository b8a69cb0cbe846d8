#pragma once
// The merge of a split sparse decode (sparse_nvfp4 and sparse_dsv41): a module of its own (family
// sparse_merge), shared by every decode key of the target: H is a run-time value.
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/pdl.cuh"
#include "common/softmax.cuh"
#include "sparse_nvfp4/params.cuh"
#include "sparse_nvfp4/sink.cuh"

namespace kiln {

#ifdef __CUDACC__

// Combines the splits of a decode launched with p.split: one 64-thread group per (token, head), 8
// dims per thread, blockDim.x / 64 rows per block (sparse_merge_rows_per_block). The LSEs and
// partial rows of up to kBatch splits are loaded together, before any is looked at, so a call with
// <= kBatch splits waits for one round trip to L2 (more splits: a running maximum rescales the sums
// batch by batch). An empty split (lse == -1e30) weighs 0 and its stale row is discarded by a
// select, so it cannot leak a NaN.
__global__ void __launch_bounds__(kSparseMergeMaxRowsPerBlock * kSparseMergeThreadsPerRow)
    sparse_nvfp4_merge_kernel(const __grid_constant__ SparseNvfp4Params p) {
  using namespace sparse_detail;
  pdl_launch_dependents();
  pdl_wait();
  const u32 rows_per_block = blockDim.x / kSparseMergeThreadsPerRow;
  const long long row = (long long)blockIdx.x * rows_per_block + threadIdx.x / kSparseMergeThreadsPerRow;
  if (row >= (long long)p.num_tokens * p.heads) return;
  const int d0 = (threadIdx.x % kSparseMergeThreadsPerRow) * 8;
  const float* lse_row = static_cast<const float*>(p.mid_lse) + row * p.split_stride;
  const u16* mid = static_cast<const u16*>(p.mid_out) + row * p.split_stride * 512 + d0;
  constexpr int kBatch = 16;
  constexpr float kLive = 0.5f * kSparseEmptySplitLse;
  float gmax = kSparseEmptySplitLse;  // the largest live LSE so far
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float wsum = 0.0f;
  for (int s0 = 0; s0 < p.num_splits; s0 += kBatch) {
    float ls[kBatch];
    U32x4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u;
      const bool in = s < p.num_splits;
      ls[u] = in ? lse_row[s] : kSparseEmptySplitLse;
      v[u] = ldg128_if(mid + static_cast<long long>(s) * 512, in);
    }
    float bmax = gmax;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) bmax = fmaxf(bmax, ls[u]);
    if (bmax > gmax && s0 > 0) {
      const float rescale = fast_exp2(gmax - bmax);
      wsum *= rescale;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] *= rescale;
    }
    gmax = bmax;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (s0 + u >= p.num_splits) break;  // uniform: at 2 splits most of a batch is no work
      const bool live = ls[u] > kLive;
      const float w = live ? fast_exp2(ls[u] - gmax) : 0.0f;
      wsum += w;
      const u32 vv[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] += w * (live ? bf16x2_lo(vv[i]) : 0.0f);
        acc[2 * i + 1] += w * (live ? bf16x2_hi(vv[i]) : 0.0f);
      }
    }
  }
  const bool empty = !(gmax > kLive);
  float lse = empty ? neg_inf() : gmax + fast_log2(wsum);
  float factor = empty ? 0.0f : 1.0f / wsum;
  const float* sink = static_cast<const float*>(p.attn_sink);
  if (sink != nullptr) {
    // A block's rows share a token (H is a multiple of 8): a 32-bit remainder of the block's first
    // row, not row % H on 64 bits, which the compiler computed ahead of the loads.
    const int head = int((u32(blockIdx.x) * rows_per_block) % u32(p.heads)) + int(threadIdx.x / kSparseMergeThreadsPerRow);
    sparse_fold_sink(sink[head], empty, lse, factor);
  }
  u32 out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = pack_bf16x2(acc[2 * i] * factor, acc[2 * i + 1] * factor);
  *reinterpret_cast<uint4*>(static_cast<u16*>(p.output) + row * 512 + d0) = make_uint4(out[0], out[1], out[2], out[3]);
  if (threadIdx.x % kSparseMergeThreadsPerRow == 0) static_cast<float*>(p.out_lse)[row] = lse * p.lse_scale;
}

#endif  // __CUDACC__

}  // namespace kiln
