#pragma once
// Warp-level tensor-core, ldmatrix, async-copy and shared-memory wrappers (sm_80+ PTX, valid on
// sm_90a and sm_120a). The *_addr / ldsm / lds / sts forms take precomputed 32-bit shared addresses,
// so a per-fragment address is one immediate add.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; `bytes` < 16 zero-fills the rest (0 = pure zero fill).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, u32 bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// Four 8x8 b16 matrices from shared memory; lane l supplies the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem_row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem_row)));
}

// D = A * B + D, m16n8k16, bf16 inputs, fp32 accumulators. A row-major fragment (4 regs), B "col" (2 regs).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D = A * B + D, m16n8k16, fp16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- on 32-bit shared addresses, raw shared-memory vectors, global loads, f16 packing ----

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void cp_async_16_addr(u32 smem, const void* gmem, u32 bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes));
}
// cp_async_16_addr issued only where `pred` holds, as a predicated instruction: a branch around it
// ends a basic block per copy and keeps the compiler from overlapping the copies' address math.
__device__ __forceinline__ void cp_async_16_if(u32 smem, const void* gmem, u32 bytes, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(smem), "l"(gmem),
      "r"(bytes), "r"(int(pred)));
}

struct U32x4 {
  u32 x, y, z, w;
};

__device__ __forceinline__ U32x4 lds128(u32 addr) {
  U32x4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(u32 addr, U32x4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ u32 lds_u32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ u64 lds64(u32 addr) {
  u64 v;
  asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts8(u32 addr, u32 v) { asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "r"(v)); }
__device__ __forceinline__ void sts16(u32 addr, u32 v) { asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "r"(v)); }
__device__ __forceinline__ void sts32(u32 addr, u32 v) { asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v)); }
__device__ __forceinline__ void sts_f32(u32 addr, float v) { asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v)); }
__device__ __forceinline__ float lds_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

// Read-only global 16-byte load that does not allocate in L1 (streamed data).
__device__ __forceinline__ U32x4 ldg128_stream(const void* p) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Read-only global 16-byte load when `pred`, else zeros. A predicated instruction, not a branch
// around a load, so a batch of these can all be in flight before the first use.
__device__ __forceinline__ U32x4 ldg128_if(const void* p, bool pred) {
  U32x4 v{0u, 0u, 0u, 0u};
  asm("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n @q ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}

// Two floats -> packed f16x2, `lo` in the low half.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One row of an accumulator fragment to global memory in whole 32-byte sectors. Lane c4 of the row's
// quad holds packed 16-bit pairs `a` at columns 8 j + 2 c4 and `b` at 8 (j + 1) + 2 c4 (j even);
// lanes c4 and c4 ^ 1 trade one pair so that each stores 8 contiguous bytes and the quad 32. Every
// lane of the warp must call it (a shuffle); `live` says whether this lane's row is stored. On the
// H200, storing each pair on its own (16 bytes per quad: half sectors) made a 64-row epilogue about
// twice as long.
__device__ __forceinline__ void st_quad_row_pairs(u16* row, int j, int c4, u32 a, u32 b, bool live) {
  const int odd = c4 & 1;
  const u32 y = __shfl_xor_sync(0xffffffffu, odd ? a : b, 1);
  if (live) *reinterpret_cast<uint2*>(row + 8 * (j + odd) + 2 * (c4 - odd)) = odd ? make_uint2(y, b) : make_uint2(a, y);
}

// st_quad_row_pairs from an accumulator fragment in the wgmma layout (per 8-column group j,
// x[4 j + 2 h] and x[4 j + 2 h + 1] are row half h's two columns): groups j and j + 1, times s.
template <int N>
__device__ __forceinline__ void st_acc_row_pairs(u16* row, const float (&x)[N], int j, int h, int c4, float s, bool live) {
  st_quad_row_pairs(row, j, c4, pack_bf16x2(x[4 * j + 2 * h] * s, x[4 * j + 2 * h + 1] * s),
                    pack_bf16x2(x[4 * j + 4 + 2 * h] * s, x[4 * j + 4 + 2 * h + 1] * s), live);
}

#endif  // __CUDACC__

}  // namespace kiln
