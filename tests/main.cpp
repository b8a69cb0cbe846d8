// main for the unit and nvrtc suites.
#include "kiln/runtime/families.h"
#include "tests/support/catch_session.h"

int main(int argc, char** argv) {
  kiln::register_builtin_families();
  return kiln::testing::run_catch_session(argc, argv);
}
