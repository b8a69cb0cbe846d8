#include "kiln/runtime/stream_device.h"

#include <fmt/format.h>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"

namespace kiln {

bool stream_capturing(CUstream stream) {
  const Driver& d = Driver::get();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  d.check(d.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  return capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

StreamDevice::StreamDevice(CUstream stream) {
  const Driver& d = Driver::get();
  d.require("launch a kernel");
  CUcontext ctx = nullptr;
  const CUresult r = d.cuStreamGetCtx(stream, &ctx);
  if (r == CUDA_ERROR_INVALID_CONTEXT || (r == CUDA_SUCCESS && ctx == nullptr)) {
    throw Error(ErrorCode::kDriver,
                "stream: a default stream (0, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD) names the calling thread's "
                "current CUDA context, and this thread has none; pass a stream created on the target device, or make "
                "that device's context current first");
  }
  d.check(r, "cuStreamGetCtx");
  CUcontext current = nullptr;
  d.check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (ctx != current) {
    d.check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
    pushed_ = true;
  }
  CUdevice dev = 0;
  const CUresult got = d.cuCtxGetDevice(&dev);
  if (got != CUDA_SUCCESS) {
    if (pushed_) d.cuCtxPopCurrent(&ctx);
    d.check(got, "cuCtxGetDevice");
  }
  device_ = static_cast<int>(dev);
}

StreamDevice::~StreamDevice() {
  if (pushed_) {
    CUcontext popped = nullptr;
    Driver::get().cuCtxPopCurrent(&popped);
  }
}

void StreamDevice::check(const TensorView& view, std::string_view arg) const {
  if (view.device == TensorView::kAnyDevice || view.device == device_) return;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: the tensor is on cuda:{} but the stream belongs to cuda:{}; launch on a stream of the "
                          "tensors' device",
                          arg, view.device, device_));
}

}  // namespace kiln
