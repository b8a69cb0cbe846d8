#pragma once
#include <string>
namespace kiln::tools {
struct BenchOptions {
  std::string what;       // jit (later: mla, sparse)
  std::string out;        // JSON report path
  std::string cache_dir;  // scratch cache root
  bool quick = false;     // mla/sparse: a 4-config smoke subset
  std::string only;       // sparse: only the config of this name (for profilers); mla: a group or a config name
  int splits = 0;         // sparse with `only`: every timing of that config at this split count (0: the planner's)
  int fleet = 16;         // jit with KILN_REMOTE_CACHE: processes of the fleet start (0: skip it)
  std::string manifest;   // jit: the cold-compile, prebuild and fleet-start manifest; empty: the embedded default
};
int run_bench(const BenchOptions& options);
}  // namespace kiln::tools
