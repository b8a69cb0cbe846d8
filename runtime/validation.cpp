#include "kiln/runtime/validation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <vector>

#include "kiln/jit/error.h"

namespace kiln::check {

thread_local Phrase* Phrase::top_ = nullptr;

std::string Phrase::current() { return top_ == nullptr ? std::string() : top_->call_(top_->render_); }

namespace {
std::string with_phrase(std::string message) {
  std::string phrase = Phrase::current();
  return phrase.empty() ? message : phrase + "; " + message;
}
}  // namespace

void fail(std::string_view arg, std::string_view expected, std::string_view given) {
  throw Error(ErrorCode::kInvalidArgument,
              with_phrase(fmt::format("argument '{}': expected {}, got {}", arg, expected, given)));
}

void unsupported(std::string_view arg, std::string_view expected, std::string_view given) {
  throw Error(ErrorCode::kUnsupported,
              with_phrase(fmt::format("argument '{}': not implemented for {} (supported: {})", arg, given, expected)));
}

void fail_as(std::string_view upstream, std::string_view arg, std::string_view expected, std::string_view given) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}; argument '{}': expected {}, got {}", upstream, arg, expected, given));
}

void unsupported_as(std::string_view upstream, std::string_view arg, std::string_view expected, std::string_view given) {
  throw Error(ErrorCode::kUnsupported,
              fmt::format("{}; argument '{}': not implemented for {} (supported: {})", upstream, arg, given, expected));
}

void rank(const TensorView& t, std::string_view arg, std::initializer_list<int> allowed) {
  for (int r : allowed) {
    if (t.rank == r) return;
  }
  fail(arg, fmt::format("rank {}", fmt::join(allowed, " or ")), fmt::format("rank {} (shape {})", t.rank, t.shape_string()));
}

void dtype(const TensorView& t, std::string_view arg, std::initializer_list<DType> allowed) {
  std::vector<std::string_view> names;
  for (DType d : allowed) {
    if (t.dtype == d) return;
    names.push_back(dtype_name(d));
  }
  fail(arg, fmt::format("dtype {}", fmt::join(names, " or ")), dtype_name(t.dtype));
}

void dim(const TensorView& t, std::string_view arg, int d, std::int64_t expected) {
  if (t.size(d) != expected) {
    fail(arg, fmt::format("size {} in dimension {}", expected, d), fmt::format("shape {}", t.shape_string()));
  }
}

void contiguous(const TensorView& t, std::string_view arg) {
  if (!t.is_contiguous()) fail(arg, "a contiguous tensor", fmt::format("strides of shape {}", t.shape_string()));
}

void aligned(const TensorView& t, std::string_view arg, int bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  if (address % bytes != 0) fail(arg, fmt::format("a {}-byte aligned data pointer", bytes), fmt::format("address {:#x}", address));
}

void not_null(const TensorView& t, std::string_view arg) {
  if (t.data == nullptr && t.numel() != 0) fail(arg, "a non-null data pointer", "null");
}

void unit_stride(const TensorView& t, std::string_view arg, int d) {
  if (t.size(d) > 1 && t.stride(d) != 1) fail(arg, fmt::format("stride({}) == 1", d), fmt::format("{}", t.stride(d)));
}

void disjoint(const TensorView& a, std::string_view arg_a, const TensorView& b, std::string_view arg_b) {
  if (a.numel() == 0 || b.numel() == 0) return;  // an empty view addresses no bytes
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  const auto a1 = a0 + static_cast<std::uintptr_t>(a.extent_bytes());
  const auto b1 = b0 + static_cast<std::uintptr_t>(b.extent_bytes());
  if (a0 < b1 && b0 < a1) {
    fail_as(fmt::format("{} must not overlap {} storage", arg_a, arg_b), arg_a, fmt::format("memory disjoint from '{}'", arg_b),
         fmt::format("[{:#x}, {:#x}) overlapping [{:#x}, {:#x})", a0, a1, b0, b1));
  }
}

void finite(double value, std::string_view arg) {
  if (!std::isfinite(static_cast<float>(value))) fail(arg, "a finite value (as float32)", fmt::format("{}", value));
}

void positive_finite(double value, std::string_view arg) {
  const float f = static_cast<float>(value);
  if (!std::isfinite(f) || !(f > 0.0f)) fail(arg, "a finite value > 0 (as float32)", fmt::format("{}", value));
}

}  // namespace kiln::check
