#include "tests/support/dsv41_reference_encode.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::testing {

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

bool sign_of(float v) { return (to_bits(v) >> 31) != 0; }

// Index of the value nearest to `a` (>= 0) among `values` (ascending, codes 0..n-1); a tie goes to
// the even code; beyond the largest value, the largest (satfinite).
int nearest(const double* values, int n, double a) {
  if (a >= values[n - 1]) return n - 1;
  int best = 0;
  double best_d = std::fabs(a - values[0]);
  for (int c = 1; c < n; ++c) {
    const double d = std::fabs(a - values[c]);
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

}  // namespace

int dsv41_record_bytes(Dsv41Format f) { return f == Dsv41Format::kFp8 ? kDsv41Fp8Record : kDsv41Fp4Record; }

float dsv41_bf16_value(uint16_t bits) { return from_bits(uint32_t(bits) << 16); }

float dsv41_fp16_value(uint16_t bits) {
  const bool neg = (bits >> 15) != 0;
  const int e = (bits >> 10) & 0x1f;
  const int m = bits & 0x3ff;
  double v;
  if (e == 0x1f) v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (e == 0) v = std::ldexp(double(m), -24);
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return static_cast<float>(neg ? -v : v);
}

uint16_t dsv41_fp16_bits(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = sign_of(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // rounds past the largest finite fp16
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));  // may carry into 0x0400
  int e = std::ilogb(a);
  double m = std::nearbyint((std::ldexp(a, -e) - 1.0) * 1024.0);
  if (m == 1024.0) {
    m = 0;
    ++e;
  }
  return sign | static_cast<uint16_t>(((e + 15) << 10) | static_cast<int>(m));
}

uint16_t dsv41_bf16_bits(float f) {
  const uint32_t b = to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

float dsv41_e4m3_value(uint8_t code) {
  const bool neg = (code & 0x80) != 0;
  const int e = (code >> 3) & 0xf;
  const int m = code & 7;
  if (e == 0xf && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const double v = e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>(neg ? -v : v);
}

uint8_t dsv41_e4m3_encode(float v) {
  static const auto values = [] {
    std::array<double, 127> t{};
    for (int c = 0; c < 127; ++c) t[c] = dsv41_e4m3_value(static_cast<uint8_t>(c));
    return t;
  }();
  const int c = nearest(values.data(), 127, std::fabs(static_cast<double>(v)));
  return static_cast<uint8_t>(c | (sign_of(v) ? 0x80 : 0));
}

float dsv41_e2m1_value(uint8_t code) {
  static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kValues[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t dsv41_e2m1_encode(float y) {
  static const double kValues[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const int c = nearest(kValues, 8, std::fabs(static_cast<double>(y)));
  return static_cast<uint8_t>(c | (sign_of(y) ? 8 : 0));
}

uint8_t dsv41_fp8_group(const float* x, uint8_t* codes) {
  bool nan = false, inf = false;
  for (int i = 0; i < 32; ++i) {
    nan |= std::isnan(x[i]);
    inf |= std::isinf(x[i]);
  }
  if (nan) {
    std::fill(codes, codes + 32, uint8_t{0x7f});
    return 0xff;
  }
  if (inf) {
    for (int i = 0; i < 32; ++i) codes[i] = std::isinf(x[i]) ? 0x7f : (sign_of(x[i]) ? 0x80 : 0x00);
    return 0xff;
  }
  float a = 0.0f;
  for (int i = 0; i < 32; ++i) a = std::max(a, std::fabs(x[i]));
  const float floor = from_bits(0x38d1b717u);  // 1e-4
  const float r = std::max(std::max(a, floor) / 448.0f, floor);
  int k = -30;
  while (std::ldexp(1.0, k) < static_cast<double>(r)) ++k;  // the least k with 2^k >= r
  for (int i = 0; i < 32; ++i) {
    const float y = std::clamp(std::ldexp(x[i], -k), -448.0f, 448.0f);
    codes[i] = dsv41_e4m3_encode(y);
  }
  return static_cast<uint8_t>(k + 127);
}

uint8_t dsv41_fp4_group(const float* x, uint8_t* packed) {
  for (int i = 0; i < 16; ++i) {
    if (!std::isfinite(x[i])) {
      std::fill(packed, packed + 8, uint8_t{0});
      return 0x7f;
    }
  }
  float a = 0.0f;
  for (int i = 0; i < 16; ++i) a = std::max(a, std::fabs(x[i]));
  const uint8_t scale = dsv41_e4m3_encode(std::min(std::max(a / 6.0f, std::ldexp(1.0f, -9)), 448.0f));
  const float s = dsv41_e4m3_value(scale);
  for (int i = 0; i < 8; ++i) {
    packed[i] = static_cast<uint8_t>(dsv41_e2m1_encode(x[2 * i] / s) | (dsv41_e2m1_encode(x[2 * i + 1] / s) << 4));
  }
  return scale;
}

void dsv41_encode_row(Dsv41Format f, const float* x, uint8_t* data, uint8_t* scales) {
  if (f == Dsv41Format::kFp8) {
    for (int g = 0; g < 16; ++g) scales[g] = dsv41_fp8_group(x + 32 * g, data + 32 * g);
  } else {
    for (int g = 0; g < 32; ++g) scales[g] = dsv41_fp4_group(x + 16 * g, data + 8 * g);
  }
}

namespace {

struct SlotBytes {
  long long data;
  long long scales;
};

SlotBytes slot_bytes(Dsv41Format f, long long page_stride, int page_size, long long slot) {
  const long long data = f == Dsv41Format::kFp8 ? kDsv41Fp8Data : kDsv41Fp4Data;
  const long long scl = f == Dsv41Format::kFp8 ? kDsv41Fp8Scales : kDsv41Fp4Scales;
  const long long page = slot / page_size, row = slot % page_size;
  return {page * page_stride + row * data, page * page_stride + page_size * data + row * scl};
}

}  // namespace

void dsv41_write_slot(Dsv41Format f, uint8_t* pool, long long page_stride, int page_size, long long slot, const float* x) {
  const SlotBytes at = slot_bytes(f, page_stride, page_size, slot);
  dsv41_encode_row(f, x, pool + at.data, pool + at.scales);
}

float dsv41_read_dim(Dsv41Format f, const uint8_t* pool, long long page_stride, int page_size, long long slot, int d) {
  const SlotBytes at = slot_bytes(f, page_stride, page_size, slot);
  if (f == Dsv41Format::kFp8) {
    const uint8_t s = pool[at.scales + d / 32];
    if (s == 0xff) return std::numeric_limits<float>::quiet_NaN();
    return static_cast<float>(dsv41_e4m3_value(pool[at.data + d]) * std::ldexp(1.0, s - 127));
  }
  const uint8_t byte = pool[at.data + d / 2];
  const uint8_t code = d % 2 ? byte >> 4 : byte & 15;
  return dsv41_e2m1_value(code) * dsv41_e4m3_value(pool[at.scales + d / 16]);
}

}  // namespace kiln::testing
