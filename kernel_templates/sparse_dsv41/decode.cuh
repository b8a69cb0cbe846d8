#pragma once
// Decode of the DeepSeek-V4.1 cache records into exact bf16 values (runtime/sparse_dsv41/README.md).
// Both products are exact in bf16: an E4M3 value has at most 4 significant bits and a power-of-two
// scale only moves its exponent; E2M1 times an E4M3 scale has at most 6 (the one exception, an FP8
// group within ~3% of the bf16 maximum, overflows as the format says it does).
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/nvfp4.cuh"

namespace kiln {

#ifdef __CUDACC__
namespace dsv41 {

// Byte j (0-3) of `word`, a UE8M0 scale, -> 2^(b - 127) in both halves of a packed bf16 pair; 0xFF
// is NaN and 0x00 is 2^-127 (a bf16 subnormal, which the bf16 multiply keeps). Both special bytes
// take the same 0x0040 per half: added to b << 7 it makes 0x7fc0 (NaN) from 0xFF and 0x0040 from 0x00.
__device__ __forceinline__ u32 ue8m0_to_bf16x2(u32 word, u32 j) {
  const u32 x = prmt(word, 0u, 0x4040u | j | (j << 8));  // b in the low byte of each half
  const bool special = ((x + 0x00010001u) & 0x00fe00feu) == 0u;
  return x * 128u + (special ? 0x00400040u : 0u);
}

__device__ __forceinline__ u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Two f16 values (packed) times a power of two (packed bf16), as packed bf16. Every value this file
// converts has at most 6 significant bits, so the bf16 pack is exact and the one rounding is the
// multiply's: the same bits as the product in f32 rounded to bf16, with one multiply per pair.
__device__ __forceinline__ u32 f16x2_scaled_to_bf16x2(u32 v, u32 scale2) {
  return mul_bf16x2(f16x2_to_bf16x2(v), scale2);
}

// 16 E4M3 codes of one 32-dim scale group (low byte first) -> 8 packed bf16 pairs in memory order:
// out[0..3] is dims 0..7 of the 16, out[4..7] dims 8..15.
__device__ __forceinline__ void e4m3x16_to_bf16(U32x4 codes, u32 scale2, u32 (&out)[8]) {
  const u32 w[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = f16x2_scaled_to_bf16x2(e4m3x2_to_f16x2(u16(w[i] & 0xffffu)), scale2);
    out[2 * i + 1] = f16x2_scaled_to_bf16x2(e4m3x2_to_f16x2(u16(w[i] >> 16)), scale2);
  }
}

// 32 E2M1 codes (two 16-dim groups) with their two E4M3 scales (low byte = first group) -> four
// 16-byte pieces of 8 packed bf16 values each. The shared NVFP4 decode yields value * 2^-7 in f16
// (exact, f16 subnormals included: every product is a multiple of 2^-17 below 21), which the
// conversion scales back by 2^7.
__device__ __forceinline__ void e2m1x32_to_bf16(const u32 (&codes)[4], u16 two_scales, u32 (&out)[4][4]) {
  constexpr int kShift = 7;
  constexpr u32 kUndo = (127u + kShift) << 7;  // 2^7 as bf16
  e2m1x32_to_f16_scaled<kE2m1RawExponent - kShift>(codes, two_scales, out);
#pragma unroll
  for (int p = 0; p < 4; ++p)
#pragma unroll
    for (int i = 0; i < 4; ++i) out[p][i] = f16x2_scaled_to_bf16x2(out[p][i], kUndo | (kUndo << 16));
}

}  // namespace dsv41
#endif  // __CUDACC__

}  // namespace kiln
