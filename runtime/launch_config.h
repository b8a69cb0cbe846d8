#pragma once
// How one kernel is launched: geometry, dynamic shared memory and launch attributes. Planners fill
// it (no CUDA types here, so they stay pure); runtime/launch.h launches it.

namespace kiln {

struct LaunchConfig {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem_bytes = 0;  // dynamic shared memory per block
  // Programmatic dependent launch: the kernel may start while the previous kernel on the stream is
  // still running, and must wait (griddepcontrol.wait) before reading that kernel's output.
  bool pdl = false;
  unsigned cluster[3] = {0, 0, 0};  // thread-block cluster dims; all 0 = no cluster
};

}  // namespace kiln
