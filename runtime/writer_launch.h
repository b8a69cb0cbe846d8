#pragma once
// The launches both cache writers share (nvfp4_writer, dsv41_writer): their kernels have one
// geometry (kernel_templates/common/writer_geometry.cuh) and the same append scheme.
#include <cuda.h>

#include "kiln/runtime/kernel_handle.h"
#include "kiln/runtime/launch_config.h"

namespace kiln {

// Warps of kWriterThreads-thread blocks, `rows_per_warp` rows each, as programmatic dependents (the
// kernels wait for the previous kernel before reading anything).
LaunchConfig writer_row_warps(int rows, int rows_per_warp);

// An append of `rows` rows (`params` the writer's parameter block): up to kWriterAppendScanRows, one
// launch (the scan kernel); more, the claim kernel, then the write kernel, which reads and encodes
// its rows while the claims run (programmatic dependent launch).
void launch_writer_append(const KernelHandle& handle, const void* params, int rows, CUstream stream);

}  // namespace kiln
