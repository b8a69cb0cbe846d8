// main (and the Catch2 implementation) for the unit and nvrtc suites.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "runtime/families.h"

int main(int argc, char** argv) {
  kiln::register_builtin_families();
  return Catch::Session().run(argc, argv);
}
