#include "tests/support/nvfp4_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::testing {

float bf16_to_float(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float e4m3_to_float(uint8_t v) {
  const int sign = v & 0x80, exp = (v >> 3) & 0xf, man = v & 7;
  float mag;
  if (exp == 15 && man == 7) mag = NAN;
  else if (exp == 0) mag = std::ldexp(float(man), -9);
  else mag = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

namespace {

// Index of the value nearest to `v` (>= 0) among the ascending `values`, ties to the even index;
// past the largest value, the largest (the distances there are not exact in double).
int nearest_even(double v, const double* values, int n) {
  if (v >= values[n - 1]) return n - 1;
  int best = 0;
  for (int i = 1; i < n; ++i) {
    const double d = std::fabs(values[i] - v), db = std::fabs(values[best] - v);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return best;
}

const std::array<double, 127>& e4m3_magnitudes() {  // codes 0x00..0x7e, ascending
  static const auto m = [] {
    std::array<double, 127> v{};
    for (int c = 0; c < 127; ++c) v[c] = e4m3_to_float(uint8_t(c));
    return v;
  }();
  return m;
}

constexpr double kE2m1Magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

}  // namespace

uint8_t float_to_e4m3_satfinite(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isinf(f)) return sign | 0x7e;
  return uint8_t(sign | nearest_even(std::fabs(double(f)), e4m3_magnitudes().data(), 127));
}

float e2m1_to_float(uint8_t code) {
  const float v = float(kE2m1Magnitudes[code & 7]);
  return (code & 8) ? -v : v;
}

uint8_t float_to_e2m1(float y) {
  if (std::isnan(y)) return 0x7;
  const uint8_t sign = std::signbit(y) ? 0x8 : 0x0;
  if (std::isinf(y)) return sign | 0x7;
  return uint8_t(sign | nearest_even(std::fabs(double(y)), kE2m1Magnitudes, 8));
}

const Nvfp4Reciprocals& nvfp4_exact_reciprocals() {
  static const auto r = [] {
    Nvfp4Reciprocals t{};
    for (int c = 1; c < 127; ++c) t[c] = 1.0f / e4m3_to_float(uint8_t(c));
    return t;
  }();
  return r;
}

namespace {
// One group of 16 in fp32, one rounding per operation (no fused operations).
void quantize_group(const float* x, uint8_t* codes_out, uint8_t* scale_out, const Nvfp4Reciprocals& rcp) {
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
  }
  const uint8_t s = float_to_e4m3_satfinite(amax / 6.0f);
  const float inv = rcp[s & 0x7f];
  for (int i = 0; i < 16; ++i) {
    volatile float y = x[i] * inv;  // volatile: rounded to fp32 here, whatever the host's flags
    codes_out[i] = float_to_e2m1(y);
  }
  *scale_out = s;
}
}  // namespace

void nvfp4_quantize_token(const uint16_t* x, uint8_t* data, uint8_t* scales, const Nvfp4Reciprocals& rcp) {
  std::memset(data, 0, kNvfp4DataBytes);
  std::memset(scales, 0, kNvfp4ScaleBytes);
  for (int g = 0; g < kNvfp4Groups; ++g) {
    float v[16];
    uint8_t c[16];
    for (int i = 0; i < 16; ++i) v[i] = bf16_to_float(x[g * 16 + i]);
    quantize_group(v, c, &scales[g], rcp);
    for (int i = 0; i < 16; i += 2) data[(g * 16 + i) / 2] = uint8_t(c[i] | (c[i + 1] << 4));
  }
  std::memcpy(data + 224, x + kNvfp4NopeDims, 128);  // RoPE bf16, little-endian as in memory
}

void nvfp4_round_trip_nope(float* x, const Nvfp4Reciprocals& rcp) {
  for (int g = 0; g < kNvfp4Groups; ++g) {
    uint8_t c[16], s;
    quantize_group(x + g * 16, c, &s, rcp);
    const float scale = e4m3_to_float(s);
    for (int i = 0; i < 16; ++i) x[g * 16 + i] = e2m1_to_float(c[i]) * scale;
  }
}

void nvfp4_write_token(uint8_t* pool, long long page_stride, int page_size, long long index, const uint16_t* x,
                       const Nvfp4Reciprocals& rcp) {
  const long long page = index / page_size, row = index % page_size;
  uint8_t* base = pool + page * page_stride;
  nvfp4_quantize_token(x, base + row * kNvfp4DataBytes,
                       base + (long long)page_size * kNvfp4DataBytes + row * kNvfp4ScaleBytes, rcp);
}

void nvfp4_dequantize_token(const uint8_t* pool, long long page_stride, int page_size, long long index, float* out) {
  const long long page = index / page_size, row = index % page_size;
  const uint8_t* base = pool + page * page_stride;
  const uint8_t* data = base + row * kNvfp4DataBytes;
  const uint8_t* scales = base + (long long)page_size * kNvfp4DataBytes + row * kNvfp4ScaleBytes;
  for (int d = 0; d < kNvfp4NopeDims; ++d) {
    const uint8_t code = (d & 1) ? (data[d / 2] >> 4) : (data[d / 2] & 0xf);
    out[d] = e2m1_to_float(code) * e4m3_to_float(scales[d / 16]);
  }
  for (int j = 0; j < 64; ++j) {
    uint16_t b;
    std::memcpy(&b, data + 224 + 2 * j, 2);
    out[kNvfp4NopeDims + j] = bf16_to_float(b);
  }
}

}  // namespace kiln::testing
