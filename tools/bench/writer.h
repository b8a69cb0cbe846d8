#pragma once
#include "tools/bench/options.h"

namespace kiln::tools {

// `kiln bench writer`: the NVFP4 cache writer, pack and append, N in {1, 64, 1k, 16k, 64k} rows x
// page size {64, 256}, append with and without duplicate slots, L2-cold, against the copy ceiling
// measured in the same run. Bytes moved = N x (1024 read + 384 written). Writes the JSON report
// to options.out (and stdout) and prints a compact table on stderr. --quick: N in {1, 16k}, page 64.
int run_bench_writer(const BenchOptions& options);

}  // namespace kiln::tools
