#pragma once
// A launch takes its device from its stream: the stream's context is made current on the calling
// thread for the scope (so handle lookups and launches use that device, whatever context the
// thread had), and the tensors are checked to live on that device.
#include <cuda.h>

#include <optional>
#include <string_view>

#include "kiln/runtime/tensor_view.h"

namespace kiln {

// Whether `stream` is capturing a CUDA graph (driver work that a capture would not survive, a module
// load or an allocation, must be refused then). Throws Error(kDriver) when the query fails.
bool stream_capturing(CUstream stream);

class StreamDevice {
 public:
  // Throws Error(kDriver) without a driver, or when a default stream (0, CU_STREAM_LEGACY,
  // CU_STREAM_PER_THREAD) meets a thread with no current context: such a stream names no device.
  explicit StreamDevice(CUstream stream);
  ~StreamDevice();
  StreamDevice(const StreamDevice&) = delete;
  StreamDevice& operator=(const StreamDevice&) = delete;

  int device() const { return device_; }

  // Throws Error(kInvalidArgument) naming `arg` when the view names another device (views built by
  // hand, TensorView::kAnyDevice, pass). Formats only when it throws.
  void check(const TensorView& view, std::string_view arg) const;
  void check(const std::optional<TensorView>& view, std::string_view arg) const {
    if (view) check(*view, arg);
  }

 private:
  int device_ = 0;
  bool pushed_ = false;
};

}  // namespace kiln
