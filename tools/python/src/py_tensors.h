#pragma once
// Python tensor arguments -> kiln::TensorView, on the call path of every launcher binding.
//
// torch.Tensor (exact type) is read through torch's DLPack C exchange table when torch publishes one
// (`__dlpack_c_exchange_api__`, DLPack >= 1.2: one C call, no capsule, and the current stream without
// Python); otherwise, and for nn.Parameter, through its attributes (dtype, get_device(), shape,
// stride(), data_ptr()): a few C-API calls, no DLPack capsule. Anything else that speaks
// DLPack (__dlpack__ / __dlpack_device__, or a "dltensor" capsule) goes through
// TensorView::from_dlpack, exported on the stream the launch will use. Other torch.Tensor subclasses
// (FakeTensor, functional or other dispatch wrappers) raise NeedsDispatch, so the Python layer
// routes the call through torch.ops.kiln instead. Nothing here allocates on the success path.
#include <Python.h>
#include <cuda.h>

#include <array>
#include <exception>
#include <optional>

#include "kiln/runtime/tensor_view.h"

namespace kiln::python {

// Raised (as kiln._native.NeedsDispatch) when an argument must go through torch's dispatcher.
struct NeedsDispatch : std::exception {
  const char* what() const noexcept override { return "a tensor argument needs torch's dispatcher"; }
};

// Called once at import when torch is present: caches torch.Tensor, nn.Parameter, the dtypes and
// torch._C._cuda_getCurrentRawStream (all references are kept for the life of the process).
void init_torch(PyObject* torch_module);
bool have_torch();
// The dtype named by a torch.dtype object or by a string ("bfloat16"); throws kiln::Error
// (kInvalidArgument) naming `arg` for anything else.
DType dtype_of(PyObject* dtype, const char* arg);

// The stream kiln.use_stream(...) set on this thread, if any.
void set_thread_stream(std::optional<CUstream> stream);
std::optional<CUstream> thread_stream();

// One launcher call's tensor arguments: every tensor must live on one CUDA device. The first tensor
// given fixes the device and the stream (kiln.use_stream's, else torch's current stream of that
// device, else the device's legacy default stream).
class TensorArgs {
 public:
  TensorArgs() = default;
  TensorArgs(const TensorArgs&) = delete;
  TensorArgs& operator=(const TensorArgs&) = delete;
  ~TensorArgs();

  TensorView get(PyObject* obj, const char* name);
  std::optional<TensorView> optional(PyObject* obj, const char* name);

  int device() const { return device_; }
  CUstream stream() const { return stream_; }

 private:
  void set_device(int device, const char* name);
  TensorView from_torch(PyObject* obj, const char* name);
  TensorView from_dlpack_object(PyObject* obj, const char* name);

  int device_ = -1;
  const char* first_name_ = nullptr;
  CUstream stream_ = nullptr;
  static constexpr int kMaxCapsules = 16;
  std::array<PyObject*, kMaxCapsules> capsules_{};  // DLPack exports, released after the launch
  int num_capsules_ = 0;
};

// Makes `device`'s primary context current on this thread for the scope (a no-op when it already
// is): default streams (0, legacy, per-thread) mean "of the current context", and the launch must
// land on the tensors' device whatever torch's current device is. Without a driver it does nothing,
// so that argument errors are reported before the missing driver.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace kiln::python
