#pragma once
// Scalar types, conversions and warp-wide operations shared by every family. Compiled only by NVRTC (or
// nvcc in standalone checks): no host headers, no cuda_bf16.h (NVRTC 13.0 does not ship it).

namespace kiln {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;

#ifdef __CUDACC__

// ---- bf16 (stored as raw u16 bits) ----
__device__ __forceinline__ float bf16_to_float(u16 bits) { return __uint_as_float(u32(bits) << 16); }

// Round to nearest even; NaN becomes the canonical 0x7fff.
__device__ __forceinline__ u16 float_to_bf16(float f) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// Two floats -> packed bf16x2, `lo` in the low half (the first element in memory).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float bf16x2_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16x2_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// ---- fp8 e4m3 (OCP e4m3fn) ----
// Two e4m3 bytes (low byte first) -> packed f16x2 bits. Exact: every e4m3 value is an f16.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u16 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
}

__device__ __forceinline__ float f16_bits_to_float(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ float e4m3_to_float(u8 v) {
  return f16_bits_to_float(u16(e4m3x2_to_f16x2(u16(v)) & 0xffffu));
}

// Round to nearest even, saturating to +-448; NaN stays NaN (0x7f).
__device__ __forceinline__ u8 float_to_e4m3_satfinite(float f) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
  return u8(r & 0xffu);
}

// ---- warp ----
// Lane `src`'s 64-bit value (a pointer, a bit mask), as two 32-bit shuffles over the whole warp.
__device__ __forceinline__ u64 shfl_u64(u64 v, int src) {
  const u32 lo = __shfl_sync(0xffffffffu, u32(v), src);
  return (u64(__shfl_sync(0xffffffffu, u32(v >> 32), src)) << 32) | lo;
}

// Sum and max of v over the warp's lanes (redux.sync, sm_80+); every lane gets them.
__device__ __forceinline__ u32 warp_redux_add(u32 v) {
  u32 r;
  asm volatile("redux.sync.add.u32 %0, %1, 0xffffffff;\n" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ u32 warp_redux_max(u32 v) {
  u32 r;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;\n" : "=r"(r) : "r"(v));
  return r;
}

#endif  // __CUDACC__

}  // namespace kiln
