#include "kiln/jit/compiler.h"

#include <fmt/format.h>
#include <nvrtc.h>

#include <chrono>
#include <cstdlib>
#include <string_view>
#include <memory>

#include "kiln/jit/error.h"
#include "kiln/jit/template_bundle.h"

namespace kiln {

namespace {

void check(nvrtcResult r, const char* what, const std::string& key) {
  if (r != NVRTC_SUCCESS) {
    throw Error(ErrorCode::kCompileFailed, fmt::format("{} failed: {}", what, nvrtcGetErrorString(r)), {.key = key});
  }
}

struct ProgramDeleter {
  void operator()(nvrtcProgram p) const { nvrtcDestroyProgram(&p); }
};
using Program = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

std::string program_log(nvrtcProgram prog) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

}  // namespace

NvrtcVersion Compiler::nvrtc_version() {
  NvrtcVersion v;
  nvrtcVersion(&v.major, &v.minor);
  return v;
}

std::vector<std::string> Compiler::canonical_options(std::string_view arch) {
  // --no-cache: where a driver is installed, NVRTC would also keep every cubin in the driver's compute
  //   cache (~/.nv/ComputeCache) and serve repeats from there: a second cache beside kiln's, which
  //   spends hashing and writes on every compile and makes a "cold" compile a hit.
  // -minimal: leaves out the texture, surface, device-runtime and driver-type declarations, which no
  //   template uses; a smaller front end, the same machine code.
  // --time=-: NVRTC appends its per-phase times to the log (take_phases); no effect on the cubin.
  // --frandom-seed=0: otherwise NVRTC names every internal-linkage symbol (a namespace-scope constexpr
  //   a kernel reads) after the clock's second and the process id, so one key gave cubins that differ
  //   in their symbol names from one process or second to the next (the machine code is the same). A
  //   fixed seed is safe because a module is never linked with another.
  // --ptxas-options=--split-compile=4: ptxas works on the module's entry points (at most 3 in any
  //   family) on threads of their own, so where cores are free a key's ptxas time is that of its
  //   largest kernel; the same machine code and attributes (only the order of the ELF symbol table
  //   moves). A fixed count keeps the options, and so the cubin bytes, the same on every machine.
  // --split-compile=4 (sm_90a only): NVVM optimises the module's entry points on threads of their own
  //   too (the writers' append modules hold three); sm_90a cubins are byte-identical with and without
  //   it (and on one CPU or several), while sm_120a machine code changes, so that arch goes without.
  std::vector<std::string> options = {"-std=c++17", "-DKILN_NVRTC=1", "--no-cache", "-minimal", "--time=-",
                                      "--frandom-seed=0", "--ptxas-options=--split-compile=4"};
  if (arch == "sm_90a") options.emplace_back("--split-compile=4");
  return options;
}

CompilePhases Compiler::take_phases(std::string& log) {
  // The table is CSV: a header row "File name, phase name, metric, unit", then one row per phase,
  // e.g. "kiln_kernel.cu, CUDA C++ Frontend, 383, ms".
  CompilePhases phases;
  std::string kept;
  bool in_table = false;
  std::size_t begin = 0;
  while (begin < log.size()) {
    std::size_t end = log.find('\n', begin);
    if (end == std::string::npos) end = log.size();
    const std::string_view line(log.data() + begin, end - begin);
    begin = end + 1;
    if (line.starts_with("File name, phase name, metric, unit")) {
      in_table = true;
      continue;
    }
    if (in_table) {
      const std::size_t a = line.find(", ");
      const std::size_t b = a == std::string_view::npos ? a : line.find(", ", a + 2);
      const std::size_t c = b == std::string_view::npos ? b : line.find(", ", b + 2);
      if (c != std::string_view::npos && line.substr(c + 2) == "ms") {
        const std::string_view phase = line.substr(a + 2, b - a - 2);
        const double ms = std::strtod(std::string(line.substr(b + 2, c - b - 2)).c_str(), nullptr);
        if (phase == "CUDA C++ Frontend") phases.front_end_ms += ms;
        else if (phase.starts_with("NVVM")) phases.nvvm_ms += ms;
        else if (phase == "PTX Translation") phases.ptxas_ms += ms;
        continue;
      }
      in_table = false;
    }
    kept.append(line);
    kept.push_back('\n');
  }
  while (!kept.empty() && (kept.back() == '\n' || kept.back() == '\0')) kept.pop_back();
  log = std::move(kept);
  return phases;
}

CompileResult Compiler::compile(const KernelSource& source, const std::string& arch,
                                const std::string& key_for_errors) const {
  const auto start = std::chrono::steady_clock::now();
  const auto files = embedded_templates();
  std::vector<const char*> header_names, header_bodies;
  std::vector<std::string> storage;  // NVRTC wants NUL-terminated strings
  storage.reserve(files.size() * 2);
  for (const EmbeddedFile& f : files) {
    storage.emplace_back(f.name);
    header_names.push_back(storage.back().c_str());
    storage.emplace_back(f.contents);
    header_bodies.push_back(storage.back().c_str());
  }

  nvrtcProgram raw = nullptr;
  // The program name appears in diagnostics only; a fixed name keeps the cubin independent of paths.
  check(nvrtcCreateProgram(&raw, source.source.c_str(), "kiln_kernel.cu", static_cast<int>(files.size()),
                           header_bodies.data(), header_names.data()),
        "nvrtcCreateProgram", key_for_errors);
  Program prog(raw);
  for (const std::string& name : source.name_expressions) {
    check(nvrtcAddNameExpression(raw, name.c_str()), "nvrtcAddNameExpression", key_for_errors);
  }

  std::vector<std::string> options = canonical_options(arch);
  options.push_back("--gpu-architecture=" + arch);
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());

  CompileResult result;
  const nvrtcResult status = nvrtcCompileProgram(raw, static_cast<int>(argv.size()), argv.data());
  result.log = program_log(raw);
  result.phases = take_phases(result.log);
  if (status != NVRTC_SUCCESS) {
    throw Error(ErrorCode::kCompileFailed,
                fmt::format("NVRTC could not compile the kernel for {} ({}); the log is attached below:\n{}", arch,
                            nvrtcGetErrorString(status), result.log),
                {.key = key_for_errors, .log = result.log});
  }
  for (const std::string& name : source.name_expressions) {
    const char* lowered = nullptr;
    check(nvrtcGetLoweredName(raw, name.c_str(), &lowered), "nvrtcGetLoweredName", key_for_errors);
    result.lowered_names.emplace_back(lowered);
  }
  std::size_t size = 0;
  check(nvrtcGetCUBINSize(raw, &size), "nvrtcGetCUBINSize", key_for_errors);
  result.cubin.resize(size);
  check(nvrtcGetCUBIN(raw, result.cubin.data()), "nvrtcGetCUBIN", key_for_errors);
  result.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln
