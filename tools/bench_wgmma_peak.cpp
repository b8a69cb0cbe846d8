#include "tools/bench_wgmma_peak.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"

namespace kiln::tools {

namespace {

constexpr int kThreads = 256;     // two warpgroups per block, one block per SM
constexpr int kPerGroup = 16;     // wgmmas per commit group (the kernel's inner loop)
constexpr int kIters = 2048;      // commit groups per warpgroup

// Each warpgroup chains m64n256k16 (A in registers, B from an 8 KiB shared tile of non-zero bf16)
// into one accumulator, two commit groups in flight. No global traffic inside the loop.
constexpr const char* kSource = R"(
#include "sparse_nvfp4/sm90_ops.cuh"
namespace kiln_bench {
using namespace kiln;
__global__ void __launch_bounds__(256, 1) wgmma_peak(float* out, int iters) {
  __shared__ __align__(128) u32 b_tile[2048];  // 256 rows x 16 bf16, no-swizzle core matrices
  for (int i = threadIdx.x; i < 2048; i += 256) {
    const u32 h = (i * 2654435761u) >> 16;
    b_tile[i] = 0x3c003c00u ^ (h & 0x007f007fu);  // bf16 pairs near 2^-7, never zero
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const u32 a_bits = 0x3c003c00u ^ ((threadIdx.x * 40503u) & 0x003f003fu);
  const u32 a[4] = {a_bits, a_bits ^ 1u, a_bits ^ 2u, a_bits ^ 3u};
  // B: rows n at 16 B steps (8-row groups 128 B apart), the two 8-column halves 4 KiB apart.
  const u64 desc = sm90::smem_desc(static_cast<u32>(__cvta_generic_to_shared(b_tile)), 4096, 128);
  float d[128];
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  sm90::pin(d);
  sm90::wgmma_fence();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < 16; ++k) sm90::wgmma_m64n256k16_rs_bf16_kmajor(d, a, desc);
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();
  }
  sm90::wgmma_wait<0>();
  sm90::pin(d);
  float acc = 0.0f;
  for (int i = 0; i < 128; ++i) acc += d[i];
  out[blockIdx.x * 256 + threadIdx.x] = acc;
}
}  // namespace kiln_bench
)";

}  // namespace

BenchWgmmaPeak::BenchWgmmaPeak(int sm_count) : blocks_(sm_count) {
  const Driver& d = Driver::get();
  const CompileResult r = Compiler().compile(KernelSource{kSource, {"kiln_bench::wgmma_peak"}}, "sm_90a", "bench:wgmma_peak");
  bench_check(d.cuModuleLoadData(&module_, r.cubin.data()), "cuModuleLoadData", "wgmma peak kernel");
  bench_check(d.cuModuleGetFunction(&function_, module_, r.lowered_names.at(0).c_str()), "cuModuleGetFunction", "wgmma peak kernel");
  out_ = std::make_unique<BenchDeviceMemory>(static_cast<std::size_t>(blocks_) * kThreads * 4, "wgmma peak output");
}

BenchWgmmaPeak::~BenchWgmmaPeak() {
  if (module_) Driver::get().cuModuleUnload(module_);
}

double BenchWgmmaPeak::measure(CUstream stream) const {
  const Driver& d = Driver::get();
  CUdeviceptr out = out_->ptr();
  int iters = kIters;
  void* args[] = {&out, &iters};
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    const double t = bench_time_ms(stream, "wgmma peak", [&] {
      bench_check(d.cuLaunchKernel(function_, blocks_, 1, 1, kThreads, 1, 1, 0, stream, args, nullptr), "cuLaunchKernel",
                  "wgmma peak kernel");
    });
    if (i > 0) ms.push_back(t);
  }
  float probe[4] = {};
  bench_check(d.cuMemcpyDtoH(probe, out, sizeof probe), "cuMemcpyDtoH", "wgmma peak output");
  for (float f : probe) {
    if (!std::isfinite(f) || f == 0.f) throw Error(ErrorCode::kInternal, fmt::format("wgmma peak kernel produced {} (expected finite, non-zero)", f));
  }
  const double flop = 2.0 * 64 * 256 * 16 * kPerGroup * static_cast<double>(iters) * blocks_ * (kThreads / 128);
  return flop / (bench_median(ms) * 1e-3) * 1e-12;
}

std::string BenchWgmmaPeak::method() {
  return fmt::format("NVRTC-compiled sm_90a kernel: per SM two warpgroups each chaining wgmma.m64n256k16 bf16->fp32 (A in registers, "
                     "B from shared memory), {} per commit group, two groups in flight, {} groups; median of 7 after a warm-up",
                     kPerGroup, kIters);
}

}  // namespace kiln::tools
