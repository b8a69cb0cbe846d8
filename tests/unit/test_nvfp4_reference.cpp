// The CPU NVFP4 reference's conversions against NVIDIA's own statement of the hardware rounding: the
// host paths of __nv_cvt_float_to_fp4 (cvt.rn.satfinite.e2m1x2.f32) and __nv_cvt_float_to_fp8
// (cvt.rn.satfinite.e4m3x2.f32) in the CUDA toolkit headers. The reference itself is a brute-force
// nearest-value search, so the two are written independently.
#include <catch2/catch.hpp>

// The toolkit headers leave a parameter unused, which -Werror would reject.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/support/nvfp4_reference.h"

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every fp32 bit pattern at a stride coprime to everything, plus the neighbourhood (+-4 ulps, both
// signs) of every E2M1 and E4M3 rounding midpoint and grid value: where a rounding rule can differ.
std::vector<float> probe_values() {
  std::vector<float> v;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 65521) v.push_back(from_bits(static_cast<std::uint32_t>(u)));
  std::vector<double> anchors = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 448.0, 464.0, 480.0};
  for (int c = 0; c < 127; ++c) {
    anchors.push_back(kiln::testing::e4m3_to_float(static_cast<std::uint8_t>(c)));
    anchors.push_back((kiln::testing::e4m3_to_float(static_cast<std::uint8_t>(c)) + kiln::testing::e4m3_to_float(static_cast<std::uint8_t>(c + 1))) / 2);
  }
  for (const double a : anchors) {
    std::uint32_t u;
    const float f = static_cast<float>(a);
    std::memcpy(&u, &f, 4);
    for (std::uint32_t d = 0; d <= 8; ++d) {
      for (const std::uint32_t sign : {0u, 0x80000000u}) v.push_back(from_bits(((u + d - 4) & 0x7fffffffu) | sign));
    }
  }
  return v;
}

}  // namespace

TEST_CASE("nvfp4 reference: E2M1 and E4M3 conversions agree with the CUDA toolkit's", "[unit]") {
  std::size_t e2m1_bad = 0, e4m3_bad = 0, n = 0;
  for (const float f : probe_values()) {
    ++n;
    const unsigned want_e2m1 = __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest);
    const unsigned want_e4m3 = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    if (kiln::testing::float_to_e2m1(f) != want_e2m1 && e2m1_bad++ < 5) {
      FAIL_CHECK("e2m1 of " << f << ": reference " << int(kiln::testing::float_to_e2m1(f)) << ", toolkit " << want_e2m1);
    }
    if (kiln::testing::float_to_e4m3_satfinite(f) != want_e4m3 && e4m3_bad++ < 5) {
      FAIL_CHECK("e4m3 of " << f << ": reference " << int(kiln::testing::float_to_e4m3_satfinite(f)) << ", toolkit " << want_e4m3);
    }
  }
  CHECK(n > 60000);
  CHECK(e2m1_bad == 0);
  CHECK(e4m3_bad == 0);
}

TEST_CASE("nvfp4 reference: signed zeros, NaN and saturation of one token", "[unit]") {
  namespace kt = kiln::testing;
  std::vector<std::uint16_t> x(512, 0);
  x[0] = 0x8000;                         // -0 in an all-zero group: scale 0, code 0x8
  x[16] = kt::float_to_bf16(1.0f);       // group 1: scale e4m3(1/6)
  x[17] = kt::float_to_bf16(-1e-3f);     // rounds to zero, keeps its sign
  x[18] = 0xffc1;                        // negative NaN: +6
  x[32] = 0xff80;                        // group 2: -Inf saturates the scale; -Inf -> -6
  std::vector<std::uint8_t> data(kt::kNvfp4DataBytes), scales(kt::kNvfp4ScaleBytes);
  kt::nvfp4_quantize_token(x.data(), data.data(), scales.data());
  CHECK(scales[0] == 0x00);
  CHECK(data[0] == 0x08);
  CHECK(scales[1] == kt::float_to_e4m3_satfinite(1.0f / 6.0f));
  CHECK((data[8] & 0xf) == 0x7);  // 1.0 / scale is about 6
  CHECK((data[8] >> 4) == 0x8);
  CHECK((data[9] & 0xf) == 0x7);
  CHECK(scales[2] == 0x7e);
  CHECK((data[16] & 0xf) == 0xf);
  CHECK(scales[28] == 0);  // padding
}

// Q's round trip multiplies by the reciprocals it is given (the GPU suites pass the device's
// rcp.approx.ftz values): a value on an E2M1 tie moves to the other neighbour when its scale's
// reciprocal is one ulp larger.
TEST_CASE("nvfp4 reference: Q's round trip takes the given reciprocals", "[unit]") {
  namespace kt = kiln::testing;
  const std::uint8_t one = kt::float_to_e4m3_satfinite(1.0f);
  REQUIRE(kt::e4m3_to_float(one) == 1.0f);
  std::vector<float> exact(kt::kNvfp4NopeDims, 0.0f);
  exact[0] = 6.0f;  // amax 6: scale 1
  exact[1] = 2.5f;  // between 2 and 3: the even code, 2
  exact[2] = -2.5f;
  exact[3] = std::numeric_limits<float>::quiet_NaN();  // +6, and out of amax
  std::vector<float> nudged = exact;
  kt::nvfp4_round_trip_nope(exact.data());
  CHECK(exact[0] == 6.0f);
  CHECK(exact[1] == 2.0f);
  CHECK(exact[2] == -2.0f);
  CHECK(exact[3] == 6.0f);
  kt::Nvfp4Reciprocals rcp = kt::nvfp4_exact_reciprocals();
  rcp[one] = std::nextafter(1.0f, 2.0f);
  kt::nvfp4_round_trip_nope(nudged.data(), rcp);
  CHECK(nudged[0] == 6.0f);
  CHECK(nudged[1] == 3.0f);
  CHECK(nudged[2] == -3.0f);
  CHECK(nudged[3] == 6.0f);
}
