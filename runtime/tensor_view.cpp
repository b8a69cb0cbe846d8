#include "kiln/runtime/tensor_view.h"

#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBf16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    case DType::kE4m3: return "float8_e4m3fn";
    case DType::kU8: return "uint8";
    case DType::kI8: return "int8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
  }
  return "?";
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kBf16: case DType::kF16: return 2;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kI64: return 8;
    default: return 1;
  }
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t s : shape) v.shape[i++] = s;
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

TensorView TensorView::from_dlpack(const DLTensor& t, std::string_view name) {
  TensorView v;
  if (t.device.device_type != kDLCUDA && t.device.device_type != kDLCUDAManaged) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: expected CUDA device memory (a CUDA tensor: DLPack device type kDLCUDA = {}), got device type {}; "
                            "move the tensor to the GPU",
                            name, static_cast<int>(kDLCUDA), static_cast<int>(t.device.device_type)));
  }
  v.device = t.device.device_id;
  if (t.ndim < 0 || t.ndim > kMaxRank) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: rank {} is not supported (at most {})", name, t.ndim, kMaxRank));
  }
  const auto bad_dtype = [&] {
    return Error(ErrorCode::kInvalidArgument, fmt::format("{}: DLPack dtype (code {}, bits {}, lanes {}) is not supported",
                                                          name, t.dtype.code, t.dtype.bits, t.dtype.lanes));
  };
  if (t.dtype.lanes != 1) throw bad_dtype();
  switch (t.dtype.code) {
    case kDLBfloat: if (t.dtype.bits != 16) throw bad_dtype(); v.dtype = DType::kBf16; break;
    case kDLFloat:
      if (t.dtype.bits == 16) v.dtype = DType::kF16;
      else if (t.dtype.bits == 32) v.dtype = DType::kF32;
      else throw bad_dtype();
      break;
    case kDLUInt: if (t.dtype.bits != 8) throw bad_dtype(); v.dtype = DType::kU8; break;
    case kDLInt:
      if (t.dtype.bits == 8) v.dtype = DType::kI8;
      else if (t.dtype.bits == 32) v.dtype = DType::kI32;
      else if (t.dtype.bits == 64) v.dtype = DType::kI64;
      else throw bad_dtype();
      break;
    default:
      // DLPack 0.6 has no fp8 code; engines pass e4m3 tensors as uint8 and say so in the launcher.
      throw bad_dtype();
  }
  if (t.byte_offset % dtype_bytes(v.dtype) != 0) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: byte_offset {} is not a whole element", name, t.byte_offset));
  }
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  v.rank = t.ndim;
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = t.shape[d];
    v.strides[d] = t.strides ? t.strides[d] : stride;
    stride *= t.shape[d];
  }
  return v;
}

// Shapes come from callers and may be absurd: saturate rather than overflow (signed overflow is UB);
// a saturated size fails every later bound check anyway.
namespace {
std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
}  // namespace

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n = saturating_mul(n, shape[d]);
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected = saturating_mul(expected, shape[d]);
  }
  return true;
}

std::int64_t TensorView::extent_bytes() const {
  if (numel() == 0) return 0;
  std::int64_t last = 0;
  for (int d = 0; d < rank; ++d) last = saturating_add(last, saturating_mul(shape[d] - 1, strides[d]));
  return saturating_mul(saturating_add(last, 1), dtype_bytes(dtype));
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += fmt::format("{}{}", d ? ", " : "", shape[d]);
  return s + "]";
}

}  // namespace kiln
