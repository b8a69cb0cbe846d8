#pragma once
// NVFP4 cache writer, pack: bf16 latent rows into whole pages of the 384-byte format, row i to slot i.
#include "nvfp4_writer/row.cuh"

namespace kiln {

#ifdef __CUDACC__

// Row i -> slot i. Each warp loads its rows before encoding any, so their reads overlap.
__global__ void __launch_bounds__(kWriterThreads) nvfp4_pack_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWriterWarpsPerBlock + threadIdx.x / 32) * kWriterRowsPerWarp;
  if (lane < kWriterRowsPerWarp) nvfp4_prefetch_row(p, row0 + lane);
  pdl_wait();
  pdl_launch_dependents();
  Nvfp4WriterRow r[kWriterRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = nvfp4_writer_load(p, row0 + i, lane);
  }
#pragma unroll
  for (int i = 0; i < kWriterRowsPerWarp; ++i) {
    if (row0 + i >= p.num_rows) return;
    nvfp4_writer_encode(r[i], lane);
    nvfp4_writer_store(p, row0 + i, lane, r[i]);
  }
}

#endif  // __CUDACC__

}  // namespace kiln
