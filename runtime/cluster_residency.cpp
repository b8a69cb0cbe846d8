#include "kiln/runtime/cluster_residency.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"

namespace kiln {

namespace {

// An empty kernel: the query reads only its launch shape (threads, shared memory, cluster size), so
// it stands for any kernel of that shape. PTX for sm_90, which the driver compiles for the device.
constexpr char kProbePtx[] = R"(.version 8.0
.target sm_90
.address_size 64
.visible .entry kiln_cluster_probe()
{
  ret;
}
)";

ClusterResidency read_residency(int device, unsigned threads, unsigned smem_bytes) {
  const Driver& d = Driver::get();
  d.require(fmt::format("read cluster residency of device {}", device));
  ScopedDeviceContext ctx(device);
  CUmodule module = nullptr;
  d.check(d.cuModuleLoadData(&module, kProbePtx), "cuModuleLoadData (cluster probe)");
  const std::unique_ptr<CUmod_st, void (*)(CUmodule)> unload(module, [](CUmodule m) { Driver::get().cuModuleUnload(m); });
  CUfunction probe = nullptr;
  d.check(d.cuModuleGetFunction(&probe, module, "kiln_cluster_probe"), "cuModuleGetFunction (cluster probe)");
  d.check(d.cuFuncSetAttribute(probe, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem_bytes)),
          "cuFuncSetAttribute (cluster probe)");
  ClusterResidency r;
  for (int n = 1; n <= kMaxResidentClusterSize; ++n) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = static_cast<unsigned>(n);
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    CUlaunchConfig config{};
    config.gridDimX = static_cast<unsigned>(n);
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = threads;
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = smem_bytes;
    config.attrs = &attr;
    config.numAttrs = 1;
    d.check(d.cuOccupancyMaxActiveClusters(&r.clusters[n], probe, &config),
            fmt::format("cuOccupancyMaxActiveClusters (clusters of {}; device {} needs compute capability 9.0 or newer)", n, device).c_str());
  }
  return r;
}

}  // namespace

const ClusterResidency& device_cluster_residency(int device, unsigned threads, unsigned smem_bytes) {
  static std::mutex mutex;
  // Node-based: references stay valid while other devices and shapes are added.
  static std::map<std::tuple<int, unsigned, unsigned>, ClusterResidency> cache;
  const std::tuple key{device, threads, smem_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  return cache.emplace(key, read_residency(device, threads, smem_bytes)).first->second;
}

}  // namespace kiln
