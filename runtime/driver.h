#pragma once
// The CUDA driver, loaded with dlopen("libcuda.so.1") so that kiln builds, prebuilds and tests on
// machines without a GPU. Only cuda.h's types are used at build time; nothing links against libcuda.
#include <cuda.h>

#include <string>

namespace kiln {

#define KILN_DRIVER_FUNCTIONS(X)                                                                      \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)                \
  X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice)                \
  X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                    \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)                   \
  X(cuStreamIsCapturing) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                  \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch)       \
  X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH)  \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemcpyHtoDAsync) X(cuEventCreate)         \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuStreamGetCtx)     \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuOccupancyMaxActiveClusters) X(cuTensorMapEncodeTiled)

class Driver {
 public:
  // The process-wide driver. Never throws: check available() / reason().
  static const Driver& get();

  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }  // why it is unavailable

  // Throws Error(kDriver) saying how to get a driver, naming `what` (e.g. "warm key X").
  void require(const std::string& what) const;

  // Throws Error(kDriver) with the driver's error name and string when `r` is not CUDA_SUCCESS.
  void check(CUresult r, const char* call) const;
  std::string describe(CUresult r) const;

#define KILN_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_DRIVER_FUNCTIONS(KILN_DRIVER_MEMBER)
#undef KILN_DRIVER_MEMBER

 private:
  Driver();
  bool available_ = false;
  std::string reason_;
};

// RAII: makes the device's primary context current on this thread for the scope.
class ScopedDeviceContext {
 public:
  explicit ScopedDeviceContext(int device);
  ~ScopedDeviceContext();
  ScopedDeviceContext(const ScopedDeviceContext&) = delete;
  ScopedDeviceContext& operator=(const ScopedDeviceContext&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

}  // namespace kiln
