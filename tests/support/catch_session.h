#pragma once

namespace kiln::testing {

// Runs the Catch2 session (the suites' mains call this instead of including Catch's implementation).
int run_catch_session(int argc, char** argv);

}  // namespace kiln::testing
