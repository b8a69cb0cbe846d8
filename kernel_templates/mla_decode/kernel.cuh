#pragma once
// Paged MLA decode (576-wide Q/K, V = first 512 columns of the same cache row). mla_decode_kernel:
// grid (parts, row tiles); each CTA walks its part's pieces (schedule.cuh) with one of the kernels
// mla_variant() picks for the target: on sm_90a the heads-on-M wgmma kernel (kernel_seesaw.cuh for
// bf16 pages, kernel_wgmma_fp8.cuh for e4m3) or the KV-on-M wgmma kernel (kernel_kv.cuh); otherwise
// the mma.sync kernel (kernel_mma.cuh). The combine of split requests is a module of its own
// (combine.cuh), launched with programmatic dependent launch only when a request can split.
#include "common/mbarrier.cuh"
#include "common/pdl.cuh"
#include "common/softmax.cuh"
#include "mla_decode/kernel_kv.cuh"
#include "mla_decode/kernel_mma.cuh"
#include "mla_decode/kernel_seesaw.cuh"
#include "mla_decode/kernel_wgmma_fp8.cuh"
#include "mla_decode/params.cuh"
#include "mla_decode/schedule.cuh"
#include "mla_decode/wgmma_common.cuh"

namespace kiln {

#ifdef __CUDACC__

// The variant is a function of the policy and the target, so the same key compiles to the kernel
// each arch can run; the host planner mirrors it from the device's arch.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool kMlaSm90a = true;
#else
constexpr bool kMlaSm90a = false;
#endif

template <int kRowClass, bool kFp8, int kKernel, int kPrecision>
constexpr MlaVariant kMlaCompiledVariant = mla_variant(kKernel, kRowClass, 1, kFp8, mla_split_p(kFp8, kPrecision), kMlaSm90a);

// kRowClass: mla_row_class(kernel, H, SQ, fp8); H, SQ and the mask come in the parameters.
template <int kRowClass, int kPageSize, bool kPacked, bool kFp8, int kKernel, int kPrecision>
__global__ void __launch_bounds__(mla_variant_threads(kMlaCompiledVariant<kRowClass, kFp8, kKernel, kPrecision>, kFp8), 1)
    mla_decode_kernel(const __grid_constant__ MlaDecodeParams p) {
  using namespace mla_detail;
  constexpr MlaVariant kV = kMlaCompiledVariant<kRowClass, kFp8, kKernel, kPrecision>;
  constexpr int kThreads = mla_variant_threads(kV, kFp8);
  constexpr int kRows = mla_variant_rows(kV);
  static_assert(kRowClass == mla_row_class(kKernel, kRowClass, 1, kFp8), "kRowClass must be an mla_row_class value");
  static_assert(kPrecision == kMlaPrecisionExact || (kPrecision == kMlaPrecisionBf16 && !kFp8),
                "kPrecision must be kMlaPrecisionExact, or kMlaPrecisionBf16 with bf16 pages");
  constexpr bool kSplitP = mla_split_p(kFp8, kPrecision);

  // Launched as a dependent of the kernel before it in the stream (common/pdl.cuh): the grid is
  // scheduled during that kernel's tail, and nothing is read or written in global memory before
  // the wait. The combine may be scheduled as soon as every CTA of this grid has started; it waits
  // for this grid's completion before it reads anything.
  pdl_launch_dependents();
  // The seesaw kernel waits after its set-up instead (barriers, the cluster pair's handshake, the
  // tensor-map prefetch): none of it reads what an earlier kernel writes.
  constexpr bool kSeesaw = kV.kv_rows == 0 && kV.wgmma && !kFp8;
  if constexpr (!kSeesaw) pdl_wait();
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
    mla_for_each_piece<kThreads, kMlaKvTileTokens, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
      record(pc);
      if (row0 >= pc.r.q_len * p.heads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
      mla_kv_piece<kPageSize, kV.kv_rows, kV.kv_warpgroups, kSplitP>(p, base, pc, row0, pc.whole ? -1 : pc.b + part, st);
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
      mla_for_each_piece<kThreads, kMlaWgTileTokens, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
        if (row0 >= pc.r.q_len * p.heads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
        mla_wgmma_fp8_producer<kPageSize>(p, base, pc, row0, st);
      });
    } else {
      setmaxnreg_inc<kMlaWgFp8ConsumerRegs>();
      mla_for_each_piece<kThreads, kMlaWgTileTokens, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
        record(pc);
        if (row0 >= pc.r.q_len * p.heads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
        mla_wgmma_fp8_consumer(p, base, pc, row0, pc.whole ? -1 : pc.b + part, st);
      });
    }
  } else if constexpr (kSeesaw) {
    static_assert(kV.wgmma && kMlaSm90a, "the wgmma MLA kernel needs sm_90a");
    const u32 raw = smem_addr(smem);
    const u32 base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
    long long* scratch = reinterpret_cast<long long*>(smem + (base - raw) + kMlaWgSchedOffset);
    constexpr int kTmaCtas = mla_kv_tma_ctas(kV, kFp8, kRowClass, 1, kPacked, kPageSize);
    if (threadIdx.x == 0) {
      mla_seesaw_init_barriers<kTmaCtas>(base);
      if constexpr (kTmaCtas > 0) tma_prefetch_map(&p.kv_map);
    }
    // In a cluster pair the peer CTA multicasts into this CTA's stages and arrives on its barriers:
    // both CTAs' barriers exist before either starts.
    if constexpr (kTmaCtas == 2) cluster_sync();
    else __syncthreads();
    pdl_wait();
    MlaWgState st{0u, 0u};
    // Pieces of whole tile pairs: the two warpgroups take a pair's tiles. (A cluster pair sees the
    // same pieces: fixed query lengths give both row tiles rows in every request.)
    mla_for_each_piece<kThreads, 2 * kMlaWgTileTokens, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
      record(pc);
      if (row0 >= pc.r.q_len * p.heads || (!pc.whole && p.o_partial == nullptr)) return;  // as below
      mla_seesaw_piece<kPageSize, kTmaCtas, kSplitP>(p, base, pc, row0, pc.whole ? -1 : pc.b + part, st);
    });
    // The peer's last releases arrive on this CTA's barriers: it stays until both are done.
    if constexpr (kTmaCtas == 2) cluster_sync();
  } else {
    constexpr MlaSmemLayout kLayout = mla_smem_layout(kV.tile, kFp8);
    long long* scratch = reinterpret_cast<long long*>(smem + kLayout.sched_offset);
    mla_for_each_piece<kThreads, kV.tile.tile_tokens, kPacked>(p, part, scratch, [&](const MlaPiece& pc) {
      record(pc);
      if (row0 >= pc.r.q_len * p.heads || (!pc.whole && p.o_partial == nullptr)) return;  // as above
      __syncthreads();                          // the previous piece is done with shared memory
      mla_mma_piece<kPageSize, kFp8, kV.tile.row_groups, kV.tile.col_groups, kV.tile.tile_tokens, kV.tile.stages, kSplitP>(
          p, smem, pc, row0, pc.whole ? -1 : pc.b + part);
    });
  }
}

#endif  // __CUDACC__

}  // namespace kiln
