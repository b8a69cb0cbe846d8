#pragma once
// KernelSource + arch -> cubin bytes through NVRTC, with in-memory headers and name expressions.
// Never touches disk.
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/kernel_source.h"

namespace kiln {

// Where a compile's time went, as NVRTC reports it (whole milliseconds): the C++ front end, the NVVM
// optimizer and code generation (LLVM IR -> PTX), and ptxas (PTX -> SASS). All zero when NVRTC
// reported no table.
struct CompilePhases {
  double front_end_ms = 0;
  double nvvm_ms = 0;
  double ptxas_ms = 0;
};

struct CompileResult {
  std::string cubin;
  std::vector<std::string> lowered_names;  // parallel to KernelSource::name_expressions
  std::string log;                          // NVRTC's diagnostics (the timing table removed)
  double compile_ms = 0;
  CompilePhases phases;
};

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
};

class Compiler {
 public:
  static NvrtcVersion nvrtc_version();

  // Every option a compile for `arch` passes but the arch itself (added as --gpu-architecture=<arch>).
  // Deterministic by construction: no line info, no debug, no paths. All of them are hashed into the
  // cache key, including those that do not change the cubin.
  static std::vector<std::string> canonical_options(std::string_view arch);

  // Reads NVRTC's timing table (--time=-) out of `log` and removes it; other lines stay.
  static CompilePhases take_phases(std::string& log);

  // Throws Error(kCompileFailed) with the full NVRTC log in details().log and `key_for_errors` as key.
  CompileResult compile(const KernelSource& source, const std::string& arch, const std::string& key_for_errors) const;
};

}  // namespace kiln
