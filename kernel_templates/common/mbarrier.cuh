#pragma once
// Shared-memory mbarriers (sm_90+) and the fences and barriers that go with them: a producer fills a
// buffer and arrives on its "full" barrier (cp.async completions can arrive for it), consumers wait
// on the phase parity, then arrive on the buffer's "empty" barrier. Addresses are 32-bit shared
// addresses (smem_addr()). Valid on sm_90a and sm_120a.
#include "common/numeric.cuh"

namespace kiln {

#ifdef __CUDACC__

// One thread initialises; then fence + a CTA barrier before any other thread uses the barrier.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialisation visible to the async proxy too (bulk copies completing on the barrier).
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and adds `bytes` to the transaction count this phase waits for (bulk / TMA copies).
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// True once the phase with parity `parity` has completed (non-blocking probe, may time out early).
__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Arrives on a barrier of another CTA of the cluster (`bar`: a shared::cluster address, e.g. from
// mapa). CTA-scope release, as for a local arrive: a consumer signals that its reads of a buffer
// have completed (wgmma wait), which needs no fence; a release at cluster scope would cost a
// GPU-wide memory barrier per arrive.
__device__ __forceinline__ void mbar_arrive_remote(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// The barrier counts one arrival when every cp.async this thread issued so far has landed. The
// arrival is one of the `count` the barrier was initialised with (.noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Orders this thread's generic-proxy shared-memory accesses (st.shared, cp.async data it has
// acquired) with later async-proxy accesses (wgmma operands, bulk copies), and vice versa.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Barrier over `threads` threads (a multiple of 32) of the CTA on hardware barrier `id` (1..15; 0 is
// __syncthreads). Lets two warpgroups meet without stopping the rest of the CTA.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on hardware barrier `id` without waiting: the `threads` of a named_barrier_sync on the same
// id count this warp's arrival, so a producer can signal consumers and go on.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif  // __CUDACC__

}  // namespace kiln
