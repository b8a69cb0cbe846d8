#pragma once
#include "tools/bench/options.h"

namespace kiln::tools {

// `kiln bench mla`: paged MLA decode over the DeepSeek-V3 decode grid (B x L x H x SQ, page 64, bf16,
// causal) with L2-cold KV, against ceilings measured in the same run (device-to-device copy
// bandwidth and an mma.sync bf16 peak kernel). Writes the JSON report to options.out and prints a
// compact table on stderr. --quick runs a 4-config subset (smoke test).
int run_bench_mla(const BenchOptions& options);

}  // namespace kiln::tools
