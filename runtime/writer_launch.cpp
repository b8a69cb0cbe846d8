#include "kiln/runtime/writer_launch.h"

#include "kiln/kernel_templates/common/writer_geometry.cuh"
#include "kiln/runtime/launch.h"

namespace kiln {

LaunchConfig writer_row_warps(int rows, int rows_per_warp) {
  const int per_block = kWriterWarpsPerBlock * rows_per_warp;
  LaunchConfig config;
  config.grid[0] = static_cast<unsigned>((rows + per_block - 1) / per_block);
  config.block[0] = kWriterThreads;
  config.pdl = true;
  return config;
}

void launch_writer_append(const KernelHandle& handle, const void* params, int rows, CUstream stream) {
  if (rows <= kWriterAppendScanRows) {
    launch(handle, writer_row_warps(rows, 1), params, stream, kWriterAppendScanEntry);
    return;
  }
  LaunchConfig claim;
  claim.grid[0] = static_cast<unsigned>((rows + kWriterClaimThreads - 1) / kWriterClaimThreads);
  claim.block[0] = kWriterClaimThreads;
  claim.pdl = true;
  launch(handle, claim, params, stream, kWriterAppendClaimEntry);
  launch(handle, writer_row_warps(rows, kWriterRowsPerWarp), params, stream, kWriterAppendWriteEntry);
}

}  // namespace kiln
