#pragma once
// Pieces of the online softmax shared by the attention families.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

// -inf without host math headers: the score of a masked key and the max of a row that saw nothing.
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// 2^x; -inf gives +0, which the online softmax relies on for masked scores.
__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float fast_log2(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Max / sum over the 4 lanes of an mma fragment quad (the lanes that share one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One row's online-softmax step over a new tile of base-2 scores whose max is `tile_max`: the running
// max `m` moves to include it; the tile's scores are taken as exp2(s - m_use), and the row's O and l
// are multiplied by alpha. A row that has seen only masked keys keeps m = -inf and subtracts 0, so its
// exp2 gives 0, not NaN. Once a row's max settles alpha is exactly 1.
struct OnlineSoftmaxStep {
  float m_use;
  float alpha;
};

__device__ __forceinline__ OnlineSoftmaxStep online_softmax_step(float& m, float tile_max) {
  const float m_new = fmaxf(m, tile_max);
  const float m_use = m_new == neg_inf() ? 0.f : m_new;
  const float alpha = fast_exp2(m - m_use);
  m = m_new;
  return {m_use, alpha};
}

#endif  // __CUDACC__

}  // namespace kiln
