#include "py_tensors.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <nanobind/nanobind.h>

#include <atomic>
#include <mutex>
#include <string>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"

namespace kiln::python {

namespace nb = nanobind;

namespace {

// DLPack >= 1.2's C exchange table, which a framework publishes on its tensor type as the capsule
// `__dlpack_c_exchange_api__` ("dlpack_exchange_api"). Declared here with dlpack.h's layout because
// the system header may predate it; only the members kiln calls are typed.
struct ExchangeVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
struct ExchangeHeader {
  ExchangeVersion version;
  ExchangeHeader* prev_api;
};
struct ExchangeApi {
  ExchangeHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);  // may be null
  int (*current_work_stream)(std::int32_t device_type, std::int32_t device_id, void** out_stream);
};

// Borrowed for the life of the process (torch is never unloaded).
struct TorchRefs {
  PyTypeObject* tensor = nullptr;
  PyTypeObject* parameter = nullptr;
  PyObject* current_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream(device) -> int
  PyObject* dtype_objects[8] = {};
  DType dtypes[8] = {};
  int num_dtypes = 0;
  // torch's exchange table when it has one: an exact torch.Tensor is then read by one C call instead
  // of five attribute reads, and the current stream without calling into Python. `verified` turns
  // true once the first tensor read both ways agreed; a disagreement turns the table off for good.
  const ExchangeApi* exchange = nullptr;
  bool verified = false;
};
TorchRefs g_torch;

// Interned attribute names.
PyObject* g_dtype = nullptr;
PyObject* g_get_device = nullptr;
PyObject* g_shape = nullptr;
PyObject* g_stride = nullptr;
PyObject* g_data_ptr = nullptr;
PyObject* g_dlpack = nullptr;
PyObject* g_dlpack_device = nullptr;

thread_local bool t_has_stream = false;
thread_local CUstream t_stream = nullptr;

struct Names {
  Names() {
    g_dtype = PyUnicode_InternFromString("dtype");
    g_get_device = PyUnicode_InternFromString("get_device");
    g_shape = PyUnicode_InternFromString("shape");
    g_stride = PyUnicode_InternFromString("stride");
    g_data_ptr = PyUnicode_InternFromString("data_ptr");
    g_dlpack = PyUnicode_InternFromString("__dlpack__");
    g_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
  }
};
void ensure_names() {
  static Names names;
}

// A new reference, or throws the Python error that is set.
PyObject* checked(PyObject* r) {
  if (r == nullptr) throw nb::python_error();
  return r;
}

struct Ref {
  PyObject* p;
  explicit Ref(PyObject* r) : p(checked(r)) {}
  ~Ref() { Py_DECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
};

std::string python_str(PyObject* o) {
  PyObject* s = PyObject_Str(o);
  if (s == nullptr) {
    PyErr_Clear();
    return "?";
  }
  const char* c = PyUnicode_AsUTF8(s);
  std::string out = c ? c : "?";
  Py_DECREF(s);
  return out;
}

std::string type_name(PyObject* o) { return Py_TYPE(o)->tp_name; }

[[noreturn]] void not_a_tensor(PyObject* obj, const char* name) {
  PyErr_Format(PyExc_TypeError,
               "%s: expected a CUDA tensor (torch.Tensor or any object with __dlpack__), got %s", name,
               Py_TYPE(obj)->tp_name);
  throw nb::python_error();
}

std::int64_t as_int64(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

// kiln.use_stream's stream, else torch's current stream of `device`, else (no torch, or a torch that
// cannot tell) the device's legacy default stream.
CUstream resolve_stream(int device) {
  if (t_has_stream) return t_stream;
  if (const ExchangeApi* api = g_torch.exchange; api != nullptr && g_torch.verified) {
    void* stream = nullptr;
    if (api->current_work_stream(kDLCUDA, device, &stream) == 0) return static_cast<CUstream>(stream);
    PyErr_Clear();
  }
  if (g_torch.current_raw_stream != nullptr) {
    Ref index(PyLong_FromLong(device));
    if (PyObject* handle = PyObject_CallOneArg(g_torch.current_raw_stream, index.p)) {
      const auto h = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(handle));
      Py_DECREF(handle);
      if (!PyErr_Occurred()) return reinterpret_cast<CUstream>(h);
    }
    PyErr_Clear();
  }
  return CU_STREAM_LEGACY;
}

}  // namespace

void init_torch(PyObject* torch) {
  ensure_names();
  Ref tensor(PyObject_GetAttrString(torch, "Tensor"));
  Ref nn(PyObject_GetAttrString(torch, "nn"));
  Ref parameter(PyObject_GetAttrString(nn.p, "Parameter"));
  Ref c(PyObject_GetAttrString(torch, "_C"));
  g_torch.tensor = reinterpret_cast<PyTypeObject*>(Py_NewRef(tensor.p));
  g_torch.parameter = reinterpret_cast<PyTypeObject*>(Py_NewRef(parameter.p));
  g_torch.current_raw_stream = PyObject_GetAttrString(c.p, "_cuda_getCurrentRawStream");
  if (g_torch.current_raw_stream == nullptr) PyErr_Clear();  // a CPU-only torch: no CUDA streams
  // DLPack 1.3 names the table `__dlpack_c_exchange_api__` (a capsule); torch builds between its
  // introduction and that rename publish the same table as the integer `__c_dlpack_exchange_api__`.
  // The objects are kept (never released): the table must outlive every call.
  const ExchangeHeader* header = nullptr;
  if (PyObject* capsule = PyObject_GetAttrString(tensor.p, "__dlpack_c_exchange_api__")) {
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
      header = static_cast<const ExchangeHeader*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
    }
  } else if (PyErr_Clear(); PyObject* address = PyObject_GetAttrString(tensor.p, "__c_dlpack_exchange_api__")) {
    if (PyLong_Check(address)) header = reinterpret_cast<const ExchangeHeader*>(PyLong_AsVoidPtr(address));
  }
  PyErr_Clear();
  while (header != nullptr && header->version.major > 1) header = header->prev_api;  // newer majors chain older ones
  if (header != nullptr && header->version.major == 1 && header->version.minor >= 2) {
    const auto* api = reinterpret_cast<const ExchangeApi*>(header);
    if (api->dltensor_from_py_object_no_sync != nullptr && api->current_work_stream != nullptr) g_torch.exchange = api;
  }
  const std::pair<const char*, DType> names[] = {{"bfloat16", DType::kBf16}, {"float16", DType::kF16},
                                                 {"float32", DType::kF32},   {"float8_e4m3fn", DType::kE4m3},
                                                 {"uint8", DType::kU8},      {"int8", DType::kI8},
                                                 {"int32", DType::kI32},     {"int64", DType::kI64}};
  for (const auto& [name, dtype] : names) {
    PyObject* o = PyObject_GetAttrString(torch, name);
    if (o == nullptr) {
      PyErr_Clear();
      continue;
    }
    g_torch.dtype_objects[g_torch.num_dtypes] = o;
    g_torch.dtypes[g_torch.num_dtypes++] = dtype;
  }
}

bool have_torch() { return g_torch.tensor != nullptr; }

DType dtype_of(PyObject* dtype, const char* arg) {
  for (int i = 0; i < g_torch.num_dtypes; ++i) {
    if (g_torch.dtype_objects[i] == dtype) return g_torch.dtypes[i];
  }
  if (PyUnicode_Check(dtype)) {
    const char* text = PyUnicode_AsUTF8(dtype);
    if (text == nullptr) throw nb::python_error();
    for (DType t : {DType::kBf16, DType::kF16, DType::kF32, DType::kE4m3, DType::kU8, DType::kI8, DType::kI32, DType::kI64}) {
      if (dtype_name(t) == text) return t;
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: expected a torch.dtype or a dtype name such as 'bfloat16', got {} ({})", arg,
                          python_str(dtype), type_name(dtype)));
}

void set_thread_stream(std::optional<CUstream> stream) {
  t_has_stream = stream.has_value();
  t_stream = stream.value_or(nullptr);
}

std::optional<CUstream> thread_stream() {
  if (!t_has_stream) return std::nullopt;
  return t_stream;
}

TensorArgs::~TensorArgs() {
  for (int i = 0; i < num_capsules_; ++i) Py_DECREF(capsules_[i]);
}

void TensorArgs::set_device(int device, const char* name) {
  if (first_name_ == nullptr) {
    first_name_ = name;
    device_ = device;
    stream_ = resolve_stream(device);
    return;
  }
  if (device != device_) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} is on cuda:{} but {} is on cuda:{}; every tensor of one call must be on one device",
                            name, device, first_name_, device_));
  }
}

namespace {

// A CUDA tensor of a dtype kiln reads, described by torch's exchange table; false sends the tensor
// to the attribute path (which also words the errors).
bool view_from_exchange(PyObject* obj, TensorView& v) {
  DLTensor t{};
  if (g_torch.exchange->dltensor_from_py_object_no_sync(obj, &t) != 0) {
    PyErr_Clear();
    return false;
  }
  if ((t.device.device_type != kDLCUDA && t.device.device_type != kDLCUDAManaged) || t.device.device_id < 0 ||
      t.ndim < 0 || t.ndim > TensorView::kMaxRank || t.dtype.lanes != 1 || t.shape == nullptr) {
    return false;
  }
  const std::uint8_t code = t.dtype.code;
  const std::uint8_t bits = t.dtype.bits;
  constexpr std::uint8_t kFloat8E4m3fn = 10;  // DLPack >= 1.1's kDLFloat8_e4m3fn
  if (code == kDLBfloat && bits == 16) v.dtype = DType::kBf16;
  else if (code == kDLFloat && bits == 16) v.dtype = DType::kF16;
  else if (code == kDLFloat && bits == 32) v.dtype = DType::kF32;
  else if (code == kFloat8E4m3fn && bits == 8) v.dtype = DType::kE4m3;
  else if (code == kDLUInt && bits == 8) v.dtype = DType::kU8;
  else if (code == kDLInt && bits == 8) v.dtype = DType::kI8;
  else if (code == kDLInt && bits == 32) v.dtype = DType::kI32;
  else if (code == kDLInt && bits == 64) v.dtype = DType::kI64;
  else return false;
  v.device = t.device.device_id;
  v.rank = t.ndim;
  std::int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    v.shape[d] = t.shape[d];
    v.strides[d] = t.strides != nullptr ? t.strides[d] : stride;
    stride *= t.shape[d];
  }
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  return true;
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.device != b.device || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d) {
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}

}  // namespace

TensorView TensorArgs::get(PyObject* obj, const char* name) {
  ensure_names();
  if (have_torch()) {
    PyTypeObject* type = Py_TYPE(obj);
    if (type == g_torch.tensor && g_torch.exchange != nullptr) {
      TensorView v;
      if (view_from_exchange(obj, v)) {
        if (!g_torch.verified) {
          // First use: the table must describe the tensor exactly as its attributes do.
          const TensorView slow = from_torch(obj, name);
          void* stream = nullptr;
          const bool stream_ok = t_has_stream ||
                                 (g_torch.exchange->current_work_stream(kDLCUDA, slow.device, &stream) == 0 &&
                                  static_cast<CUstream>(stream) == resolve_stream(slow.device));
          PyErr_Clear();
          if (!same_view(v, slow) || !stream_ok) {
            g_torch.exchange = nullptr;
            return slow;
          }
          g_torch.verified = true;
          return slow;
        }
        set_device(v.device, name);
        return v;
      }
    }
    if (type == g_torch.tensor || type == g_torch.parameter) return from_torch(obj, name);
    if (PyType_IsSubtype(type, g_torch.tensor)) throw NeedsDispatch{};
  }
  return from_dlpack_object(obj, name);
}

std::optional<TensorView> TensorArgs::optional(PyObject* obj, const char* name) {
  if (obj == Py_None) return std::nullopt;
  return get(obj, name);
}

TensorView TensorArgs::from_torch(PyObject* obj, const char* name) {
  TensorView v;
  {
    Ref dtype(PyObject_GetAttr(obj, g_dtype));
    int i = 0;
    while (i < g_torch.num_dtypes && g_torch.dtype_objects[i] != dtype.p) ++i;
    if (i == g_torch.num_dtypes) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: dtype {} is not supported", name, python_str(dtype.p)));
    }
    v.dtype = g_torch.dtypes[i];
  }
  {
    Ref device(PyObject_CallMethodNoArgs(obj, g_get_device));
    const std::int64_t d = as_int64(device.p);
    if (d < 0) {
      Ref where(PyObject_GetAttrString(obj, "device"));
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: expected a CUDA tensor, got one on {}; move it to the GPU", name, python_str(where.p)));
    }
    v.device = static_cast<int>(d);
  }
  Ref shape(PyObject_GetAttr(obj, g_shape));
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape.p);
  if (rank > TensorView::kMaxRank) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: rank {} is not supported (at most {})", name, rank, TensorView::kMaxRank));
  }
  Ref strides(PyObject_CallMethodNoArgs(obj, g_stride));
  v.rank = static_cast<int>(rank);
  for (Py_ssize_t d = 0; d < rank; ++d) {
    v.shape[d] = as_int64(PyTuple_GET_ITEM(shape.p, d));
    v.strides[d] = as_int64(PyTuple_GET_ITEM(strides.p, d));
  }
  Ref ptr(PyObject_CallMethodNoArgs(obj, g_data_ptr));
  v.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(ptr.p)));
  set_device(v.device, name);
  return v;
}

TensorView TensorArgs::from_dlpack_object(PyObject* obj, const char* name) {
  PyObject* capsule = nullptr;
  if (PyCapsule_CheckExact(obj)) {
    capsule = Py_NewRef(obj);
  } else {
    if (!PyObject_HasAttr(obj, g_dlpack)) not_a_tensor(obj, name);
    // The device first: the export is made on the stream of the launch, which depends on it.
    int device = -1;
    if (PyObject_HasAttr(obj, g_dlpack_device)) {
      Ref where(PyObject_CallMethodNoArgs(obj, g_dlpack_device));
      if (!PyTuple_Check(where.p) || PyTuple_GET_SIZE(where.p) != 2) {
        throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: __dlpack_device__() did not return (type, id)", name));
      }
      const std::int64_t type = as_int64(PyTuple_GET_ITEM(where.p, 0));
      device = static_cast<int>(as_int64(PyTuple_GET_ITEM(where.p, 1)));
      if (type != kDLCUDA && type != kDLCUDAManaged) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("{}: expected CUDA device memory (a CUDA tensor: DLPack device type kDLCUDA = {}), got device type {}; "
                                "move the tensor to the GPU",
                                name, static_cast<int>(kDLCUDA), type));
      }
      set_device(device, name);
    }
    // DLPack's stream argument: 1 is the legacy default stream (0 is reserved), else the handle.
    const auto handle = reinterpret_cast<std::uintptr_t>(stream_);
    Ref kwargs(PyDict_New());
    Ref stream_value(PyLong_FromUnsignedLongLong(handle == 0 ? 1 : handle));
    if (device >= 0 && PyDict_SetItemString(kwargs.p, "stream", stream_value.p) != 0) throw nb::python_error();
    Ref method(PyObject_GetAttr(obj, g_dlpack));
    Ref args(PyTuple_New(0));
    capsule = checked(PyObject_Call(method.p, args.p, kwargs.p));
  }
  if (num_capsules_ == kMaxCapsules) {
    Py_DECREF(capsule);
    throw Error(ErrorCode::kInternal, "more than 16 DLPack tensors in one call");
  }
  capsules_[num_capsules_++] = capsule;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: __dlpack__() returned no unconsumed \"dltensor\" capsule", name));
  }
  TensorView v = TensorView::from_dlpack(managed->dl_tensor, name);
  set_device(v.device, name);
  return v;
}

DeviceScope::DeviceScope(int device) {
  static std::mutex mutex;
  static std::atomic<CUcontext> contexts[64];
  if (device < 0 || device >= 64) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("device ordinal {} is out of range", device));
  }
  const Driver& d = Driver::get();
  if (!d.available()) return;  // the launcher checks its arguments first, then reports the missing driver
  CUcontext ctx = contexts[device].load(std::memory_order_acquire);
  if (ctx == nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    ctx = contexts[device].load();
    if (ctx == nullptr) {
      CUdevice dev = 0;
      d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
      d.check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");  // kept for the process
      contexts[device].store(ctx, std::memory_order_release);
    }
  }
  d.check(d.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != ctx) {
    d.check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    switched_ = true;
  }
}

DeviceScope::~DeviceScope() {
  if (switched_) Driver::get().cuCtxSetCurrent(previous_);
}

}  // namespace kiln::python
