#include "tests/support/dsv41_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/support/nvfp4_reference.h"

namespace kiln::testing {

Dsv41Geometry dsv41_geometry(Dsv41Format format) {
  return format == Dsv41Format::kMain ? Dsv41Geometry{512, 16, 32, 528} : Dsv41Geometry{256, 32, 16, 288};
}

float ue8m0_to_float(std::uint8_t b) {
  if (b == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(b) - 127);
}

void dsv41_dequantize_main(const std::uint8_t* codes, const std::uint8_t* scales, float* out) {
  for (int d = 0; d < kDsv41Dims; ++d) out[d] = e4m3_to_float(codes[d]) * ue8m0_to_float(scales[d / 32]);
}

void dsv41_dequantize_extra(const std::uint8_t* codes, const std::uint8_t* scales, float* out) {
  for (int d = 0; d < kDsv41Dims; ++d) {
    const std::uint8_t byte = codes[d / 2];
    const std::uint8_t nibble = (d % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
    out[d] = e2m1_to_float(nibble) * e4m3_to_float(scales[d / 16]);
  }
}

long long dsv41_data_offset(Dsv41Format format, long long page_stride, int page_size, long long slot) {
  const Dsv41Geometry g = dsv41_geometry(format);
  return slot / page_size * page_stride + slot % page_size * g.data_bytes;
}

long long dsv41_scale_offset(Dsv41Format format, long long page_stride, int page_size, long long slot) {
  const Dsv41Geometry g = dsv41_geometry(format);
  return slot / page_size * page_stride + (long long)page_size * g.data_bytes + slot % page_size * g.scale_bytes;
}

void dsv41_dequantize_slot(const Dsv41Cache& cache, long long slot, float* out) {
  const std::uint8_t* codes = cache.base + dsv41_data_offset(cache.format, cache.page_stride, cache.page_size, slot);
  const std::uint8_t* scales = cache.base + dsv41_scale_offset(cache.format, cache.page_stride, cache.page_size, slot);
  if (cache.format == Dsv41Format::kMain) dsv41_dequantize_main(codes, scales, out);
  else dsv41_dequantize_extra(codes, scales, out);
}

std::vector<std::int32_t> dsv41_valid_candidates(const Dsv41Section& section, int t) {
  std::vector<std::int32_t> slots;
  if (section.indices == nullptr) return slots;
  const int len = section.lengths ? std::clamp(int(section.lengths[t]), 0, section.topk) : section.topk;
  const std::int32_t* row = section.indices + (long long)t * section.row_stride;
  for (int j = 0; j < len; ++j) {
    if (row[j] >= 0) slots.push_back(row[j]);
  }
  return slots;
}

void dsv41_reference(const Dsv41Problem& pr, float* out, float* lse) {
  constexpr double kLog2e = 1.4426950408889634;
  std::vector<double> q(kDsv41Dims), acc(kDsv41Dims), s;
  std::vector<float> rows;  // the token's candidate rows, 512 values each
  for (int t = 0; t < pr.tokens; ++t) {
    rows.clear();
    for (const Dsv41Section* section : {&pr.main, &pr.extra}) {
      for (const std::int32_t slot : dsv41_valid_candidates(*section, t)) {
        rows.resize(rows.size() + kDsv41Dims);
        dsv41_dequantize_slot(section->cache, slot, rows.data() + rows.size() - kDsv41Dims);
      }
    }
    const std::size_t n = rows.size() / kDsv41Dims;
    for (int h = 0; h < pr.heads; ++h) {
      const long long row = (long long)t * pr.heads + h;
      float* o = out + row * kDsv41Dims;
      const double sink = pr.attn_sink ? double(pr.attn_sink[h]) : 0.0;
      if (n == 0) {
        std::fill(o, o + kDsv41Dims, 0.0f);
        lse[row] = pr.attn_sink ? float(sink * kLog2e * pr.lse_scale) : -std::numeric_limits<float>::infinity();
        continue;
      }
      for (int d = 0; d < kDsv41Dims; ++d) q[d] = bf16_to_float(pr.q[row * kDsv41Dims + d]);
      s.assign(n, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < n; ++j) {
        const float* k = rows.data() + j * kDsv41Dims;
        double dot = 0.0;
        for (int d = 0; d < kDsv41Dims; ++d) dot += q[d] * double(k[d]);
        s[j] = pr.sm_scale * dot;
        mx = std::max(mx, s[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      for (std::size_t j = 0; j < n; ++j) {
        const double w = std::exp(s[j] - mx);
        sum += w;
        const float* v = rows.data() + j * kDsv41Dims;
        for (int d = 0; d < kDsv41Dims; ++d) acc[d] += w * double(v[d]);
      }
      double L = mx + std::log(sum);  // natural log
      double factor = 1.0 / sum;
      if (pr.attn_sink) {
        factor /= 1.0 + std::exp(sink - L);  // sigmoid(L - sink)
        const double hi = std::max(L, sink), lo = std::min(L, sink);
        L = hi + std::log1p(std::exp(lo - hi));  // logaddexp
      }
      for (int d = 0; d < kDsv41Dims; ++d) o[d] = float(acc[d] * factor);
      lse[row] = float(L * kLog2e * pr.lse_scale);
    }
  }
}

}  // namespace kiln::testing
