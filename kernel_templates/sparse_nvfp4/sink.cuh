#pragma once
// The attention sink's fold into a finished row, shared by the decode epilogues and the split merge.
#include "common/softmax.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace sparse_detail {

// Folds the attention sink (a logit in natural units) into a finished row: the output factor shrinks
// by 1 / (1 + 2^(s2 - lse)) and the base-2 LSE becomes log2(2^lse + 2^s2); a row that saw nothing
// takes the sink's LSE (its output stays 0).
__device__ __forceinline__ void sparse_fold_sink(float sink_logit, bool empty, float& lse, float& factor) {
  const float s2 = sink_logit * 1.4426950408889634f;
  if (empty) {
    lse = s2;
    return;
  }
  factor *= 1.0f / (1.0f + fast_exp2(s2 - lse));
  const float hi = fmaxf(lse, s2), lo = fminf(lse, s2);
  lse = hi + fast_log2(1.0f + fast_exp2(lo - hi));
}

}  // namespace sparse_detail

#endif  // __CUDACC__

}  // namespace kiln
