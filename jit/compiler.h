#pragma once
// KernelSource + arch -> cubin bytes through NVRTC, with in-memory headers and name expressions.
// Never touches disk.
#include <string>
#include <vector>

#include "kiln/jit/kernel_source.h"

namespace kiln {

struct CompileResult {
  std::string cubin;
  std::vector<std::string> lowered_names;  // parallel to KernelSource::name_expressions
  std::string log;
  double compile_ms = 0;
};

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
};

class Compiler {
 public:
  static NvrtcVersion nvrtc_version();

  // Options every compile uses, arch excluded (the arch is added as --gpu-architecture=<arch>).
  // Deterministic by construction: no line info, no debug, no paths.
  static const std::vector<std::string>& canonical_options();

  // Throws Error(kCompileFailed) with the full NVRTC log in details().log and `key_for_errors` as key.
  CompileResult compile(const KernelSource& source, const std::string& arch, const std::string& key_for_errors) const;
};

}  // namespace kiln
