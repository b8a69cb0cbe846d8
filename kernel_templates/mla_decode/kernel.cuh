#pragma once
// Paged MLA decode (576-wide Q/K, V = first 512 columns of the same cache row): the two entry points
// of the module. mla_decode_kernel: grid (parts, row tiles); each CTA walks its part's pieces
// (schedule.cuh) with the wgmma kernel (sm_90a: kernel_wgmma.cuh for bf16, kernel_wgmma_fp8.cuh for
// e4m3), the KV-on-M wgmma kernel (sm_90a, kernel_kv.cuh) or the mma.sync kernel (kernel_mma.cuh),
// as mla_variant() picks for the target.
// mla_combine_kernel merges the pieces of split requests; it is launched (with programmatic dependent
// launch) only when a request can split.
#include "common/mbarrier.cuh"
#include "common/pdl.cuh"
#include "mla_decode/kernel_kv.cuh"
#include "mla_decode/kernel_mma.cuh"
#include "mla_decode/kernel_wgmma.cuh"
#include "mla_decode/kernel_wgmma_fp8.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"

namespace kiln {

#ifdef __CUDACC__

// The variant is a function of the policy and the target, so the same key compiles to the kernel
// each arch can run; the host planner mirrors it from the device's arch.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool kMlaSm90a = true;
#else
constexpr bool kMlaSm90a = false;
#endif

template <int kHeads, int kMaxSeqLenQ, bool kFp8, int kKernel>
constexpr MlaVariant kMlaCompiledVariant = mla_variant(kKernel, kHeads, kMaxSeqLenQ, kFp8, kMlaSm90a);

template <int kHeads, int kPageSize, int kMaxSeqLenQ, bool kPacked, bool kFp8, bool kCausal, int kKernel>
__global__ void __launch_bounds__(mla_variant_threads(kMlaCompiledVariant<kHeads, kMaxSeqLenQ, kFp8, kKernel>, kFp8), 1)
    mla_decode_kernel(const __grid_constant__ MlaDecodeParams p) {
  using namespace mla_detail;
  constexpr MlaVariant kV = kMlaCompiledVariant<kHeads, kMaxSeqLenQ, kFp8, kKernel>;
  constexpr int kThreads = mla_variant_threads(kV, kFp8);
  constexpr int kRows = mla_variant_rows(kV);
  static_assert(kMaxSeqLenQ >= 1 && kMaxSeqLenQ <= kMlaMaxSeqLenQ, "kMaxSeqLenQ must be in 1..64");

  extern __shared__ __align__(16) unsigned char smem[];
  const int part = blockIdx.x;
  const int row0 = blockIdx.y * kRows;
  // The part that holds a request's first block records how many pieces it has, for the combine.
  auto record = [&](const MlaPiece& pc) {
    if (pc.first && p.split_meta != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
      int* meta = static_cast<int*>(p.split_meta) + 2 * pc.b;
      meta[0] = pc.first_part;
      meta[1] = pc.num_pieces;
    }
  };

  if constexpr (kV.kv_rows > 0) {
    static_assert(kV.kv_rows > 0 && kMlaSm90a, "the KV-on-M wgmma MLA kernel needs sm_90a");
    static_assert(!kFp8, "the KV-on-M wgmma MLA kernel takes bf16 only");
    constexpr MlaKvSmem kL = mla_kv_smem(kV.kv_rows);
    const u32 raw = smem_addr(smem);
    const u32 base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
    long long* scratch = reinterpret_cast<long long*>(smem + (base - raw) + kL.sched_offset);
    if (threadIdx.x == 0) {
      // Every thread arrives once per fill (cp.async completion, .noinc).
      for (int i = 0; i < 1 + kMlaKvStages; ++i) mbar_init(base + kL.bar_offset + 8 * i, kMlaKvThreads);
      mbar_fence_init();
    }
    __syncthreads();
    MlaWgState st{0u, 0u};
    mla_for_each_piece<kThreads, kMlaKvTileTokens, kMaxSeqLenQ, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
      record(pc);
      if (row0 >= pc.r.q_len * kHeads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
      mla_kv_piece<kHeads, kPageSize, kMaxSeqLenQ, kCausal, kV.kv_rows>(p, base, pc, row0, pc.whole ? -1 : pc.b + part, st);
    });
  } else if constexpr (kV.wgmma && kFp8) {
    static_assert(kV.wgmma && kMlaSm90a, "the wgmma MLA kernel needs sm_90a");
    const u32 raw = smem_addr(smem);
    const u32 base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
    long long* scratch = reinterpret_cast<long long*>(smem + (base - raw) + kMlaWgFp8SchedOffset);
    if (threadIdx.x == 0) mla_wgmma_fp8_init_barriers(base);
    __syncthreads();
    MlaWgState st{0u, 0u};
    // The roles run the same piece sequence (the scheduler's CTA barriers included), each with its
    // own register budget: the producer's loads and widening need few, the consumers' O needs 128.
    if (threadIdx.x >= kMlaWgThreads) {
      setmaxnreg_dec<kMlaWgFp8ProducerRegs>();
      mla_for_each_piece<kThreads, kMlaWgTileTokens, kMaxSeqLenQ, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
        if (row0 >= pc.r.q_len * kHeads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
        mla_wgmma_fp8_producer<kHeads, kPageSize, kCausal>(p, base, pc, row0, st);
      });
    } else {
      setmaxnreg_inc<kMlaWgFp8ConsumerRegs>();
      mla_for_each_piece<kThreads, kMlaWgTileTokens, kMaxSeqLenQ, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
        record(pc);
        if (row0 >= pc.r.q_len * kHeads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
        mla_wgmma_fp8_consumer<kHeads, kMaxSeqLenQ, kCausal>(p, base, pc, row0, pc.whole ? -1 : pc.b + part, st);
      });
    }
  } else if constexpr (kV.wgmma) {
    static_assert(kV.wgmma && kMlaSm90a, "the wgmma MLA kernel needs sm_90a");
    const u32 raw = smem_addr(smem);
    const u32 base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
    long long* scratch = reinterpret_cast<long long*>(smem + (base - raw) + kMlaWgSchedOffset);
    if (threadIdx.x == 0) {
      // Every thread of both warpgroups arrives once per fill (cp.async completion, .noinc).
      for (int i = 0; i < 1 + kMlaWgStages; ++i) mbar_init(base + kMlaWgBarOffset + 8 * i, kMlaWgThreads);
      mbar_fence_init();
    }
    __syncthreads();
    MlaWgState st{0u, 0u};
    mla_for_each_piece<kThreads, kMlaWgTileTokens, kMaxSeqLenQ, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
      record(pc);
      // CTA-uniform. A split piece without scratch only follows a length above max_seq_len.
      if (row0 >= pc.r.q_len * kHeads || (!pc.whole && p.o_partial == nullptr)) return;
      mla_wgmma_piece<kHeads, kPageSize, kMaxSeqLenQ, kCausal>(p, base, pc, row0, pc.whole ? -1 : pc.b + part, st);
    });
  } else {
    constexpr MlaSmemLayout kLayout = mla_smem_layout(kV.tile, kFp8);
    long long* scratch = reinterpret_cast<long long*>(smem + kLayout.sched_offset);
    mla_for_each_piece<kThreads, kV.tile.tile_tokens, kMaxSeqLenQ, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
      record(pc);
      if (row0 >= pc.r.q_len * kHeads || (!pc.whole && p.o_partial == nullptr)) return;  // as above
      __syncthreads();                          // the previous piece is done with shared memory
      mla_mma_piece<kHeads, kPageSize, kMaxSeqLenQ, kFp8, kCausal, kV.tile.row_groups, kV.tile.col_groups,
                    kV.tile.tile_tokens, kV.tile.stages>(p, smem, pc, row0, pc.whole ? -1 : pc.b + part);
    });
  }
  // Lets the combine launch; it waits for this grid's completion before reading anything.
  pdl_launch_dependents();
}

namespace mla_detail {

// 16 bytes from global memory when `pred`, else zeros: a plain (coherent) load, since the data was
// written by the preceding kernel, and volatile so it stays after the dependency wait.
__device__ __forceinline__ U32x4 ld128_if(const void* p, bool pred) {
  U32x4 v{0u, 0u, 0u, 0u};
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n @q ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
               : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
               : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}

__device__ __forceinline__ float ld_f32(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ int ld_s32(const int* p) {
  int v;
  asm volatile("ld.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

}  // namespace mla_detail

// Merges the pieces of a split request: out = bmm2_scale * sum_s w_s O_s / sum_s w_s with
// w_s = 2^(lse_s - max lse). Pieces that saw no key (lse -inf) are skipped without reading their O,
// which the decode kernel never wrote. A CTA of eight warps takes 8 / W rows of one request, W =
// combine_row_warps warps per row (planner.cpp picks 8 or 4 from the pieces a request is expected to
// have). Each lane reads the lse of
// pieces lane, lane + 32, ... once, so the weights are in registers before any O load; warp k of a
// row takes pieces k, k + W, ... (all 512 columns, 16 per lane, four pieces' loads in flight), and
// the row's W partial sums meet in shared memory. Requests in one piece were written by the decode
// kernel itself.
template <int kHeads, int kMaxSeqLenQ, bool kPacked>
__global__ void __launch_bounds__(kMlaCombineThreads, 2) mla_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
  using namespace mla_detail;
  constexpr int kWarps = kMlaCombineThreads / 32;
  static_assert(kWarps == 8 && kMlaDimV == 512, "eight warps, 16 columns per lane");
  // A request's blocks span at most kMlaMaxPieces + 1 parts (the width keeps blocks / width <=
  // kMlaMaxPieces; a start inside a part adds one).
  constexpr int kLsePerLane = (kMlaMaxPieces + 1 + 31) / 32;
  static_assert(kLsePerLane == 3, "the weight registers below are w[0..2]");
  constexpr int kMaxRows = mla_max_rows(kHeads, kMaxSeqLenQ);
  __shared__ __align__(16) float part_sum[kWarps][kMlaDimV];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int row_warps = p.combine_row_warps;  // 1, 2, 4 or 8
  const int k_in_row = warp & (row_warps - 1);
  const int b = blockIdx.y;
  const int row = blockIdx.x * (kWarps / row_warps) + warp / row_warps;
  int tok0, q_len;
  if constexpr (kPacked) {
    tok0 = load_i32(p.qo_indptr, b);
    q_len = load_i32(p.qo_indptr, b + 1) - tok0;
  } else {
    tok0 = b * kMaxSeqLenQ;
    q_len = kMaxSeqLenQ;
  }
  if (blockIdx.x * (kWarps / row_warps) >= q_len * kHeads) return;  // CTA-uniform: no row of this CTA exists
  const bool live = row < q_len * kHeads;  // warp-uniform; a dead warp still meets the barrier below

  pdl_wait();  // the decode kernel's pieces and split records are complete and visible
  const int* meta = static_cast<const int*>(p.split_meta) + 2 * b;
  const int first = ld_s32(meta);
  const int n = ld_s32(meta + 1);
  if (n <= 1) return;  // CTA-uniform

  const long long slot0 = static_cast<long long>(b) + first;
  const float* lse = static_cast<const float*>(p.lse_partial) + slot0 * kMaxRows + row;
  constexpr long long kSlotStride = static_cast<long long>(kMaxRows) * kMlaDimV;
  // Every warp of the row finds the weights of all its pieces: lane l holds those of pieces l + 32 k.
  float w[kLsePerLane];
  float mx = neg_inf();
#pragma unroll
  for (int k = 0; k < kLsePerLane; ++k) {
    const int s = lane + 32 * k;
    w[k] = live && s < n ? ld_f32(lse + s * kMaxRows) : neg_inf();
    mx = fmaxf(mx, w[k]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kLsePerLane; ++k) {
    w[k] = w[k] == neg_inf() ? 0.f : fast_exp2(w[k] - mx);
    wsum += w[k];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);

  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.f;
  const float* o = static_cast<const float*>(p.o_partial) + (slot0 * kMaxRows + row) * kMlaDimV + 4 * lane;
  constexpr int kBatch = 4;
  for (int s0 = k_in_row; s0 < n; s0 += row_warps * kBatch) {
    float ws[kBatch];
    U32x4 v[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u * row_warps;  // warp-uniform
      const float mine = (s >> 5) == 0 ? w[0] : (s >> 5) == 1 ? w[1] : w[2];
      const float wt = __shfl_sync(0xffffffffu, mine, s & 31);
      ws[u] = s < n ? wt : 0.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) v[u][k] = ld128_if(o + s * kSlotStride + 128 * k, ws[u] > 0.f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[4 * k + 0] += ws[u] * __uint_as_float(v[u][k].x);
        acc[4 * k + 1] += ws[u] * __uint_as_float(v[u][k].y);
        acc[4 * k + 2] += ws[u] * __uint_as_float(v[u][k].z);
        acc[4 * k + 3] += ws[u] * __uint_as_float(v[u][k].w);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    *reinterpret_cast<float4*>(&part_sum[warp][128 * k + 4 * lane]) =
        make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]);
  }
  __syncthreads();
  if (!live) return;
  // Thread t of the row's 32 W threads writes columns [t c, t c + c), c = 16 / W.
  const int cols = 16 / row_warps;
  const int col0 = (32 * k_in_row + lane) * cols;
  const int warp0 = warp - k_in_row;
  const float inv = wsum > 0.f ? p.out_scale / wsum : 0.f;
  u16* out = static_cast<u16*>(p.out) + (static_cast<long long>(tok0) * kHeads + row) * kMlaDimV;
  for (int c = col0; c < col0 + cols; c += 2) {
    float r0 = 0.f, r1 = 0.f;
    for (int w2 = warp0; w2 < warp0 + row_warps; ++w2) {
      const float2 x = *reinterpret_cast<const float2*>(&part_sum[w2][c]);
      r0 += x.x;
      r1 += x.y;
    }
    *reinterpret_cast<u32*>(out + c) = pack_bf16x2(r0 * inv, r1 * inv);
  }
}

#endif  // __CUDACC__

}  // namespace kiln
