#pragma once
// Fast NVFP4 (E2M1 codes + E4M3 block scales) decode for GPUs without FP4 conversion instructions
// (sm_90). Codes become f16 by bit placement, then one f16x2 multiply applies the block scale.
#include "common/mma.cuh"
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ u32 hmul2_f16(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Packed f16x2 -> packed bf16x2 (same element order).
__device__ __forceinline__ u32 f16x2_to_bf16x2(u32 v) {
  return pack_bf16x2(f16_bits_to_float(u16(v & 0xffffu)), f16_bits_to_float(u16(v >> 16)));
}

// An E2M1 nibble s|e1 e0|m placed as f16 bits s<<15 | (e1 e0 m)<<9 is the code's value times 2^-14,
// subnormal case (e=0) included, so a multiply by (scale * 2^14) gives the exact product.
constexpr int kE2m1RawExponent = 14;

// Eight codes of one little-endian word (element 2i in the low nibble of byte i) -> four f16x2 words
// holding code * 2^-14, elements in memory order (out[i] = elements 2i, 2i+1).
__device__ __forceinline__ void e2m1x8_to_f16_raw(u32 w, u32 (&out)[4]) {
  // Per byte, the f16 high byte of its low nibble (sign to bit 7, magnitude to bits 3..1) ...
  const u32 lo = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu);
  // ... and of its high nibble.
  const u32 hi = (w & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu);
  const u32 x01 = prmt(lo, hi, 0x5410u);  // lo.b0 lo.b1 hi.b0 hi.b1
  const u32 x23 = prmt(lo, hi, 0x7632u);
  // Each f16 is (high byte, zero low byte); selector 4 picks a zero byte of the second operand.
  out[0] = prmt(x01, 0u, 0x2404u);
  out[1] = prmt(x01, 0u, 0x3414u);
  out[2] = prmt(x23, 0u, 0x2404u);
  out[3] = prmt(x23, 0u, 0x3414u);
}

// Two adjacent E4M3 scale bytes (low byte = first group) -> f16x2 of scale * 2^extra_exp, exact while
// 448 * 2^extra_exp <= 65504 (extra_exp <= 7).
template <int kExtraExp>
__device__ __forceinline__ u32 e4m3x2_scale_f16x2(u16 two_scales) {
  static_assert(kExtraExp >= 0 && kExtraExp <= 7, "scale * 2^k must stay finite in f16");
  constexpr u32 kMul = u32(15 + kExtraExp) << 10;
  return hmul2_f16(e4m3x2_to_f16x2(two_scales), kMul | (kMul << 16));
}

// Broadcast one half of an f16x2 into both halves.
__device__ __forceinline__ u32 f16x2_bcast_lo(u32 v) { return prmt(v, v, 0x1010u); }
__device__ __forceinline__ u32 f16x2_bcast_hi(u32 v) { return prmt(v, v, 0x3232u); }

// Eight codes times one block scale given as f16x2 of (scale * 2^(14 - k)) gives value * 2^-k in f16.
__device__ __forceinline__ void e2m1x8_to_f16_scaled(u32 w, u32 scale2, u32 (&out)[4]) {
  e2m1x8_to_f16_raw(w, out);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = hmul2_f16(out[i], scale2);
}

// One 16-byte unit of 32 codes, two scale groups of 16 (words 0-1 and 2-3), with the groups' two E4M3
// scales (low byte first): four 16-byte pieces of 8 f16 values, value * 2^(kExtraExp - 14).
template <int kExtraExp>
__device__ __forceinline__ void e2m1x32_to_f16_scaled(const u32 (&codes)[4], u16 two_scales, u32 (&out)[4][4]) {
  const u32 s2 = e4m3x2_scale_f16x2<kExtraExp>(two_scales);
  const u32 s_lo = f16x2_bcast_lo(s2), s_hi = f16x2_bcast_hi(s2);
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) e2m1x8_to_f16_scaled(codes[wi], wi < 2 ? s_lo : s_hi, out[wi]);
}

// e2m1x32_to_f16_scaled with each 16-byte piece handed to put(piece, U32x4) (piece p: dims 8p .. 8p + 7
// of the unit), so that a caller's stores sit next to the decode they follow.
template <int kExtraExp, class Put>
__device__ __forceinline__ void e2m1x32_decode_unit(U32x4 codes, u16 two_scales, Put&& put) {
  const u32 words[4] = {codes.x, codes.y, codes.z, codes.w};
  u32 o[4][4];
  e2m1x32_to_f16_scaled<kExtraExp>(words, two_scales, o);
#pragma unroll
  for (int p = 0; p < 4; ++p) put(p, U32x4{o[p][0], o[p][1], o[p][2], o[p][3]});
}

#endif  // __CUDACC__

}  // namespace kiln
