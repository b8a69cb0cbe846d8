#pragma once
// fp32 oracle of the sparse NVFP4 MLA decode (runtime/sparse_nvfp4/README.md, "What it computes").
#include <cstdint>

#include "tests/support/nvfp4_reference.h"

namespace kiln::testing {

struct SparsePool {
  const uint8_t* base = nullptr;  // host copy of the paged cache
  long long page_stride = 0;      // bytes
  int page_size = 0;
  const int32_t* indices = nullptr;  // row t at indices + t * row_stride
  long long row_stride = 0;
  int topk = 0;
  const int32_t* lengths = nullptr;  // per-token active prefix, or null
};

struct SparseProblem {
  int tokens = 0;  // T
  int heads = 0;   // H
  const uint16_t* q = nullptr;  // [T, H, 512] bf16
  SparsePool main;
  SparsePool extra;  // extra.base == nullptr: no extra cache
  const float* attn_sink = nullptr;  // [H] or null
  float sm_scale = 0.0f;
  float lse_scale = 1.0f;
  // The reciprocals Q's NVFP4 rounding multiplies by (null: fp32(1 / scale)); the kernels round Q by
  // the writers' rule, rcp.approx.ftz of the scale (tests/support/nvfp4_device.h reads those).
  const Nvfp4Reciprocals* q_reciprocals = nullptr;
};

// out: [T, H, 512] fp32, lse: [T, H] (base-2 LSE times lse_scale). A token with no valid candidate
// gets zeros and -inf (or sink * log2(e) * lse_scale with a sink).
void sparse_nvfp4_reference(const SparseProblem& problem, float* out, float* lse);

}  // namespace kiln::testing
