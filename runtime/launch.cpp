#include "kiln/runtime/launch.h"

#include <fmt/format.h>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"

namespace kiln {

CUlaunchConfig driver_launch_config(const LaunchConfig& config, CUstream stream) {
  CUlaunchConfig c{};
  c.gridDimX = config.grid[0];
  c.gridDimY = config.grid[1];
  c.gridDimZ = config.grid[2];
  c.blockDimX = config.block[0];
  c.blockDimY = config.block[1];
  c.blockDimZ = config.block[2];
  c.sharedMemBytes = config.smem_bytes;
  c.hStream = stream;
  return c;
}

void launch(const KernelHandle& handle, const LaunchConfig& config, const void* params, CUstream stream,
            std::size_t entry) {
  const KernelFunction& f = handle.entry(entry);
  if (static_cast<long long>(config.smem_bytes) > f.max_dynamic_smem_bytes) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{} needs {} bytes of dynamic shared memory per block; device {} allows {}. This kernel "
                            "configuration does not fit this GPU: choose a policy with a smaller tile",
                            f.lowered_name, config.smem_bytes, handle.device, f.max_dynamic_smem_bytes),
                {.key = handle.key});
  }
  CUlaunchAttribute attributes[2];
  unsigned count = 0;
  if (config.pdl) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[count].value = {};
    attributes[count].value.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (config.cluster[0] != 0 || config.cluster[1] != 0 || config.cluster[2] != 0) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attributes[count].value = {};
    attributes[count].value.clusterDim.x = config.cluster[0] ? config.cluster[0] : 1;
    attributes[count].value.clusterDim.y = config.cluster[1] ? config.cluster[1] : 1;
    attributes[count].value.clusterDim.z = config.cluster[2] ? config.cluster[2] : 1;
    ++count;
  }
  CUlaunchConfig c = driver_launch_config(config, stream);
  c.attrs = count > 0 ? attributes : nullptr;
  c.numAttrs = count;
  // The driver copies the parameter block at enqueue time, so a pointer to the caller's copy is enough.
  void* args[] = {const_cast<void*>(params)};
  const Driver& d = Driver::get();
  const CUresult r = d.cuLaunchKernelEx(&c, f.function, args, nullptr);
  if (r != CUDA_SUCCESS) {
    throw Error(ErrorCode::kDriver, fmt::format("cuLaunchKernelEx({}) failed: {}", f.lowered_name, d.describe(r)),
                {.key = handle.key});
  }
}

}  // namespace kiln
