#pragma once
// NVFP4 cache writer, what its kernels share: a row's load, its encode into the 384-byte format and
// its store into a slot of a paged cache (pack.cuh packs whole pages, append.cuh scatters rows
// through a slot mapping). The page size is a run-time value (Nvfp4WriterParams::page_size): it only
// enters a slot's address, so one module per kernel serves every page size.
#include "common/numeric.cuh"
#include "common/nvfp4_encode.cuh"
#include "common/nvfp4_format.cuh"
#include "common/pdl.cuh"
#include "common/writer_geometry.cuh"
#include "nvfp4_writer/params.cuh"

namespace kiln {

#ifdef __CUDACC__

// Every writer kernel is launched as a programmatic dependent of the previous kernel on the stream
// (common/pdl.cuh): its blocks may start before that kernel finishes, and read nothing until it has
// (pdl_wait). The trigger lets the next dependent start early in turn.

// Before the wait a kernel may only warm L2 (coherent for every SM) with the lines it will read:
// nothing reaches registers or L1 until the previous kernel's writes are visible. In a chain of
// writer calls this overlaps the next call's source reads with the current call's tail.
__device__ __forceinline__ void nvfp4_prefetch_row(const Nvfp4WriterParams& p, int row) {
  if (row >= kWriterPrefetchRows || row >= p.num_rows) return;
  const u16* src = static_cast<const u16*>(p.src) + row * p.src_row_stride;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 1024;" ::"l"(src) : "memory");
}

struct Nvfp4WriterRow {
  uint4 a, b;             // this lane's 16 source values (lanes 28..31: RoPE, copied as they are)
  u32 lo = 0, hi = 0;     // lanes 0..27: the group's E2M1 codes
  u32 scale = 0;          // lanes 0..27: the group's E4M3 scale
};

__device__ __forceinline__ Nvfp4WriterRow nvfp4_writer_load(const Nvfp4WriterParams& p, int row, int lane) {
  Nvfp4WriterRow r;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.src) + row * p.src_row_stride);
  r.a = src[2 * lane];
  r.b = src[2 * lane + 1];
  return r;
}

__device__ __forceinline__ void nvfp4_writer_encode(Nvfp4WriterRow& r, int lane) {
  if (lane < kNvfp4Groups) r.scale = nvfp4_encode_group16(r.a, r.b, r.lo, r.hi);
}

// Slots reaching here are in [0, num_slots) and int32 (pack: the launcher caps the rows at 2^31 - 1).
__device__ __forceinline__ u8* nvfp4_page(const Nvfp4WriterParams& p, int slot) {
  return static_cast<u8*>(p.cache) + static_cast<long long>(static_cast<unsigned>(slot) / static_cast<unsigned>(p.page_size)) * p.page_stride;
}

__device__ __forceinline__ unsigned nvfp4_page_row(const Nvfp4WriterParams& p, int slot) {
  return static_cast<unsigned>(slot) % static_cast<unsigned>(p.page_size);
}

__device__ __forceinline__ u8* nvfp4_scale_record(const Nvfp4WriterParams& p, int slot) {
  return nvfp4_page(p, slot) + p.page_size * kNvfp4DataBytes + nvfp4_page_row(p, slot) * kNvfp4ScaleBytes;
}

__device__ __forceinline__ void nvfp4_writer_store(const Nvfp4WriterParams& p, int slot, int lane, const Nvfp4WriterRow& r) {
  u8* data = nvfp4_page(p, slot) + nvfp4_page_row(p, slot) * kNvfp4DataBytes;
  u8* scales = nvfp4_scale_record(p, slot);
  if (lane < kNvfp4Groups) {
    *reinterpret_cast<uint2*>(data + lane * 8) = make_uint2(r.lo, r.hi);
    scales[lane] = static_cast<u8>(r.scale);
  } else {
    uint4* rope = reinterpret_cast<uint4*>(data + kNvfp4CodeBytes + (lane - kNvfp4Groups) * 32);
    rope[0] = r.a;
    rope[1] = r.b;
    // The zero padding in one 4-byte store: append's owner word never shows a half-cleared value.
    if (lane == kNvfp4Groups) *reinterpret_cast<u32*>(scales + kNvfp4Groups) = 0u;
  }
}

#endif  // __CUDACC__

}  // namespace kiln
