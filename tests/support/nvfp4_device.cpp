#include "tests/support/nvfp4_device.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "tests/support/device_buffer.h"

namespace kiln::testing {

const Nvfp4Reciprocals& nvfp4_device_reciprocals() {
  static const Nvfp4Reciprocals table = [] {
    const Driver& d = Driver::get();
    const char* source = R"(
extern "C" __global__ void rcp_probe(const float* in, float* out) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(in[threadIdx.x]));
  out[threadIdx.x] = r;
})";
    const CompileResult r = Compiler().compile(KernelSource{source, {"rcp_probe"}}, KernelService::global().device_arch(0), "test:rcp_probe");
    CUmodule module = nullptr;
    CUfunction fn = nullptr;
    d.check(d.cuModuleLoadData(&module, r.cubin.data()), "cuModuleLoadData");
    d.check(d.cuModuleGetFunction(&fn, module, r.lowered_names.at(0).c_str()), "cuModuleGetFunction");
    std::vector<float> scales(128, 1.0f);
    for (int c = 1; c < 127; ++c) scales[c] = e4m3_to_float(std::uint8_t(c));
    DeviceBuffer in(128 * 4), out(128 * 4);
    in.upload(scales);
    CUdeviceptr pin = reinterpret_cast<CUdeviceptr>(in.get()), pout = reinterpret_cast<CUdeviceptr>(out.get());
    void* args[] = {&pin, &pout};
    d.check(d.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr), "cuLaunchKernel(rcp_probe)");
    const auto got = out.download<float>(128);
    d.cuModuleUnload(module);
    Nvfp4Reciprocals t{};
    int differ = 0;
    for (int c = 1; c < 127; ++c) {
      t[c] = got[c];
      differ += got[c] != nvfp4_exact_reciprocals()[c];
    }
    // Informational: how far the hardware reciprocal is from the spec's fp32(1/scale).
    std::printf("rcp.approx.ftz.f32 differs from fp32(1/scale) for %d of 126 e4m3 scales\n", differ);
    return t;
  }();
  return table;
}

}  // namespace kiln::testing
