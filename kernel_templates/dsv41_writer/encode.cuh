#pragma once
// Encoders of the DeepSeek-V4.1 caches (runtime/dsv41_writer/README.md has the rules). Each lane
// holds 16 consecutive values of a 512-wide row as fp32 (exact: bf16 and fp16 widen exactly).
// Every division is div.rn.f32, whatever the compile options: an approximate quotient would move
// values that sit exactly on a rounding tie.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

__device__ __forceinline__ float dsv41_div_rn(float a, float b) {
  float q;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}

// Two values -> two E4M3 bytes (lo in the low byte): round to nearest even, saturating to +-448,
// subnormals kept, the sign kept for values that round to zero.
__device__ __forceinline__ u32 dsv41_e4m3x2(float lo, float hi) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// E2M1 code of a finite y: nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6} with ties to the even code,
// saturating at 6, the sign kept (so -0 and negatives that round to zero give 0x8).
__device__ __forceinline__ u32 dsv41_e2m1(float y) {
  const float a = fabsf(y);
  const u32 m = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u : a <= 2.5f ? 4u : a < 3.5f ? 5u : a <= 5.0f ? 6u : 7u;
  return m | ((__float_as_uint(y) >> 28) & 8u);
}

// The 16 values of this lane from two 16-byte loads of bf16 or fp16 bits.
__device__ __forceinline__ void dsv41_widen(const uint4& a, const uint4& b, bool fp16, float (&x)[16]) {
  const u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (fp16) {
      x[2 * i] = f16_bits_to_float(u16(w[i] & 0xffffu));
      x[2 * i + 1] = f16_bits_to_float(u16(w[i] >> 16));
    } else {
      x[2 * i] = bf16x2_lo(w[i]);
      x[2 * i + 1] = bf16x2_hi(w[i]);
    }
  }
}

struct Dsv41GroupStats {
  float amax = 0.0f;  // over the finite |x|
  bool nan = false;
  bool inf = false;
};

__device__ __forceinline__ Dsv41GroupStats dsv41_stats(const float (&x)[16]) {
  Dsv41GroupStats s;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const u32 m = __float_as_uint(x[i]) & 0x7fffffffu;
    s.nan |= m > 0x7f800000u;
    s.inf |= m == 0x7f800000u;
    if (m < 0x7f800000u) s.amax = fmaxf(s.amax, __uint_as_float(m));
  }
  return s;
}

// FP8 (528 B cache): a 32-value group spans lanes 2g and 2g + 1, so every lane of the warp must
// call this together. Writes this lane's 16 codes, returns the group's UE8M0 scale byte.
__device__ __forceinline__ u32 dsv41_fp8_encode(const float (&x)[16], uint4& codes) {
  Dsv41GroupStats s = dsv41_stats(x);
  s.amax = fmaxf(s.amax, __shfl_xor_sync(0xffffffffu, s.amax, 1));
  s.nan = __shfl_xor_sync(0xffffffffu, int(s.nan), 1) != 0 || s.nan;
  s.inf = __shfl_xor_sync(0xffffffffu, int(s.inf), 1) != 0 || s.inf;
  u32 c[4];
  if (s.nan) {
    codes = make_uint4(0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu);
    return 0xffu;
  }
  if (s.inf) {
    // Infinite values give the E4M3 NaN code, finite ones a zero of their sign.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      c[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u32 bits = __float_as_uint(x[4 * i + j]);
        const u32 code = (bits & 0x7fffffffu) == 0x7f800000u ? 0x7fu : (bits >> 24) & 0x80u;
        c[i] |= code << (8 * j);
      }
    }
    codes = make_uint4(c[0], c[1], c[2], c[3]);
    return 0xffu;
  }
  const float floor = __uint_as_float(0x38d1b717u);  // 1e-4
  const float r = fmaxf(dsv41_div_rn(fmaxf(s.amax, floor), 448.0f), floor);
  // The least k with 2^k >= r: r's exponent, plus one unless r is a power of two. r >= 1e-4 is normal.
  const u32 rb = __float_as_uint(r);
  const int k = int(rb >> 23) - 127 + ((rb & 0x7fffffu) != 0u ? 1 : 0);
  const float inv = __uint_as_float(u32(127 - k) << 23);  // 2^-k, k in [-13, 120]: a normal float
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) y[j] = fminf(fmaxf(__fmul_rn(x[4 * i + j], inv), -448.0f), 448.0f);
    c[i] = dsv41_e4m3x2(y[0], y[1]) | (dsv41_e4m3x2(y[2], y[3]) << 16);
  }
  codes = make_uint4(c[0], c[1], c[2], c[3]);
  return u32(k + 127);
}

// FP4 (288 B cache): one 16-value group per lane. Writes the 8 code bytes (element 2i in the low
// nibble of byte i), returns the E4M3 scale byte.
__device__ __forceinline__ u32 dsv41_fp4_encode(const float (&x)[16], uint2& codes) {
  const Dsv41GroupStats st = dsv41_stats(x);
  if (st.nan || st.inf) {
    codes = make_uint2(0u, 0u);
    return 0x7fu;
  }
  // Floor 2^-9 (the smallest E4M3 subnormal), ceiling 448 (the largest finite E4M3).
  const u32 scale = float_to_e4m3_satfinite(fminf(fmaxf(dsv41_div_rn(st.amax, 6.0f), 0x1p-9f), 448.0f));
  const float s = e4m3_to_float(u8(scale));  // divide by the rounded scale
  u32 c[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i) c[i / 8] |= dsv41_e2m1(dsv41_div_rn(x[i], s)) << (4 * (i % 8));
  codes = make_uint2(c[0], c[1]);
  return scale;
}

#endif  // __CUDACC__

}  // namespace kiln
