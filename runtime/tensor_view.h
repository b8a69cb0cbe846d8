#pragma once
// A non-owning view of a device tensor: pointer, dtype, shape, strides (in elements) and the CUDA
// device it lives on. Converts from DLPack's DLTensor so engines can pass framework tensors directly.
#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace kiln {

enum class DType { kBf16, kF16, kF32, kE4m3, kU8, kI8, kI32, kI64 };

std::string_view dtype_name(DType t);
int dtype_bytes(DType t);

struct TensorView {
  static constexpr int kMaxRank = 6;

  void* data = nullptr;
  DType dtype = DType::kU8;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};  // elements
  // CUDA device ordinal, or kAnyDevice for views built by hand (contiguous()): launchers check every
  // view that names a device against the device of the stream they launch on.
  static constexpr int kAnyDevice = -1;
  int device = kAnyDevice;

  // Contiguous (row-major) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  // Throws Error(kInvalidArgument) naming `name` for memory a GPU cannot address (device types other
  // than kDLCUDA and kDLCUDAManaged), unsupported dtypes, ranks or byte offsets.
  static TensorView from_dlpack(const DLTensor& t, std::string_view name);

  std::int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  std::int64_t stride(int dim) const { return strides[dim < 0 ? dim + rank : dim]; }
  std::int64_t numel() const;
  bool is_contiguous() const;
  // Bytes from the first to one past the last addressed element (for overlap checks).
  std::int64_t extent_bytes() const;
  std::string shape_string() const;
};

}  // namespace kiln
