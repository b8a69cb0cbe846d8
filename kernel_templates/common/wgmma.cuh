#pragma once
// Hopper warpgroup MMA (wgmma, sm_90a only): shared-memory matrix descriptors, the fence / commit /
// wait lifecycle, and the m64nNk16 bf16 and f16 instructions with fp32 accumulators, A from shared
// memory (ss) or registers (rs). Every function is force-inlined, so code for other targets that
// never calls them never emits the instructions. A kernel that uses them must be compiled for sm_90a.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

// Matrix descriptor of a shared-memory operand in the 128-byte swizzle layout (the pattern a TMA
// SWIZZLE_128B box or an XOR of address bits 4-6 with bits 7-9 produces). `addr` is the shared
// address of the operand's first element; the 8-row x 128-byte atom it sits in must be 1024-byte
// aligned (base offset 0). Byte offsets are multiples of 16:
//   K-major (rows of 64 bf16 along K): lbo unused (16), sbo = 1024 (next 8 rows);
//   MN-major (64 bf16 along N contiguous): lbo = bytes to the next 64-wide N block, sbo = bytes
//   to the next 8 K rows.
__device__ __forceinline__ u64 wgmma_desc_sw128(u32 addr, u32 lbo_bytes, u32 sbo_bytes) {
  u64 d = 0;
  d |= static_cast<u64>((addr & 0x3ffffu) >> 4);
  d |= static_cast<u64>((lbo_bytes >> 4) & 0x3fffu) << 16;
  d |= static_cast<u64>((sbo_bytes >> 4) & 0x3fffu) << 32;
  d |= static_cast<u64>(1) << 62;  // swizzle mode 1 = 128-byte
  return d;
}

// A descriptor moved by `bytes` (a multiple of 16) inside the same swizzle pattern (the start
// address field holds any shared address >> 4 without carrying into the next field).
__device__ __forceinline__ u64 wgmma_desc_advance(u64 desc, u32 bytes) { return desc + (bytes >> 4); }

// Matrix descriptor of a shared-memory operand in the no-swizzle ("interleave") layout, whose 8 x 16 B
// core matrices are 128 contiguous bytes. lbo: bytes between core matrices adjacent along K (K-major)
// or between 8-row K groups (MN-major); sbo: bytes between 8-row groups along M/N (K-major) or
// between 8-column N groups (MN-major). Base offset 0.
__device__ __forceinline__ u64 wgmma_desc_interleave(u32 addr, u32 lbo_bytes, u32 sbo_bytes) {
  return u64((addr >> 4) & 0x3fffu) | (u64((lbo_bytes >> 4) & 0x3fffu) << 16) | (u64((sbo_bytes >> 4) & 0x3fffu) << 32);
}

// Orders register accesses before the next wgmma (needed before the first wgmma of a batch and
// after any other instruction wrote an accumulator or A-fragment register).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma
// fence / wait (the registers are written asynchronously).
template <int kN>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void wgmma_fence_operand(u32 (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int kM, int kN>
__device__ __forceinline__ void wgmma_fence_operand(u32 (&d)[kM][kN]) {
#pragma unroll
  for (int i = 0; i < kM; ++i) wgmma_fence_operand(d[i]);
}

// Moves this warpgroup's per-thread register budget up or down (sm_90a). Every warp of the
// warpgroup executes it; the kernel needs a register cap at entry (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// D (+)= A * B for one m64nNk16 step: bf16 inputs, fp32 accumulators (N / 2 registers per thread;
// register i of thread t holds row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (t % 4) + i % 2). `accumulate` false overwrites D. kTransB 0 reads B K-major, 1
// MN-major; kTransA (ss) the same for A. The register A fragment (rs) has the same row/column
// pattern as a 64 x 16 accumulator, packed as bf16 pairs: a[0] = (row r, cols c, c+1),
// a[1] = (r + 8, c), a[2] = (r, c + 8), a[3] = (r + 8, c + 8) with r = 16 warp + lane / 4,
// c = 2 (lane % 4).
// Both operand forms of one shape for input type `ab` (its PTX name), written once: inline PTX needs
// every operand number spelled out, so `D` names the accumulator operand list, `R` its numbers, and
// i0..i6 are the numbers that follow them (kRegs .. kRegs + 6).
#define KILN_WGMMA_SHAPE(ab, n, kRegs, D, R, i0, i1, i2, i3, i4, i5, i6)                                      \
  template <int kTransB, int kTransA = 0>                                                                       \
  static __device__ __forceinline__ void ss(float (&d)[kRegs], u64 desc_a, u64 desc_b, bool accumulate) {       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #i2 ", 0;\n"                                             \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." ab "." ab " {" R "}, %" #i0 ", %" #i1       \
                 ", p, 1, 1, %" #i4 ", %" #i3 ";\n}\n"                                                          \
                 : D(0)                                                                                         \
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB), "n"(kTransA));   \
  }                                                                                                             \
  template <int kTransB>                                                                                        \
  static __device__ __forceinline__ void rs(float (&d)[kRegs], const u32 (&a)[4], u64 desc_b, bool accumulate) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #i5 ", 0;\n"                                             \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." ab "." ab " {" R "}, {%" #i0 ", %" #i1      \
                 ", %" #i2 ", %" #i3 "}, %" #i4 ", p, 1, 1, %" #i6 ";\n}\n"                                     \
                 : D(0)                                                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), \
                   "n"(kTransB));                                                                               \
  }

// Accumulator operands d[i] .. d[i + N - 1], and their operand numbers from %0.
#define KILN_WGMMA_D8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define KILN_WGMMA_D16(i) KILN_WGMMA_D8(i), KILN_WGMMA_D8(i + 8)
#define KILN_WGMMA_D32(i) KILN_WGMMA_D16(i), KILN_WGMMA_D16(i + 16)
#define KILN_WGMMA_D64(i) KILN_WGMMA_D32(i), KILN_WGMMA_D32(i + 32)
#define KILN_WGMMA_D96(i) KILN_WGMMA_D64(i), KILN_WGMMA_D32(i + 64)
#define KILN_WGMMA_D128(i) KILN_WGMMA_D64(i), KILN_WGMMA_D64(i + 64)
#define KILN_WGMMA_R8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define KILN_WGMMA_R16 KILN_WGMMA_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define KILN_WGMMA_R32 KILN_WGMMA_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KILN_WGMMA_R64 KILN_WGMMA_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KILN_WGMMA_R96 KILN_WGMMA_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define KILN_WGMMA_R128 KILN_WGMMA_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// The shapes the kernels issue, per input type.
#define KILN_WGMMA_N16(ab) KILN_WGMMA_SHAPE(ab, 16, 8, KILN_WGMMA_D8, KILN_WGMMA_R8, 8, 9, 10, 11, 12, 13, 14)
#define KILN_WGMMA_N32(ab) KILN_WGMMA_SHAPE(ab, 32, 16, KILN_WGMMA_D16, KILN_WGMMA_R16, 16, 17, 18, 19, 20, 21, 22)
#define KILN_WGMMA_N64(ab) KILN_WGMMA_SHAPE(ab, 64, 32, KILN_WGMMA_D32, KILN_WGMMA_R32, 32, 33, 34, 35, 36, 37, 38)
#define KILN_WGMMA_N128(ab) \
  KILN_WGMMA_SHAPE(ab, 128, 64, KILN_WGMMA_D64, KILN_WGMMA_R64, 64, 65, 66, 67, 68, 69, 70)
#define KILN_WGMMA_N192(ab) \
  KILN_WGMMA_SHAPE(ab, 192, 96, KILN_WGMMA_D96, KILN_WGMMA_R96, 96, 97, 98, 99, 100, 101, 102)
#define KILN_WGMMA_N256(ab) \
  KILN_WGMMA_SHAPE(ab, 256, 128, KILN_WGMMA_D128, KILN_WGMMA_R128, 128, 129, 130, 131, 132, 133, 134)

template <int kN>
struct WgmmaBf16;
template <>
struct WgmmaBf16<16> {
  KILN_WGMMA_N16("bf16")
};
template <>
struct WgmmaBf16<32> {
  KILN_WGMMA_N32("bf16")
};
template <>
struct WgmmaBf16<64> {
  KILN_WGMMA_N64("bf16")
};
template <>
struct WgmmaBf16<128> {
  KILN_WGMMA_N128("bf16")
};
template <>
struct WgmmaBf16<192> {
  KILN_WGMMA_N192("bf16")
};
template <>
struct WgmmaBf16<256> {
  KILN_WGMMA_N256("bf16")
};

// D (+)= A * B for one m64nNk16 step with f16 inputs, fp32 accumulators: as WgmmaBf16<N>.
template <int kN>
struct WgmmaF16;
template <>
struct WgmmaF16<32> {
  KILN_WGMMA_N32("f16")
};
template <>
struct WgmmaF16<64> {
  KILN_WGMMA_N64("f16")
};
template <>
struct WgmmaF16<192> {
  KILN_WGMMA_N192("f16")
};
template <>
struct WgmmaF16<256> {
  KILN_WGMMA_N256("f16")
};

#undef KILN_WGMMA_N16
#undef KILN_WGMMA_N32
#undef KILN_WGMMA_N64
#undef KILN_WGMMA_N128
#undef KILN_WGMMA_N192
#undef KILN_WGMMA_N256
#undef KILN_WGMMA_R8
#undef KILN_WGMMA_R16
#undef KILN_WGMMA_R32
#undef KILN_WGMMA_R64
#undef KILN_WGMMA_R96
#undef KILN_WGMMA_R128
#undef KILN_WGMMA_D8
#undef KILN_WGMMA_D16
#undef KILN_WGMMA_D32
#undef KILN_WGMMA_D64
#undef KILN_WGMMA_D96
#undef KILN_WGMMA_D128
#undef KILN_WGMMA_SHAPE

#endif  // __CUDACC__

}  // namespace kiln
