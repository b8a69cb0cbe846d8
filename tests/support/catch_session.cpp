// The Catch2 implementation, compiled once for every suite (it is the single most expensive file
// to compile in the tree) and without optimisation: its speed does not matter, its build time does.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/support/catch_session.h"

namespace kiln::testing {

int run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }

}  // namespace kiln::testing
