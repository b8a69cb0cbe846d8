#pragma once
// Runs a callable that must throw kiln::Error and returns the error for the test to inspect.
#include <catch2/catch.hpp>

#include "kiln/jit/error.h"

namespace kiln::testing {

template <typename F>
kiln::Error expect_error(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e;
  }
  FAIL("expected a kiln::Error");
  return kiln::Error(ErrorCode::kInternal, "unreachable");
}

}  // namespace kiln::testing
