// main (and the Catch2 implementation) for the unit and nvrtc suites.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "jit/log.h"
#include "runtime/families.h"

int main(int argc, char** argv) {
  kiln::register_builtin_families();
  kiln::set_log_level(kiln::LogLevel::kError);
  return Catch::Session().run(argc, argv);
}
