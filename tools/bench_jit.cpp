#include "tools/bench.h"

#include <cstdio>

#include "jit/error.h"

namespace kiln::tools {

int run_bench(const BenchOptions& options) {
  throw Error(ErrorCode::kInvalidArgument, "bench '" + options.what + "' is not implemented yet");
}

}  // namespace kiln::tools
