#include "tests/support/nvfp4_reference.h"

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

uint8_t float_to_e4m3_satfinite(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  e -= 1;             // a = (1.x) * 2^e
  if (a == 0.0f || e < -6) {
    // Subnormal grid of 2^-9; nearbyint rounds half to even under the default rounding mode.
    const int q = int(std::nearbyint(std::ldexp(a, 9)));
    return uint8_t(sign | q);  // q == 8 is the smallest normal, encoded the same way
  }
  int m = int(std::nearbyint((std::ldexp(a, -e) - 1.0f) * 8.0f));
  if (m == 8) {
    m = 0;
    e += 1;
  }
  return uint8_t(sign | ((e + 7) << 3) | m);
}

float e2m1_to_float(uint8_t code) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t float_to_e2m1(float y) {
  const float a = std::fabs(y);
  uint8_t m;
  if (!(a > 0.25f)) m = 0;  // also NaN
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return m == 0 ? 0 : uint8_t(m | (std::signbit(y) ? 8 : 0));
}

namespace {
// The writers' per-group rule, in fp32: one divide for the scale, one divide for its inverse, one
// multiply per value (no fused operations).
void quantize_group(const float* x, uint8_t* codes_out, uint8_t* scale_out) {
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float ratio = amax / 6.0f;
  const uint8_t s = float_to_e4m3_satfinite(ratio);
  const float scale = e4m3_to_float(s);
  const float inv = scale == 0.0f ? 0.0f : 1.0f / scale;
  for (int i = 0; i < 16; ++i) {
    const float y = x[i] * inv;
    codes_out[i] = float_to_e2m1(y);
  }
  *scale_out = s;
}
}  // namespace

void nvfp4_quantize_token(const uint16_t* x, uint8_t* data, uint8_t* scales) {
  std::memset(data, 0, kNvfp4DataBytes);
  std::memset(scales, 0, kNvfp4ScaleBytes);
  for (int g = 0; g < kNvfp4Groups; ++g) {
    float v[16];
    uint8_t c[16];
    for (int i = 0; i < 16; ++i) v[i] = bf16_to_float(x[g * 16 + i]);
    quantize_group(v, c, &scales[g]);
    for (int i = 0; i < 16; i += 2) data[(g * 16 + i) / 2] = uint8_t(c[i] | (c[i + 1] << 4));
  }
  std::memcpy(data + 224, x + kNvfp4NopeDims, 128);  // RoPE bf16, little-endian as in memory
}

void nvfp4_round_trip_nope(float* x) {
  for (int g = 0; g < kNvfp4Groups; ++g) {
    uint8_t c[16], s;
    quantize_group(x + g * 16, c, &s);
    const float scale = e4m3_to_float(s);
    for (int i = 0; i < 16; ++i) x[g * 16 + i] = e2m1_to_float(c[i]) * scale;
  }
}

void nvfp4_write_token(uint8_t* pool, long long page_stride, int page_size, long long index, const uint16_t* x) {
  const long long page = index / page_size, row = index % page_size;
  uint8_t* base = pool + page * page_stride;
  nvfp4_quantize_token(x, base + row * kNvfp4DataBytes,
                       base + (long long)page_size * kNvfp4DataBytes + row * kNvfp4ScaleBytes);
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
