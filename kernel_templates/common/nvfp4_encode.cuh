#pragma once
// NVFP4 encoding of one 16-value group (E2M1 codes + one E4M3 scale), bit-exact with the upstream
// writer (FlashInfer's DeepSeek V4 cache pack/append, built with -use_fast_math). Its compiled rule:
//   amax  = fmaxf over |x| from 0 (a NaN element never wins);
//   scale = cvt.rn.satfinite.e4m3(amax * fp32(1/6))   (the division by 6 folds into this multiply);
//   inv   = scale == 0 ? 0 : rcp.approx.ftz(scale)     (MUFU.RCP, not a correctly rounded 1/scale);
//   code  = cvt.rn.satfinite.e2m1(fp32(x * inv)): round to nearest, ties to the even code, |y| >= 6
//           (and +-Inf) -> +-6, NaN -> +6 (code 0x7), and a value that rounds to zero keeps its sign
//           (code 0x8 for negative values and -0).
// sm_100+ has the E2M1 conversion instruction; sm_90 computes the same bits in software.
// nvfp4_round_trip_group16 gives the values such a group reads back as (the attention kernels'
// rounding of Q), by the same rule.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The scale of a group whose largest |x| is `amax`: its E4M3 byte, that byte's value and the
// reciprocal every element is multiplied by before its E2M1 rounding.
struct Nvfp4GroupScale {
  u8 byte;
  float value, inv;
};
__device__ __forceinline__ Nvfp4GroupScale nvfp4_group_scale(float amax) {
  const u8 byte = float_to_e4m3_satfinite(__fmul_rn(amax, 0x1.555556p-3f));  // fp32(1/6)
  const float value = e4m3_to_float(byte);
  return {byte, value, value == 0.0f ? 0.0f : rcp_approx_ftz(value)};
}

// A magnitude `a` >= 0 rounded onto the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6, ...}, ties to the even
// code, before saturation: 7 and up round to 8 or more, +Inf (or a magic that overflows) to NaN.
// The grid step in a's binade (0.5 below 2, then 1, then 2) is the ulp of magic = 2^(22 +
// max(exponent, 0)), so a + magic rounds once onto the grid, ties to the even multiple of the
// step, which is the even code.
__device__ __forceinline__ float e2m1_grid_round(float a) {
  const float magic = __fmul_rn(__uint_as_float(__float_as_uint(fmaxf(a, 1.0f)) & 0x7f800000u), 0x1p22f);
  return __fsub_rn(__fadd_rn(a, magic), magic);
}

// The value of cvt.rn.satfinite.e2m1's code for any y: one fminf after the rounding saturates
// every y at 6 (a NaN rounding drops out of it), and the sign is y's. A NaN y from a NaN element
// is the GPU's canonical NaN (sign bit clear), so it becomes +6, as code 0x7 does. Same values as a
// compare-and-select rounding for every y = bf16 x fp32(1 / scale), +-Inf included (checked on the
// host for all bf16 and all 126 non-zero scales; on the H200 rcp.approx.ftz gives fp32(1 / scale)
// for every scale).
__device__ __forceinline__ float e2m1_round_value(float y) {
  const float r = fminf(e2m1_grid_round(fabsf(y)), 6.0f);
  return __uint_as_float(__float_as_uint(r) | (__float_as_uint(y) & 0x80000000u));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
// Two values -> one byte, `lo` in the low nibble.
__device__ __forceinline__ u32 e2m1x2_rn_satfinite(float lo, float hi) {
  u32 r;
  asm("{ .reg .b8 b; cvt.rn.satfinite.e2m1x2.f32 b, %1, %2; cvt.u32.u8 %0, b; }" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#else
// One value's E2M1 code magnitude as cvt.rn.satfinite.e2m1x2.f32 rounds it, before saturation,
// computed in fp32 (sm_90 has no FP4 conversion), as nibble k of a word. `y` must be finite with
// |y| <= 9.
// Scaled by 2^-126, the rounded magnitude (e2m1_grid_round) lands on fp32's subnormal boundary,
// where its bits are code << 22 (8 for 8: e2m1_saturate makes it 7). Multiplies place the fields,
// so that most of the work runs on the FMA pipe.
__device__ __forceinline__ u32 e2m1_magnitude(float y, int k) {
  const u32 code22 = __float_as_uint(__fmul_rn(e2m1_grid_round(fabsf(y)), 0x1p-126f));
  return k <= 5 ? __umulhi(code22, 1u << (10 + 4 * k)) : code22 * (1u << (4 * k - 22));
}

// satfinite on eight unsigned nibbles of 0..8: 8 (|y| >= 7) becomes 7 (6).
__device__ __forceinline__ u32 e2m1_saturate(u32 m) {
  const u32 big = m & 0x88888888u;
  return (m ^ big) | (big - (big >> 3));
}

// Any y: the clamp to +-6.5 saturates (6.5 rounds to 6) and turns NaN into +6.5 (fminf drops NaN),
// so the sign is read from the clamped value.
__device__ __forceinline__ u32 e2m1_nibble(float y, int k) {
  const float c = fmaxf(fminf(y, 6.5f), -6.5f);
  return e2m1_magnitude(c, k) + __umulhi(__float_as_uint(c), 2u) * (8u << (4 * k));
}

// Bit 3 of nibble k = the sign bit of element k of four bf16 pairs (element 2i: bits 0..15 of
// w[i]). Gathering bytes 1 and 3 of each pair puts elements 0, 2, 1, 3 (then 4, 6, 5, 7) at bits
// 7, 15, 23, 31; shifts move them to their nibbles.
__device__ __forceinline__ u32 bf16x8_sign_nibbles(const u32* w) {
  u32 e01, e23;
  asm("prmt.b32 %0, %1, %2, 0x7351;" : "=r"(e01) : "r"(w[0]), "r"(w[1]));
  asm("prmt.b32 %0, %1, %2, 0x7351;" : "=r"(e23) : "r"(w[2]), "r"(w[3]));
  return ((e01 >> 4) & 0x00000808u) | ((e01 >> 16) & 0x00008080u) | ((e23 << 12) & 0x08080000u) | (e23 & 0x80800000u);
}

// The eight nibbles of four bf16 pairs: the fields are disjoint, so they are summed as a tree (a
// short dependency chain) rather than one after another. In a bounded group x * inv has x's sign
// (inv is +0 or positive, and x is finite), so the signs come from the bf16 bits directly.
template <bool kBounded>
__device__ __forceinline__ u32 e2m1_word(const u32* w, float inv) {
  u32 t[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = __fmul_rn(bf16x2_lo(w[i]), inv), hi = __fmul_rn(bf16x2_hi(w[i]), inv);
    t[2 * i] = kBounded ? e2m1_magnitude(lo, 2 * i) : e2m1_nibble(lo, 2 * i);
    t[2 * i + 1] = kBounded ? e2m1_magnitude(hi, 2 * i + 1) : e2m1_nibble(hi, 2 * i + 1);
  }
  const u32 sum = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  return kBounded ? e2m1_saturate(sum) | bf16x8_sign_nibbles(w) : sum;
}

#endif

// Largest |x| over eight bf16 pairs, as an exact fp32. Packed maxima in a tree: with kNaN a NaN
// element makes the result NaN; without, NaN elements are ignored (an all-NaN group gives 0).
template <bool kNaN>
__device__ __forceinline__ float bf16x16_abs_max(const u32* w) {
  u32 m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = w[i] & 0x7fff7fffu;
#pragma unroll
  for (int n = 4; n >= 1; n /= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) {
      if (kNaN) {
        asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(m[i]) : "r"(m[i]), "r"(m[i + n]));
      } else {
        asm("max.bf16x2 %0, %1, %2;" : "=r"(m[i]) : "r"(m[i]), "r"(m[i + n]));
      }
    }
  }
  float r;
  if (kNaN) {
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(bf16x2_lo(m[0])), "f"(bf16x2_hi(m[0])));
  } else {
    r = fmaxf(0.0f, fmaxf(bf16x2_lo(m[0]), bf16x2_hi(m[0])));
  }
  return r;
}

// Sixteen bf16 values (a: elements 0..7, b: 8..15, little-endian pairs) -> eight code bytes
// (lo: elements 0..7, hi: 8..15, element 2i in the low nibble of byte i) and the scale byte.
__device__ __forceinline__ u32 nvfp4_encode_group16(const uint4& a, const uint4& b, u32& lo, u32& hi) {
  const u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  const float amax = bf16x16_abs_max<false>(w);
#else
  // NaN propagates through this maximum: such a group (rare) takes the general path below.
  float amax = bf16x16_abs_max<true>(w);
  // Up to 6 * 448 every |x| / scale is at most 9 (6.4 for normal scales, 9 for subnormal ones).
  const bool bounded = amax <= 2688.0f;
  if (!bounded) amax = bf16x16_abs_max<false>(w);
#endif
  const Nvfp4GroupScale gs = nvfp4_group_scale(amax);
  const float inv = gs.inv;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  u32 bytes[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) bytes[i] = e2m1x2_rn_satfinite(__fmul_rn(bf16x2_lo(w[i]), inv), __fmul_rn(bf16x2_hi(w[i]), inv));
  lo = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (bytes[3] << 24);
  hi = bytes[4] | (bytes[5] << 8) | (bytes[6] << 16) | (bytes[7] << 24);
#else
  if (bounded) {
    lo = e2m1_word<true>(w, inv);
    hi = e2m1_word<true>(w + 4, inv);
  } else {
    lo = e2m1_word<false>(w, inv);
    hi = e2m1_word<false>(w + 4, inv);
  }
#endif
  return gs.byte;
}

// What the group of nvfp4_encode_group16 reads back as, e2m1(code) * scale, as eight f16 pairs (the
// products are exact in f16: at most 6 significant bits, from 2^-10 to 6 * 448). Same rule, element
// by element in fp32: amax ignores NaN elements, a NaN element reads back as +6 * scale.
__device__ __forceinline__ void nvfp4_round_trip_group16(const uint4& a, const uint4& b, u32 (&h)[8]) {
  const u32 v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float x[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = bf16x2_lo(v[i]);
    x[2 * i + 1] = bf16x2_hi(v[i]);
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const Nvfp4GroupScale gs = nvfp4_group_scale(amax);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float lo = e2m1_round_value(__fmul_rn(x[2 * i], gs.inv)) * gs.value;
    const float hi = e2m1_round_value(__fmul_rn(x[2 * i + 1], gs.inv)) * gs.value;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h[i]) : "f"(hi), "f"(lo));
  }
}

#endif  // __CUDACC__

}  // namespace kiln
