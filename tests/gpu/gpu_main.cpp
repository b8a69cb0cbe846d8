// main for the gpu suite: without a usable GPU it prints why and exits 77, which ctest reports as
// "skipped" — never as passed.
#include <cstdio>

#include "kiln/jit/log.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/families.h"
#include "tests/support/catch_session.h"

int main(int argc, char** argv) {
  const kiln::Driver& driver = kiln::Driver::get();
  if (!driver.available()) {
    std::printf("SKIPPED: gpu suite not run: %s\n", driver.reason().c_str());
    return 77;
  }
  kiln::register_builtin_families();
  kiln::set_log_level(kiln::LogLevel::kWarn);
  kiln::ScopedDeviceContext context(0);  // tests allocate and launch in device 0's primary context
  return kiln::testing::run_catch_session(argc, argv);
}
