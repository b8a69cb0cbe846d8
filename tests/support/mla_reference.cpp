#include "tests/support/mla_reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace kiln::testing {

float bf16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

float e4m3_bits_to_float(std::uint8_t bits) {
  const int sign = bits >> 7;
  const int exp = (bits >> 3) & 0xf;
  const int man = bits & 7;
  if (exp == 0xf && man == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)  // subnormal: man/8 * 2^-6
                             : std::ldexp(1.f + man / 8.f, exp - 7);
  return sign ? -mag : mag;
}

std::uint8_t float_to_e4m3_bits(float f) {
  if (std::isnan(f)) return 0x7f;
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0;
  // Every e4m3 value is exact in float: pick the nearest code, ties to even mantissa.
  float a = std::min(std::fabs(f), 448.f);
  std::uint8_t best = 0;
  float best_err = std::numeric_limits<float>::infinity();
  for (int code = 0; code < 0x7f; ++code) {
    const float v = e4m3_bits_to_float(static_cast<std::uint8_t>(code));
    const float err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best_err = err;
      best = static_cast<std::uint8_t>(code);
    }
  }
  return sign | best;
}

namespace {
constexpr int kDimQk = 576;
constexpr int kDimV = 512;

float element(const void* base, bool fp8, long long index) {
  if (fp8) return e4m3_bits_to_float(static_cast<const std::uint8_t*>(base)[index]);
  return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[index]);
}
}  // namespace

std::vector<float> mla_reference(const MlaReferenceProblem& pr, int threads) {
  const int total_q = pr.q_offsets.at(pr.batch);
  std::vector<float> out(static_cast<size_t>(total_q) * pr.heads * kDimV, 0.f);
  // Work item = (request, query row); each decodes its request's cache rows on the fly.
  std::vector<std::pair<int, int>> items;
  for (int b = 0; b < pr.batch; ++b)
    for (int i = 0; i < pr.q_offsets[b + 1] - pr.q_offsets[b]; ++i) items.emplace_back(b, i);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    std::vector<float> cache, q(kDimQk);
    std::vector<double> s, acc(kDimV);
    for (size_t w; (w = next.fetch_add(1)) < items.size();) {
      const auto [b, i] = items[w];
      const int len = pr.seq_lens[b];
      const int q_len = pr.q_offsets[b + 1] - pr.q_offsets[b];
      cache.resize(static_cast<size_t>(len) * kDimQk);
      for (int t = 0; t < len; ++t) {
        const long long page = pr.block_tables[b * pr.block_table_stride + t / pr.page_size];
        const long long row = (page * pr.page_size + t % pr.page_size) * kDimQk;
        for (int d = 0; d < kDimQk; ++d) cache[static_cast<size_t>(t) * kDimQk + d] = element(pr.kv, pr.fp8, row + d);
      }
      const int visible = pr.causal ? std::min(len, std::max(0, len - q_len + i + 1)) : len;
      s.resize(std::max(visible, 1));
      for (int h = 0; h < pr.heads; ++h) {
        const long long qrow = (static_cast<long long>(pr.q_offsets[b] + i) * pr.heads + h) * kDimQk;
        for (int d = 0; d < kDimQk; ++d) q[d] = element(pr.q, pr.fp8, qrow + d);
        float* o = &out[(static_cast<size_t>(pr.q_offsets[b] + i) * pr.heads + h) * kDimV];
        if (visible == 0) continue;  // no visible key: zeros
        double mx = -std::numeric_limits<double>::infinity();
        for (int t = 0; t < visible; ++t) {
          double dot = 0;
          const float* c = &cache[static_cast<size_t>(t) * kDimQk];
          for (int d = 0; d < kDimQk; ++d) dot += static_cast<double>(q[d]) * c[d];
          s[t] = dot * pr.bmm1_scale;
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (int t = 0; t < visible; ++t) {
          s[t] = std::exp(s[t] - mx);
          sum += s[t];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int t = 0; t < visible; ++t) {
          const double pt = s[t] / sum;
          const float* c = &cache[static_cast<size_t>(t) * kDimQk];
          for (int d = 0; d < kDimV; ++d) acc[d] += pt * c[d];
        }
        for (int d = 0; d < kDimV; ++d) o[d] = static_cast<float>(pr.bmm2_scale * acc[d]);
      }
    }
  };
  threads = std::max(1, threads);
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return out;
}

}  // namespace kiln::testing
