#pragma once
#include "tools/bench/options.h"

namespace kiln::tools {

// `kiln bench sparse_dsv41`: sparse MLA decode over the DeepSeek-V4.1 caches
// (runtime/sparse_dsv41/README.md) over T in {1, 8, 64, 128, 512} x H in {64, 128} x (topk,
// extra_topk) in {(128, 512), (512, 0), (2048, 0)}, with `kiln bench sparse`'s method (random indices
// over >= 4 GB pools, L2-cold, graphs of many calls) and row fields, so that tools/bench/compare.py
// reads it against the FlashMLA FP8 sparse anchors. Each config is also timed on kiln's NVFP4 decode
// in the same run. Writes the JSON report to options.out (and stdout), a compact table on stderr.
// --quick runs a 4-config subset; --only one config by name.
int run_bench_sparse_dsv41(const BenchOptions& options);

}  // namespace kiln::tools
