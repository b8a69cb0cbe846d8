// main for the remote suite. Each test starts its own redis-server; without one on this machine the
// suite prints why and exits 77, which ctest reports as "skipped", never as passed.
#include <cstdio>
#include <string_view>

#include "kiln/runtime/families.h"
#include "tests/support/catch_session.h"
#include "tests/support/redis_server.h"

int main(int argc, char** argv) {
  bool listing = false;  // ctest discovers the test names at build time, with or without redis
  for (int i = 1; i < argc; ++i) listing |= std::string_view(argv[i]).starts_with("--list");
  if (!listing && kiln::testing::RedisServer::binary().empty()) {
    std::printf("SKIPPED: remote suite not run: redis-server is not on PATH and KILN_REDIS_SERVER is not set "
                "(Debian: apt-get install redis-server)\n");
    return 77;
  }
  kiln::register_builtin_families();
  return kiln::testing::run_catch_session(argc, argv);
}
