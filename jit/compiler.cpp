#include "kiln/jit/compiler.h"

#include <fmt/format.h>
#include <nvrtc.h>

#include <chrono>
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

const std::vector<std::string>& Compiler::canonical_options() {
  static const std::vector<std::string> kOptions = {"-std=c++17", "-DKILN_NVRTC=1"};
  return kOptions;
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

  std::vector<std::string> options = canonical_options();
  options.push_back("--gpu-architecture=" + arch);
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());

  CompileResult result;
  const nvrtcResult status = nvrtcCompileProgram(raw, static_cast<int>(argv.size()), argv.data());
  result.log = program_log(raw);
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
