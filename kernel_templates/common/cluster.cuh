#pragma once
// Thread-block clusters (sm_90+): the CTA's place in its cluster, the cluster-wide barrier, and
// accesses to a peer CTA's shared memory (distributed shared memory). A launch without a cluster
// attribute is a cluster of one CTA. Valid on sm_90a and sm_120a.
#include "common/mma.cuh"
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

__device__ __forceinline__ u32 cluster_size() {
  u32 n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The cluster's index along x in the grid (blockIdx.x / cluster size, without the division).
__device__ __forceinline__ u32 cluster_id_x() {
  u32 r;
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives (exited threads would not), then waits: the
// release/acquire pair makes each CTA's shared-memory writes before it visible to its peers after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// The shared-memory address `addr` of this CTA, as the same variable of CTA `rank` of the cluster.
__device__ __forceinline__ u32 peer_addr(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float ld_peer_f32(u32 addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_peer_f32x4(u32 addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

// Stores into another CTA's shared memory (`addr`, `bar`: shared::cluster addresses) that complete
// their bytes on that CTA's mbarrier `bar`, whose phase must expect them (expect_tx).
__device__ __forceinline__ void st_async_128(u32 addr, U32x4 v, u32 bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void st_async_32(u32 addr, u32 v, u32 bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v), "r"(bar) : "memory");
}

#endif  // __CUDACC__

}  // namespace kiln
