#pragma once
#include "tools/bench/options.h"

namespace kiln::tools {

// `kiln bench sparse`: sparse NVFP4 MLA decode (runtime/sparse_nvfp4/README.md) over T in {1, 8, 64,
// 128, 512} x H in {64, 128} x candidates (topk 512; topk 2048; main 128 + extra 512), random
// indices over a >= 4 GB pool, L2-cold, against ceilings measured in the same run (copy bandwidth
// and an mma.sync bf16 peak, tools/bench/ceilings.h). Writes the JSON report to options.out (and
// stdout) and prints a compact table on stderr. --quick runs a 4-config subset.
int run_bench_sparse(const BenchOptions& options);

}  // namespace kiln::tools
