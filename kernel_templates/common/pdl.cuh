#pragma once
// Programmatic dependent launch (sm_90+). A kernel launched with programmatic stream serialization may
// start while the previous kernel in the stream is still running: it must call pdl_wait() before its
// first read of anything that kernel wrote (the wait returns once the previous grid has completed and
// its memory is visible). A primary kernel calls pdl_launch_dependents() once the dependent may start
// being scheduled (e.g. when its own main loop is done); without the call, the dependent starts when
// the primary exits. Both are no-ops for a kernel launched without the attribute.

namespace kiln {

#ifdef __CUDACC__

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

#endif  // __CUDACC__

}  // namespace kiln
