#pragma once
// Runs a callable that must throw kiln::Error and returns the error for the test to inspect.
#include <catch2/catch.hpp>
#include <functional>
#include <initializer_list>
#include <string>

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

// `f` fails with `code`, naming argument `arg`, and the message contains each of `parts`.
inline void expect_error(const std::function<void()>& f, const std::string& arg, std::initializer_list<std::string> parts = {},
                         ErrorCode code = ErrorCode::kInvalidArgument) {
  try {
    f();
    FAIL("no error; expected one naming '" << arg << "'");
  } catch (const kiln::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(std::string(kiln::error_code_name(e.code())) == std::string(kiln::error_code_name(code)));
    CHECK(what.find("argument '" + arg + "'") != std::string::npos);
    for (const std::string& p : parts) CHECK(what.find(p) != std::string::npos);
  }
}

// A device-independent rule of a launcher test's call (`plan()`: the plan-only entry, `run()`: the
// engine API): both reject it as expect_error says, before any driver call (without a driver the
// engine API would otherwise throw kDriver).
template <class Call>
void expect_rejected(const Call& c, const std::string& arg, std::initializer_list<std::string> parts = {},
                     ErrorCode code = ErrorCode::kInvalidArgument) {
  expect_error([&] { c.plan(); }, arg, parts, code);
  expect_error([&] { c.run(); }, arg, parts, code);
}

}  // namespace kiln::testing
