// The CPU reference of the DeepSeek-V4.1 cache writers (tests/support/dsv41_reference_encode)
// against the format's worked examples and every edge rule, and against CUDA's host models of the
// conversion instructions the kernels use.
#include <catch2/catch.hpp>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/support/dsv41_reference_encode.h"

namespace {

namespace kt = kiln::testing;
using kt::Dsv41Format;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct Fp8Group {
  std::array<float, 32> x{};
  std::array<uint8_t, 32> codes{};
  uint8_t scale = 0;
  void encode() { scale = kt::dsv41_fp8_group(x.data(), codes.data()); }
};

struct Fp4Group {
  std::array<float, 16> x{};
  std::array<uint8_t, 8> packed{};
  uint8_t scale = 0;
  void encode() { scale = kt::dsv41_fp4_group(x.data(), packed.data()); }
  int code(int i) const { return i % 2 ? packed[i / 2] >> 4 : packed[i / 2] & 15; }
};

}  // namespace

TEST_CASE("dsv41 reference: element encodings follow the format definitions", "[unit]") {
  CHECK(bits_of(1e-4f) == 0x38d1b717u);  // the FP8 floor constant
  CHECK(kt::dsv41_e4m3_value(0x7e) == 448.0f);
  CHECK(kt::dsv41_e4m3_value(0x01) == std::ldexp(1.0f, -9));
  CHECK(kt::dsv41_e4m3_value(0x08) == std::ldexp(1.0f, -6));
  CHECK(kt::dsv41_e4m3_value(0x7a) == 320.0f);
  CHECK(kt::dsv41_e4m3_value(0x15) == 0.05078125f);
  CHECK(std::isnan(kt::dsv41_e4m3_value(0x7f)));
  CHECK(std::isnan(kt::dsv41_e4m3_value(0xff)));
  // Round to nearest, ties to the even code, saturating, sign kept, subnormals kept.
  CHECK(kt::dsv41_e4m3_encode(308.0f) == 0x7a);                   // between 288 and 320: nearer 320
  CHECK(kt::dsv41_e4m3_encode(304.0f) == 0x7a);                   // the tie 288 (0x79) / 320 (0x7a): even code
  CHECK(kt::dsv41_e4m3_encode(272.0f) == 0x78);                   // the tie 256 (0x78) / 288 (0x79)
  CHECK(kt::dsv41_e4m3_encode(1000.0f) == 0x7e);
  CHECK(kt::dsv41_e4m3_encode(-kInf) == 0xfe);
  CHECK(kt::dsv41_e4m3_encode(-0.0f) == 0x80);
  CHECK(kt::dsv41_e4m3_encode(-1e-6f) == 0x80);
  CHECK(kt::dsv41_e4m3_encode(5.0f * std::ldexp(1.0f, -9)) == 0x05);
  CHECK(kt::dsv41_e4m3_encode(std::ldexp(1.0f, -10)) == 0x00);    // half the smallest subnormal: tie to code 0
  CHECK(kt::dsv41_e4m3_encode(3.0f * std::ldexp(1.0f, -10)) == 0x02);
  CHECK(kt::dsv41_e4m3_encode(15.0f * std::ldexp(1.0f, -10)) == 0x08);  // 7.5 * 2^-9 ties up to 2^-6
  // fp16 widening and narrowing.
  CHECK(kt::dsv41_fp16_value(0x3c00) == 1.0f);
  CHECK(kt::dsv41_fp16_value(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(kt::dsv41_fp16_value(0xfc00)));
  CHECK(std::isnan(kt::dsv41_fp16_value(0x7e00)));
  CHECK(kt::dsv41_fp16_bits(65504.0f) == 0x7bff);
  CHECK(kt::dsv41_fp16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
  CHECK(kt::dsv41_fp16_bits(std::ldexp(1.0f, -24)) == 0x0001);
  for (uint32_t b = 0; b < 0x7c00; b += 7) CHECK(kt::dsv41_fp16_bits(kt::dsv41_fp16_value(static_cast<uint16_t>(b))) == b);
}

TEST_CASE("dsv41 reference: E2M1 rounding table, ties at every boundary", "[unit]") {
  struct Tie {
    float y;
    int code;
  };
  // The ties go to the even code: 0.25 -> 0, 0.75 -> 1 (code 2), 1.25 -> 1, 1.75 -> 2 (code 4),
  // 2.5 -> 2, 3.5 -> 4 (code 6), 5 -> 4; beyond, the open intervals.
  const Tie ties[] = {{0.0f, 0}, {0.25f, 0}, {0.2500001f, 1}, {0.7499999f, 1}, {0.75f, 2}, {1.25f, 2}, {1.2500001f, 3},
                      {1.7499999f, 3}, {1.75f, 4}, {2.5f, 4}, {2.5000002f, 5}, {3.4999998f, 5}, {3.5f, 6}, {5.0f, 6},
                      {5.0000005f, 7}, {6.0f, 7}, {1e30f, 7}, {kInf, 7}};
  for (const Tie& t : ties) {
    INFO("y = " << t.y);
    CHECK(kt::dsv41_e2m1_encode(t.y) == t.code);
    CHECK(kt::dsv41_e2m1_encode(-t.y) == (t.code | 8));  // the sign is kept, -0 included
  }
  CHECK(kt::dsv41_e2m1_encode(-1e-9f) == 8);
  CHECK(kt::dsv41_e2m1_value(7) == 6.0f);
  CHECK(kt::dsv41_e2m1_value(0xb) == -1.5f);
}

TEST_CASE("dsv41 reference: FP8 worked example and scale rule", "[unit]") {
  Fp8Group g;
  g.x[5] = 0.30078125f;  // amax: r = max(amax / 448, 1e-4) = 6.71e-4, k = -10
  g.x[6] = -0.1f;
  g.encode();
  CHECK(g.scale == 0x75);
  CHECK(g.codes[5] == 0x7a);  // 0.30078125 * 2^10 = 308 -> 320
  CHECK(kt::dsv41_e4m3_value(g.codes[5]) * std::ldexp(1.0f, g.scale - 127) == 0.3125f);
  CHECK(g.codes[6] == kt::dsv41_e4m3_encode(-0.1f * 1024.0f));
  CHECK(g.codes[0] == 0x00);
  // Scales by amax: below 0.0448 always 2^-13; a power-of-two r keeps its k; 448 -> k = 0.
  const std::pair<float, int> cases[] = {{0.0f, 0x72}, {1e-30f, 0x72}, {0.04f, 0x72}, {0.0448f, 0x72}, {0.06f, 0x73},
                                         {448.0f, 0x7f}, {449.0f, 0x80}, {0.875f, 0x76}, {3.0e38f, 247}};
  for (const auto& [amax, scale] : cases) {
    INFO("amax " << amax);
    Fp8Group h;
    h.x[31] = amax;
    h.encode();
    CHECK(h.scale == scale);
  }
}

TEST_CASE("dsv41 reference: FP8 edge groups", "[unit]") {
  SECTION("all zero, -0") {
    Fp8Group g;
    g.x[3] = -0.0f;
    g.encode();
    CHECK(g.scale == 0x72);
    CHECK(g.codes[3] == 0x80);
    CHECK(g.codes[0] == 0x00);
  }
  SECTION("NaN poisons every code of the group") {
    Fp8Group g;
    g.x[0] = 1.0f;
    g.x[9] = kNaN;
    g.x[10] = kInf;
    g.encode();
    CHECK(g.scale == 0xff);
    for (uint8_t c : g.codes) CHECK(c == 0x7f);
  }
  SECTION("+-Inf: 0x7F for the infinities, a signed zero for the rest") {
    Fp8Group g;
    g.x[1] = kInf;
    g.x[2] = -kInf;
    g.x[3] = -2.0f;
    g.x[4] = 5.0f;
    g.x[5] = -0.0f;
    g.encode();
    CHECK(g.scale == 0xff);
    CHECK(g.codes[1] == 0x7f);
    CHECK(g.codes[2] == 0x7f);
    CHECK(g.codes[3] == 0x80);
    CHECK(g.codes[4] == 0x00);
    CHECK(g.codes[5] == 0x80);
    CHECK(g.codes[0] == 0x00);
  }
  SECTION("448 clamp and subnormal codes") {
    Fp8Group g;
    g.x[0] = 448.0f;  // k = 0
    g.x[1] = -448.0f;
    g.x[2] = 0.01f;                          // 5.12 * 2^-9 -> subnormal code 5
    g.x[3] = -std::ldexp(3.0f, -10);          // a tie between codes 1 and 2 -> 2, negative
    g.x[4] = std::ldexp(1.0f, -12);           // rounds to +0
    g.encode();
    CHECK(g.scale == 0x7f);
    CHECK(g.codes[0] == 0x7e);
    CHECK(g.codes[1] == 0xfe);
    CHECK(g.codes[2] == 0x05);
    CHECK(g.codes[3] == 0x82);
    CHECK(g.codes[4] == 0x00);
  }
  SECTION("tiny amax: scale 2^-13, values scaled by 2^13") {
    Fp8Group g;
    g.x[0] = 1e-5f;
    g.encode();
    CHECK(g.scale == 0x72);
    CHECK(g.codes[0] == kt::dsv41_e4m3_encode(std::ldexp(1e-5f, 13)));
    CHECK(g.codes[0] != 0x00);
  }
}

TEST_CASE("dsv41 reference: FP4 worked example and edge groups", "[unit]") {
  SECTION("worked example") {
    Fp4Group g;
    g.x[0] = 0.30078125f;  // a / 6 = 0.05013 -> E4M3 0.05078125 (0x15)
    g.x[1] = -0.1f;
    g.encode();
    CHECK(g.scale == 0x15);
    CHECK(g.code(0) == 7);  // 0.30078125 / 0.05078125 = 5.92 -> 6
    CHECK(kt::dsv41_e2m1_value(7) * kt::dsv41_e4m3_value(0x15) == 0.3046875f);
    CHECK(g.code(1) == (kt::dsv41_e2m1_encode(-0.1f / 0.05078125f)));
    CHECK(g.code(1) == 0xc);  // -1.97 -> -2
  }
  SECTION("all zero: scale 0x01; -0 keeps its sign") {
    Fp4Group g;
    g.x[5] = -0.0f;
    g.encode();
    CHECK(g.scale == 0x01);
    CHECK(g.code(0) == 0);
    CHECK(g.code(5) == 8);
  }
  SECTION("NaN or Inf: scale 0x7F, zero data") {
    for (const float bad : {kNaN, kInf, -kInf}) {
      Fp4Group g;
      g.x[0] = 3.0f;
      g.x[7] = bad;
      g.encode();
      CHECK(g.scale == 0x7f);
      for (uint8_t b : g.packed) CHECK(b == 0);
    }
  }
  SECTION("1e-5 group: the 2^-9 floor") {
    Fp4Group g;
    g.x[0] = 1e-5f;
    g.x[1] = -1e-5f;
    g.encode();
    CHECK(g.scale == 0x01);
    CHECK(g.code(0) == 0);  // 1e-5 / 2^-9 = 0.005
    CHECK(g.code(1) == 8);
  }
  SECTION("x1000 group: the 448 ceiling") {
    Fp4Group g;
    for (int i = 0; i < 16; ++i) g.x[i] = (i % 2 ? -1000.0f : 1000.0f) * (i + 1) / 4.0f;  // amax 4000: a / 6 > 448
    g.encode();
    CHECK(g.scale == 0x7e);
    CHECK(g.code(15) == 0xf);    // -4000 / 448 saturates to -6
    CHECK(g.code(0) == 1);       // 250 / 448 = 0.558 -> 0.5
  }
  SECTION("division by the rounded scale, at every E2M1 tie") {
    // amax 6 -> scale exactly 1 (0x38): y = x.
    const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const int want[] = {0, 2, 2, 4, 4, 6, 6};
    Fp4Group g;
    g.x[15] = 6.0f;
    for (int i = 0; i < 7; ++i) {
      g.x[2 * i] = ties[i];
      g.x[2 * i + 1] = -ties[i];
    }
    g.encode();
    CHECK(g.scale == 0x38);
    for (int i = 0; i < 7; ++i) {
      INFO("tie " << ties[i]);
      CHECK(g.code(2 * i) == want[i]);
      CHECK(g.code(2 * i + 1) == (want[i] | 8));
    }
  }
  SECTION("subnormal E4M3 scale") {
    Fp4Group g;
    g.x[0] = 6.0f * std::ldexp(1.0f, -8);  // a / 6 = 2^-8 = code 2
    g.encode();
    CHECK(g.scale == 0x02);
    CHECK(g.code(0) == 7);
  }
}

TEST_CASE("dsv41 reference: FOOTER addressing of a slot", "[unit]") {
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    const int rec = kt::dsv41_record_bytes(f), data = f == Dsv41Format::kFp8 ? 512 : 256;
    const int page = 3;
    const long long stride = page * rec + 48;
    std::vector<uint8_t> pool(3 * stride, 0xab);
    std::vector<float> x(512, 0.0f);
    x[0] = 6.0f;
    kt::dsv41_write_slot(f, pool.data(), stride, page, 4, x.data());  // page 1, row 1
    for (long long i = 0; i < static_cast<long long>(pool.size()); ++i) {
      const bool in_data = i >= stride + data && i < stride + 2 * data;
      const bool in_scales = i >= stride + page * data + (rec - data) && i < stride + page * data + 2 * (rec - data);
      if (!in_data && !in_scales) REQUIRE(pool[i] == 0xab);
      else REQUIRE(pool[i] != 0xab);
    }
    CHECK(kt::dsv41_read_dim(f, pool.data(), stride, page, 4, 0) == 6.0f);
    CHECK(kt::dsv41_read_dim(f, pool.data(), stride, page, 4, 1) == 0.0f);
  }
}

TEST_CASE("dsv41 reference: the E4M3 and E2M1 encoders agree with CUDA's host models of the cvt instructions", "[unit]") {
  // cuda_fp8.hpp / cuda_fp4.hpp implement cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.satfinite.e2m1x2.f32
  // on the host. Every float of up to 12 significant bits over the ranges that matter (each bf16 and
  // fp16 value times a power of two), one ulp either side, both signs: ties, subnormal codes, zeros
  // and saturation.
  long checked = 0, differ_e4m3 = 0, differ_e2m1 = 0;
  for (int e = -40; e <= 12; ++e) {
    for (int m = 0; m < 4096; ++m) {
      for (const int d : {-1, 0, 1}) {
        float v = std::ldexp(1.0f + m / 4096.0f, e);
        std::uint32_t b;
        std::memcpy(&b, &v, 4);
        b += static_cast<std::uint32_t>(d);
        std::memcpy(&v, &b, 4);
        for (const float x : {v, -v}) {
          ++checked;
          differ_e4m3 += __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) != kt::dsv41_e4m3_encode(x);
          differ_e2m1 += __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) != kt::dsv41_e2m1_encode(x);
        }
      }
    }
  }
  for (const float x : {0.0f, -0.0f, 1e30f, -1e30f, kInf, -kInf}) {
    differ_e4m3 += __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) != kt::dsv41_e4m3_encode(x);
    differ_e2m1 += __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) != kt::dsv41_e2m1_encode(x);
  }
  CHECK(checked == 53 * 4096 * 3 * 2);
  CHECK(differ_e4m3 == 0);
  CHECK(differ_e2m1 == 0);
}
