#pragma once
// Tensor-memory-accelerator (TMA) copies (sm_90+): a box of a tensor described by a driver tensor map
// into shared memory, completing its bytes on an mbarrier (common/mbarrier.cuh). `map` is the generic
// address of a 64-byte-aligned CUtensorMap in kernel parameter, constant or global memory.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

// The 3-D box at coordinates (c0, c1, c2) into the same shared address of every CTA of the cluster in
// `cta_mask`, each completing on its own mbarrier at the address `bar` (the same offset in each CTA).
// Coordinates past the tensor's extent read as zeros and still count as bytes.
__device__ __forceinline__ void tma_load_3d_multicast(u32 dst, const void* map, int c0, int c1, int c2, u32 bar,
                                                      unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
      : "memory");
}

// The 3-D box at coordinates (c0, c1, c2) into this CTA's shared memory at `dst`, completing on the
// mbarrier at `bar`. Coordinates past the tensor's extent read as zeros and still count as bytes.
__device__ __forceinline__ void tma_load_3d(u32 dst, const void* map, int c0, int c1, int c2, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// `bytes` (a multiple of 16) from global `src` into this CTA's shared memory at `dst`, both 16-byte
// aligned, completing on the mbarrier at `bar`: one instruction for what would be bytes / 16 cp.asyncs.
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src), "r"(bytes),
               "r"(bar)
               : "memory");
}

// Brings the tensor map at `map` into the descriptor cache ahead of the first copy that uses it. The
// map is a kernel parameter, not data an earlier grid writes, so this may precede the grid dependency
// wait.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

#endif  // __CUDACC__

}  // namespace kiln
