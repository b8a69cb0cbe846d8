// The shared argument rules of runtime/validation.h, which every launcher applies: each rule in one
// place, one wording, and the edge cases the launchers rely on.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "kiln/jit/error.h"
#include "kiln/runtime/validation.h"

namespace {

using kiln::DType;
using kiln::TensorView;

void* addr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("check::disjoint: overlapping views fail naming both, empty views overlap nothing", "[unit]") {
  const TensorView a = TensorView::contiguous(addr(0x10000), DType::kU8, {256});
  const TensorView b = TensorView::contiguous(addr(0x10080), DType::kU8, {256});
  const TensorView after = TensorView::contiguous(addr(0x10100), DType::kU8, {16});
  const std::string m = message_of([&] { kiln::check::disjoint(a, "out", b, "query"); });
  CHECK(m.find("argument 'out'") != std::string::npos);
  CHECK(m.find("disjoint from 'query'") != std::string::npos);
  CHECK_NOTHROW(kiln::check::disjoint(a, "out", after, "query"));  // [a, a + 256) ends where it starts
  // An empty view that starts inside another addresses no byte of it.
  const TensorView empty = TensorView::contiguous(addr(0x10040), DType::kU8, {0});
  CHECK_NOTHROW(kiln::check::disjoint(empty, "out", a, "query"));
  CHECK_NOTHROW(kiln::check::disjoint(a, "out", empty, "query"));
}

TEST_CASE("check::unit_stride: a dimension of extent 0 or 1 has no step to check", "[unit]") {
  TensorView t = TensorView::contiguous(addr(0x20000), DType::kI32, {4, 8});
  CHECK_NOTHROW(kiln::check::unit_stride(t, "indices", -1));
  t.strides[1] = 2;
  const std::string m = message_of([&] { kiln::check::unit_stride(t, "indices", -1); });
  CHECK(m.find("argument 'indices': expected stride(-1) == 1, got 2") != std::string::npos);
  TensorView one = TensorView::contiguous(addr(0x20000), DType::kI32, {4, 1});
  one.strides[1] = 7;
  CHECK_NOTHROW(kiln::check::unit_stride(one, "indices", 1));
}

TEST_CASE("check::finite and check::positive_finite judge the float32 value", "[unit]") {
  CHECK_NOTHROW(kiln::check::finite(-3.5, "lse_scale"));
  CHECK_NOTHROW(kiln::check::finite(0.0, "lse_scale"));
  CHECK(message_of([] { kiln::check::finite(1e39, "lse_scale"); }).find("a finite value (as float32)") != std::string::npos);
  CHECK(message_of([] { kiln::check::finite(std::nan(""), "lse_scale"); }).find("argument 'lse_scale'") != std::string::npos);
  CHECK_NOTHROW(kiln::check::positive_finite(1e-30, "sm_scale"));
  CHECK(message_of([] { kiln::check::positive_finite(1e-50, "sm_scale"); }).find("> 0") != std::string::npos);  // 0 as float32
  CHECK(message_of([] { kiln::check::positive_finite(-1.0, "sm_scale"); }).find("argument 'sm_scale'") != std::string::npos);
}
