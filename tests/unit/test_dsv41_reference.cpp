// The DeepSeek-V4.1 oracle (tests/support/dsv41_reference) against hand-computed values: every
// special byte of the three element encodings, the format's worked examples, the FOOTER addressing,
// and the attention semantics on problems small enough to check by hand. The element decoders are
// also compared, code by code, with the CUDA toolkit's own conversions, written independently.
#include <catch2/catch.hpp>

// The toolkit headers leave a parameter unused, which -Werror would reject.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#pragma GCC diagnostic pop

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/support/dsv41_reference.h"
#include "tests/support/nvfp4_reference.h"

namespace kt = kiln::testing;
using kt::Dsv41Format;

namespace {

constexpr int kDims = kt::kDsv41Dims;
constexpr double kLog2e = 1.4426950408889634;

// Bit-exact equality that also tells -0 from +0 and accepts NaN == NaN.
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

float half_bits_to_float(__half_raw h) { return __half2float(__half(h)); }

float bf16_bits_to_float(__nv_bfloat16_raw b) { return __bfloat162float(__nv_bfloat16(b)); }

}  // namespace

TEST_CASE("dsv41 reference: E4M3 special bytes and hand-computed values", "[unit]") {
  struct Expect {
    std::uint8_t code;
    float value;
  };
  // e > 0: 2^(e-7) (1 + m/8); e = 0: m 2^-9.
  const Expect table[] = {
      {0x00, 0.0f},          {0x80, -0.0f},         {0x01, 0x1p-9f},          {0x02, 0x1p-8f},
      {0x07, 7 * 0x1p-9f},   {0x87, -7 * 0x1p-9f},  {0x08, 0x1p-6f},          {0x0f, 1.875f * 0x1p-6f},
      {0x15, 0.05078125f},   {0x30, 0.5f},          {0x38, 1.0f},             {0x3c, 1.5f},
      {0xb8, -1.0f},         {0x40, 2.0f},          {0x7a, 320.0f},           {0x77, 240.0f},
      {0x78, 256.0f},        {0x7e, 448.0f},        {0xfe, -448.0f},          {0x7d, 416.0f},
  };
  for (const Expect& e : table) {
    INFO("code 0x" << std::hex << int(e.code));
    CHECK(same(kt::e4m3_to_float(e.code), e.value));
  }
  CHECK(std::isnan(kt::e4m3_to_float(0x7f)));
  CHECK(std::isnan(kt::e4m3_to_float(0xff)));
  // Exactly two NaN codes; 253 distinct finite values (+0 and -0 compare equal), strictly
  // increasing over 0x00..0x7e, and the negative half mirrors the positive one.
  int nan = 0;
  for (int c = 0; c < 256; ++c) nan += std::isnan(kt::e4m3_to_float(std::uint8_t(c)));
  CHECK(nan == 2);
  for (int c = 1; c < 0x7f; ++c) CHECK(kt::e4m3_to_float(std::uint8_t(c)) > kt::e4m3_to_float(std::uint8_t(c - 1)));
  for (int c = 0; c < 0x7f; ++c) CHECK(same(kt::e4m3_to_float(std::uint8_t(c | 0x80)), -kt::e4m3_to_float(std::uint8_t(c))));
}

TEST_CASE("dsv41 reference: UE8M0 scales are 2^(b-127), 0xff is NaN", "[unit]") {
  CHECK(kt::ue8m0_to_float(0x7f) == 1.0f);
  CHECK(kt::ue8m0_to_float(0x80) == 2.0f);
  CHECK(kt::ue8m0_to_float(0x7e) == 0.5f);
  CHECK(kt::ue8m0_to_float(0x72) == 0x1p-13f);   // the writer's floor (all-zero groups)
  CHECK(kt::ue8m0_to_float(0x75) == 0x1p-10f);   // the worked example's scale
  CHECK(kt::ue8m0_to_float(105) == 0x1p-22f);    // the other deployed writer's floor
  CHECK(kt::ue8m0_to_float(247) == 0x1p120f);    // the writer's largest
  CHECK(kt::ue8m0_to_float(0xfe) == 0x1p127f);
  CHECK(kt::ue8m0_to_float(0x00) == 0x1p-127f);  // a subnormal float, never written
  CHECK(kt::ue8m0_to_float(0x00) > 0.0f);
  CHECK(std::isnan(kt::ue8m0_to_float(0xff)));
}

TEST_CASE("dsv41 reference: E2M1 nibbles", "[unit]") {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    CHECK(same(kt::e2m1_to_float(std::uint8_t(c)), magnitudes[c]));
    CHECK(same(kt::e2m1_to_float(std::uint8_t(c | 8)), -magnitudes[c]));
  }
  CHECK(std::signbit(kt::e2m1_to_float(0x8)));  // -0
}

TEST_CASE("dsv41 reference: element decoders equal the CUDA toolkit's conversions for every code", "[unit]") {
  for (int c = 0; c < 256; ++c) {
    INFO("code " << c);
    const float e4m3 = half_bits_to_float(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3));
    CHECK(same(kt::e4m3_to_float(std::uint8_t(c)), e4m3));
    const float ue8m0 = bf16_bits_to_float(__nv_cvt_e8m0_to_bf16raw(static_cast<__nv_fp8_storage_t>(c)));
    CHECK(same(kt::ue8m0_to_float(std::uint8_t(c)), ue8m0));
  }
  for (int c = 0; c < 16; ++c) {
    INFO("nibble " << c);
    const float e2m1 = half_bits_to_float(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1));
    CHECK(same(kt::e2m1_to_float(std::uint8_t(c)), e2m1));
  }
}

TEST_CASE("dsv41 reference: main record (E4M3 x UE8M0 per 32 dims)", "[unit]") {
  std::vector<std::uint8_t> codes(512, 0x00), scales(16, 0x7f);
  std::vector<float> x(kDims);
  // Worked example: scale byte 0x75 (2^-10), code 0x7a (320): 0.3125.
  scales[3] = 0x75;
  codes[3 * 32 + 5] = 0x7a;
  // All-zero group as the writer stores it: scale 0x72, codes 0 and 0x80 (-0).
  scales[4] = 0x72;
  codes[4 * 32 + 1] = 0x80;
  // RoPE dims (groups 14 and 15) are quantized like the rest.
  scales[15] = 0x80;
  codes[511] = 0xc4;  // -3.0 * 2 = -6
  codes[480] = 0x01;  // 2^-9 * 2
  codes[448] = 0x01;  // group 14, scale 1: 2^-9
  // A NaN scale poisons its own 32 dims only; a NaN code its own element only.
  scales[7] = 0xff;
  codes[9 * 32 + 2] = 0x7f;
  codes[9 * 32 + 3] = 0x38;
  kt::dsv41_dequantize_main(codes.data(), scales.data(), x.data());
  CHECK(x[3 * 32 + 5] == 0.3125f);
  CHECK(x[3 * 32 + 4] == 0.0f);
  for (int d = 4 * 32; d < 5 * 32; ++d) CHECK(x[d] == 0.0f);
  CHECK(std::signbit(x[4 * 32 + 1]));
  CHECK(x[511] == -6.0f);
  CHECK(x[480] == 0x1p-8f);
  CHECK(x[448] == 0x1p-9f);
  for (int d = 0; d < kDims; ++d) {
    INFO("dim " << d);
    CHECK(std::isnan(x[d]) == (d / 32 == 7 || d == 9 * 32 + 2));
  }
  CHECK(x[9 * 32 + 3] == 1.0f);
}

TEST_CASE("dsv41 reference: extra record (E2M1 x E4M3 per 16 dims, low nibble first)", "[unit]") {
  std::vector<std::uint8_t> codes(256, 0x00), scales(32, 0x38);  // scale 1.0
  std::vector<float> x(kDims);
  // Worked example: scale 0x15 (0.05078125), code 7 (6): 0.3046875, in dim 2*40 (low nibble).
  scales[5] = 0x15;
  codes[40] = 0x27;  // dim 80: code 7; dim 81: code 2 (1.0)
  // All-zero group as the writer stores it: scale 0x01 (2^-9), codes 0 and 0x8 (-0).
  scales[6] = 0x01;
  codes[48] = 0x80;  // dim 97: -0
  // RoPE groups 28..31 are FP4 too; a subnormal scale 0x07 (7 * 2^-9).
  scales[30] = 0x07;
  codes[240] = 0xd5;  // dim 480: code 5 (3.0); dim 481: code 0xd (-3.0)
  // NaN scales 0x7f and 0xff poison their own 16 dims only.
  scales[10] = 0x7f;
  scales[11] = 0xff;
  codes[1] = 0x9f;  // dim 2: code 0xf (-6); dim 3: code 9 (-0.5)
  kt::dsv41_dequantize_extra(codes.data(), scales.data(), x.data());
  CHECK(x[80] == 0.3046875f);
  CHECK(x[81] == 0.05078125f);
  for (int d = 96; d < 112; ++d) CHECK(x[d] == 0.0f);
  CHECK(std::signbit(x[97]));
  CHECK(x[480] == 3.0f * 7 * 0x1p-9f);
  CHECK(x[481] == -3.0f * 7 * 0x1p-9f);
  CHECK(x[2] == -6.0f);
  CHECK(x[3] == -0.5f);
  for (int d = 0; d < kDims; ++d) {
    INFO("dim " << d);
    CHECK(std::isnan(x[d]) == (d / 16 == 10 || d / 16 == 11));
  }
}

TEST_CASE("dsv41 reference: FOOTER addressing (data rows, then scale rows, padded page stride)", "[unit]") {
  // Page size 3, page stride padded by 48 bytes; slot 7 is page 2, row 1.
  for (const Dsv41Format f : {Dsv41Format::kMain, Dsv41Format::kExtra}) {
    const kt::Dsv41Geometry g = kt::dsv41_geometry(f);
    const int page = 3;
    const long long stride = page * g.record_bytes + 48;
    CHECK(kt::dsv41_data_offset(f, stride, page, 7) == 2 * stride + g.data_bytes);
    CHECK(kt::dsv41_scale_offset(f, stride, page, 7) == 2 * stride + 3 * g.data_bytes + g.scale_bytes);
    CHECK(kt::dsv41_data_offset(f, stride, page, 0) == 0);
    CHECK(kt::dsv41_scale_offset(f, stride, page, 2) == 3 * g.data_bytes + 2 * g.scale_bytes);
    // A pool of NaN bytes but slot 7's two rows: only those are read.
    std::vector<std::uint8_t> pool(static_cast<std::size_t>(3 * stride), 0xff);
    std::memset(&pool[kt::dsv41_data_offset(f, stride, page, 7)], f == Dsv41Format::kMain ? 0x38 : 0x22, g.data_bytes);
    std::memset(&pool[kt::dsv41_scale_offset(f, stride, page, 7)], f == Dsv41Format::kMain ? 0x7e : 0x30, g.scale_bytes);
    std::vector<float> x(kDims);
    kt::dsv41_dequantize_slot({f, pool.data(), stride, page}, 7, x.data());
    for (int d = 0; d < kDims; ++d) CHECK(x[d] == 0.5f);  // main 1.0 * 2^-1; extra 1.0 * 0.5
  }
  CHECK(kt::dsv41_geometry(Dsv41Format::kMain).record_bytes == 528);
  CHECK(kt::dsv41_geometry(Dsv41Format::kExtra).record_bytes == 288);
}

namespace {

// A tiny problem whose rows are chosen value by value: main page size 2, extra page size 1, NaN
// bytes in every row no test case names as a valid candidate.
struct Tiny {
  static constexpr int kMainSlots = 8, kExtraSlots = 4;
  std::vector<std::uint8_t> main = std::vector<std::uint8_t>(kMainSlots / 2 * 2 * 528, 0xff);
  std::vector<std::uint8_t> extra = std::vector<std::uint8_t>(kExtraSlots * 288, 0xff);

  // Main slot: every dim `value` (an E4M3 code at scale 1), but dim `d` set to `code_d`.
  void set_main(int slot, std::uint8_t code, int d = -1, std::uint8_t code_d = 0) {
    std::uint8_t* data = &main[kt::dsv41_data_offset(Dsv41Format::kMain, 2 * 528, 2, slot)];
    std::memset(data, code, 512);
    if (d >= 0) data[d] = code_d;
    std::memset(&main[kt::dsv41_scale_offset(Dsv41Format::kMain, 2 * 528, 2, slot)], 0x7f, 16);
  }
  // Extra slot: every dim the E2M1 `nibble` times scale 1.0.
  void set_extra(int slot, std::uint8_t nibble) {
    std::memset(&extra[kt::dsv41_data_offset(Dsv41Format::kExtra, 288, 1, slot)], nibble | (nibble << 4), 256);
    std::memset(&extra[kt::dsv41_scale_offset(Dsv41Format::kExtra, 288, 1, slot)], 0x38, 32);
  }
  kt::Dsv41Problem problem(const std::vector<std::uint16_t>& q, int heads, const std::int32_t* idx, int topk,
                           const std::int32_t* xidx = nullptr, int xtopk = 0) const {
    kt::Dsv41Problem p;
    p.tokens = 1;
    p.heads = heads;
    p.q = q.data();
    p.main = {{Dsv41Format::kMain, main.data(), 2 * 528, 2}, idx, topk, topk, nullptr};
    if (xidx) p.extra = {{Dsv41Format::kExtra, extra.data(), 288, 1}, xidx, xtopk, xtopk, nullptr};
    p.sm_scale = 1.0;
    return p;
  }
};

// q[h] = a one-hot on dim d with bf16 value v.
std::vector<std::uint16_t> one_hot_q(int heads, int d, float v) {
  std::vector<std::uint16_t> q(static_cast<std::size_t>(heads) * kDims, 0);
  for (int h = 0; h < heads; ++h) q[static_cast<std::size_t>(h) * kDims + d] = kt::float_to_bf16(v);
  return q;
}

}  // namespace

TEST_CASE("dsv41 reference: one candidate gives its row, the LSE is its logit in base 2", "[unit]") {
  Tiny tiny;
  tiny.set_main(3, 0x38, 5, 0x40);  // ones, dim 5 = 2
  // q is used unquantized: 1 + 2^-7 is a bf16 value an NVFP4 round trip would not keep.
  const auto q = one_hot_q(1, 5, 1.0078125f);
  const std::int32_t idx[] = {3};
  kt::Dsv41Problem p = tiny.problem(q, 1, idx, 1);
  p.sm_scale = 0.5;
  std::vector<float> out(kDims), lse(1);
  kt::dsv41_reference(p, out.data(), lse.data());
  for (int d = 0; d < kDims; ++d) CHECK(out[d] == (d == 5 ? 2.0f : 1.0f));
  CHECK(lse[0] == Approx(0.5 * 2 * 1.0078125 * kLog2e).epsilon(1e-6));
}

TEST_CASE("dsv41 reference: softmax weights, duplicates per occurrence, masked and out-of-length slots", "[unit]") {
  Tiny tiny;
  tiny.set_main(1, 0x38);  // k = v = 1
  tiny.set_main(2, 0x00);  // k = v = 0
  const auto q = one_hot_q(1, 0, 1.0f);
  std::vector<float> out(kDims), lse(1);
  // Logits: slot 1 -> 1, slot 2 -> 0. Candidates {1, 2}: o = e / (e + 1).
  {
    const std::int32_t idx[] = {1, 2};
    kt::dsv41_reference(tiny.problem(q, 1, idx, 2), out.data(), lse.data());
    CHECK(out[7] == Approx(std::exp(1.0) / (std::exp(1.0) + 1)).epsilon(1e-6));
    CHECK(lse[0] == Approx(std::log(std::exp(1.0) + 1) * kLog2e).epsilon(1e-6));
  }
  // {1, 1, 2}: slot 1 counts twice: o = 2e / (2e + 1). Negative slots never count, and slots 0 and 5
  // (NaN bytes) and 7 (NaN) are only named past the length.
  {
    const std::int32_t idx[] = {1, -1, INT_MIN, 1, -12345, 2, 0, 5, 7};
    const std::int32_t len[] = {6};
    kt::Dsv41Problem p = tiny.problem(q, 1, idx, 9);
    p.main.lengths = len;
    kt::dsv41_reference(p, out.data(), lse.data());
    CHECK(out[100] == Approx(2 * std::exp(1.0) / (2 * std::exp(1.0) + 1)).epsilon(1e-6));
    CHECK(lse[0] == Approx(std::log(2 * std::exp(1.0) + 1) * kLog2e).epsilon(1e-6));
  }
  // Lengths clamp to [0, topk]: 99 reads all three slots, -4 none.
  {
    const std::int32_t idx[] = {1, 1, 2};
    const std::int32_t over[] = {99}, negative[] = {-4};
    kt::Dsv41Problem p = tiny.problem(q, 1, idx, 3);
    p.main.lengths = over;
    kt::dsv41_reference(p, out.data(), lse.data());
    CHECK(out[0] == Approx(2 * std::exp(1.0) / (2 * std::exp(1.0) + 1)).epsilon(1e-6));
    p.main.lengths = negative;
    kt::dsv41_reference(p, out.data(), lse.data());
    CHECK(out[0] == 0.0f);
    CHECK(lse[0] == -std::numeric_limits<float>::infinity());
  }
}

TEST_CASE("dsv41 reference: main and extra candidates share one softmax", "[unit]") {
  Tiny tiny;
  tiny.set_main(4, 0x38);   // 1.0
  tiny.set_extra(2, 0x4);   // 2.0 everywhere
  tiny.set_extra(3, 0xa);   // -1.0 everywhere
  const auto q = one_hot_q(2, 9, 1.0f);
  const std::int32_t idx[] = {4};
  const std::int32_t xidx[] = {-1, 2, 3, 0};
  const std::int32_t xlen[] = {3};  // slot 0 (NaN) past the extra length
  kt::Dsv41Problem p = tiny.problem(q, 2, idx, 1, xidx, 4);
  p.extra.lengths = xlen;
  std::vector<float> out(2 * kDims), lse(2);
  kt::dsv41_reference(p, out.data(), lse.data());
  // Logits 1, 2, -1; values 1, 2, -1.
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), em1 = std::exp(-1.0), z = e1 + e2 + em1;
  for (int h = 0; h < 2; ++h) {
    CHECK(out[h * kDims + 300] == Approx((e1 + 2 * e2 - em1) / z).epsilon(1e-6));
    CHECK(lse[h] == Approx(std::log(z) * kLog2e).epsilon(1e-6));
  }
}

TEST_CASE("dsv41 reference: sink and lse_scale", "[unit]") {
  Tiny tiny;
  tiny.set_main(6, 0x40);  // 2.0
  const auto q = one_hot_q(2, 0, 0.5f);  // logit 1
  const std::int32_t idx[] = {6};
  const float sink[] = {0.0f, 3.0f};
  kt::Dsv41Problem p = tiny.problem(q, 2, idx, 1);
  p.attn_sink = sink;
  for (const double lse_scale : {1.0, 0.5, 2.0, std::log(2.0)}) {
    p.lse_scale = lse_scale;
    std::vector<float> out(2 * kDims), lse(2);
    kt::dsv41_reference(p, out.data(), lse.data());
    for (int h = 0; h < 2; ++h) {
      // L = 1; o = 2 * sigmoid(L - sink); LSE = logaddexp(L, sink) * log2(e) * lse_scale.
      const double s = sink[h];
      CHECK(out[h * kDims + 1] == Approx(2.0 / (1.0 + std::exp(s - 1.0))).epsilon(1e-6));
      CHECK(lse[h] == Approx(std::log(std::exp(1.0) + std::exp(s)) * kLog2e * lse_scale).epsilon(1e-6));
    }
  }
}

TEST_CASE("dsv41 reference: empty rows give zeros and -inf, or the sink's LSE", "[unit]") {
  Tiny tiny;
  tiny.set_main(1, 0x38);
  tiny.set_extra(1, 0x2);
  const auto q = one_hot_q(2, 0, 1.0f);
  const std::int32_t masked[] = {-1, -1};
  const std::int32_t zero[] = {0};
  const float sink[] = {1.5f, -2.0f};
  for (const bool with_sink : {false, true}) {
    // Both sections masked; then both with length 0 (the slots name NaN rows).
    for (int variant = 0; variant < 2; ++variant) {
      const std::int32_t nan_slots[] = {0, 0};
      kt::Dsv41Problem p = tiny.problem(q, 2, variant ? nan_slots : masked, 2, variant ? nan_slots : masked, 2);
      if (variant) {
        p.main.lengths = zero;
        p.extra.lengths = zero;
      }
      p.attn_sink = with_sink ? sink : nullptr;
      p.lse_scale = 0.5;
      std::vector<float> out(2 * kDims, 7.0f), lse(2);
      kt::dsv41_reference(p, out.data(), lse.data());
      for (const float o : out) CHECK(same(o, 0.0f));
      for (int h = 0; h < 2; ++h) {
        if (with_sink) CHECK(lse[h] == Approx(sink[h] * kLog2e * 0.5).epsilon(1e-6));
        else CHECK(lse[h] == -std::numeric_limits<float>::infinity());
      }
    }
  }
  // Main empty, extra not (and the reverse): the other section alone decides.
  const std::int32_t one[] = {1, -1};
  std::vector<float> out(2 * kDims), lse(2);
  kt::dsv41_reference(tiny.problem(q, 2, masked, 2, one, 2), out.data(), lse.data());
  CHECK(out[3] == 1.0f);
  CHECK(lse[0] == Approx(1.0 * kLog2e));
  kt::dsv41_reference(tiny.problem(q, 2, one, 2, masked, 2), out.data(), lse.data());
  CHECK(out[3] == 1.0f);
}
