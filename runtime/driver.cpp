#include "kiln/runtime/driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln {

namespace {
// Ask for the entry points as of CUDA 12.0, so that a 12.x driver serves this build too.
constexpr int kDriverApiVersion = 12000;
}  // namespace

Driver::Driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    reason_ = fmt::format("libcuda.so.1 could not be loaded ({})", why ? why : "unknown reason");
    return;
  }
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    reason_ = "libcuda.so.1 has no cuGetProcAddress_v2; a driver for CUDA 12.0 or newer is required";
    return;
  }
  const auto load = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult status{};
    if (get_proc(name, slot, kDriverApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
        *slot == nullptr) {
      if (reason_.empty()) reason_ = fmt::format("the CUDA driver lacks {}", name);
    }
  };
#define KILN_DRIVER_LOAD(name) load(#name, reinterpret_cast<void**>(&name));
  KILN_DRIVER_FUNCTIONS(KILN_DRIVER_LOAD)
#undef KILN_DRIVER_LOAD
  if (!reason_.empty()) return;
  const CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS) {
    reason_ = fmt::format("cuInit failed: {}", describe(init));
    return;
  }
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    reason_ = "the CUDA driver reports no GPU";
    return;
  }
  available_ = true;
}

const Driver& Driver::get() {
  static const Driver kDriver;
  return kDriver;
}

void Driver::require(const std::string& what) const {
  if (!available_) {
    throw Error(ErrorCode::kDriver,
                fmt::format("cannot {}: {}. Loading and launching kernels needs an NVIDIA GPU and driver; "
                            "compiling and prebuilding (kiln prebuild) work without one",
                            what, reason_));
  }
}

std::string Driver::describe(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &text);
  return fmt::format("{} ({})", name ? name : "CUDA_ERROR_?", text ? text : std::to_string(static_cast<int>(r)));
}

void Driver::check(CUresult r, const char* call) const {
  if (r != CUDA_SUCCESS) {
    throw Error(ErrorCode::kDriver, fmt::format("{} failed: {}", call, describe(r)));
  }
}

ScopedDeviceContext::ScopedDeviceContext(int device) {
  const Driver& d = Driver::get();
  d.require(fmt::format("use device {}", device));
  CUdevice dev = 0;
  d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  CUcontext ctx = nullptr;
  d.check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  d.check(d.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  d.check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

ScopedDeviceContext::~ScopedDeviceContext() {
  // The primary context stays retained: loaded modules live in it for the life of the process.
  Driver::get().cuCtxSetCurrent(previous_);
}

}  // namespace kiln
