#pragma once
// NVFP4 cache writer: packs bf16 latent rows into the 384-byte format (pack), or scatters them into an
// existing cache through a slot mapping (append).
#include "common/numeric.cuh"
#include "common/nvfp4_format.cuh"
#include "nvfp4_writer/params.cuh"

namespace kiln {

#ifdef __CUDACC__

template <int kPageSize, bool kAppend>
__global__ void __launch_bounds__(kNvfp4WriterThreads) nvfp4_writer_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kNvfp4WriterRowsPerBlock + threadIdx.x / 32;
  if (row >= p.num_rows) return;

  long long slot = row;
  if (kAppend) {
    slot = p.slot_mapping[row];
    if (slot < 0 || slot >= p.num_slots) return;
    // Duplicate slots: the lowest input row wins, so a row yields if any earlier row targets its slot.
    // Quadratic in the batch, but append batches are small and this needs no workspace or ordering.
    for (int base = 0; base < row; base += 32) {
      const int j = base + lane;
      const bool earlier = j < row && p.slot_mapping[j] == slot;
      if (__any_sync(0xffffffffu, earlier)) return;
    }
  }

  const long long page = slot / kPageSize;
  const int r = static_cast<int>(slot % kPageSize);
  u8* page_base = static_cast<u8*>(p.cache) + page * p.page_stride;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.src) + row * p.src_row_stride);
  u8* scale_byte = page_base + kPageSize * kNvfp4DataBytes + r * kNvfp4ScaleBytes + lane;

  // Lane g reads values 16g..16g+15 (two 16-byte loads): lanes 0..27 quantize, 28..31 copy RoPE.
  const uint4 a = src[2 * lane];
  const uint4 b = src[2 * lane + 1];
  if (lane >= kNvfp4Groups) {
    uint4* rope = reinterpret_cast<uint4*>(page_base + r * kNvfp4DataBytes + kNvfp4CodeBytes + (lane - kNvfp4Groups) * 32);
    rope[0] = a;
    rope[1] = b;
    *scale_byte = 0;  // bytes 28..31 of the scale record are padding
    return;
  }

  const u32 words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float x[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = bf16x2_lo(words[i]);
    x[2 * i + 1] = bf16x2_hi(words[i]);
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));  // fmaxf drops NaN
  const u8 scale = float_to_e4m3_satfinite(amax / 6.0f);
  const float s = e4m3_to_float(scale);
  const float inv = s == 0.0f ? 0.0f : 1.0f / s;
  u32 lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    lo |= float_to_e2m1(__fmul_rn(x[i], inv)) << (4 * i);
    hi |= float_to_e2m1(__fmul_rn(x[8 + i], inv)) << (4 * i);
  }
  *reinterpret_cast<uint2*>(page_base + r * kNvfp4DataBytes + lane * 8) = make_uint2(lo, hi);
  *scale_byte = scale;
}

#endif  // __CUDACC__

}  // namespace kiln
