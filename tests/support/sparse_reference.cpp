#include "tests/support/sparse_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/support/nvfp4_reference.h"

namespace kiln::testing {

namespace {
// Valid candidates of token t of one pool, dequantized, in slot order (duplicates kept).
void gather(const SparsePool& pool, int t, std::vector<std::vector<float>>& rows) {
  if (pool.base == nullptr) return;
  int len = pool.topk;
  if (pool.lengths != nullptr) len = std::clamp(int(pool.lengths[t]), 0, pool.topk);
  const int32_t* idx = pool.indices + (long long)t * pool.row_stride;
  for (int j = 0; j < len; ++j) {
    if (idx[j] < 0) continue;
    rows.emplace_back(kNvfp4Dims);
    nvfp4_dequantize_token(pool.base, pool.page_stride, pool.page_size, idx[j], rows.back().data());
  }
}
}  // namespace

void sparse_nvfp4_reference(const SparseProblem& pr, float* out, float* lse) {
  const double kLog2e = 1.4426950408889634;
  for (int t = 0; t < pr.tokens; ++t) {
    std::vector<std::vector<float>> kv;
    gather(pr.main, t, kv);
    gather(pr.extra, t, kv);
    for (int h = 0; h < pr.heads; ++h) {
      float* o = out + ((long long)t * pr.heads + h) * kNvfp4Dims;
      float& l_out = lse[(long long)t * pr.heads + h];
      const double sink = pr.attn_sink ? double(pr.attn_sink[h]) : 0.0;
      if (kv.empty()) {
        std::fill(o, o + kNvfp4Dims, 0.0f);
        l_out = pr.attn_sink ? float(sink * kLog2e * pr.lse_scale) : -std::numeric_limits<float>::infinity();
        continue;
      }
      float qhat[kNvfp4Dims];
      const uint16_t* qrow = pr.q + ((long long)t * pr.heads + h) * kNvfp4Dims;
      for (int d = 0; d < kNvfp4Dims; ++d) qhat[d] = bf16_to_float(qrow[d]);
      nvfp4_round_trip_nope(qhat, pr.q_reciprocals != nullptr ? *pr.q_reciprocals : nvfp4_exact_reciprocals());
      std::vector<double> s(kv.size());
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < kv.size(); ++j) {
        double dot = 0.0;
        for (int d = 0; d < kNvfp4Dims; ++d) dot += double(qhat[d]) * kv[j][d];
        s[j] = pr.sm_scale * dot;
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      std::vector<double> acc(kNvfp4Dims, 0.0);
      for (size_t j = 0; j < kv.size(); ++j) {
        const double w = std::exp(s[j] - mx);
        sum += w;
        for (int d = 0; d < kNvfp4Dims; ++d) acc[d] += w * kv[j][d];
      }
      double L = mx + std::log(sum);  // natural log
      double factor = 1.0 / sum;
      if (pr.attn_sink) {
        factor *= 1.0 / (1.0 + std::exp(sink - L));  // sigmoid(L - sink)
        const double hi = std::max(L, sink), lo = std::min(L, sink);
        L = hi + std::log1p(std::exp(lo - hi));
      }
      for (int d = 0; d < kNvfp4Dims; ++d) o[d] = float(acc[d] * factor);
      l_out = float(L * kLog2e * pr.lse_scale);
    }
  }
}

}  // namespace kiln::testing
