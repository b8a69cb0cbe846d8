#pragma once
#include <string>
namespace kiln::tools {
struct BenchOptions {
  std::string what;       // jit (later: mla, sparse)
  std::string out;        // JSON report path
  std::string cache_dir;  // scratch cache root
  bool quick = false;     // mla/sparse: a 4-config smoke subset
  std::string only;       // sparse: time only the config of this name (e.g. "T=64 H=128 topk=2048"), for profilers;
                          // mla: only the rows of this group (grid, mixed, fp8, packed, page, kernel)
  int fleet = 16;         // jit with KILN_REMOTE_CACHE: processes of the fleet start (0: skip it)
  std::string manifest;   // the fleet start's manifest; empty: the embedded default
};
int run_bench(const BenchOptions& options);
}  // namespace kiln::tools
