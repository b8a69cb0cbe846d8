#include "kiln/runtime/config.h"

#include <fmt/format.h>

#include <cstdlib>

#include "kiln/jit/error.h"

namespace kiln {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool parse_bool(const char* name, const std::string& v) {
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}='{}' is not a boolean; use 1 or 0", name, v));
}

}  // namespace

Config Config::from_environment() {
  Config c;
  if (auto dir = env("KILN_CACHE_DIR")) {
    c.cache_dir = *dir;
  } else if (auto xdg = env("XDG_CACHE_HOME")) {
    c.cache_dir = std::filesystem::path(*xdg) / "kiln";
  } else if (auto home = env("HOME")) {
    c.cache_dir = std::filesystem::path(*home) / ".cache" / "kiln";
  } else {
    c.cache_dir = std::filesystem::temp_directory_path() / "kiln-cache";
  }
  if (auto layers = env("KILN_CACHE_PATH")) {
    std::size_t start = 0;
    while (start <= layers->size()) {
      const std::size_t end = std::min(layers->find(':', start), layers->size());
      if (end > start) c.read_only_layers.emplace_back(layers->substr(start, end - start));
      start = end + 1;
    }
  }
  if (auto v = env("KILN_SEALED")) c.sealed = parse_bool("KILN_SEALED", *v);
  if (auto v = env("KILN_RECORD_MISSES")) c.record_misses = *v;
  if (auto v = env("KILN_DUMP_SOURCE")) c.dump_dir = *v;
  if (auto v = env("KILN_LOG_LEVEL")) {
    if (*v == "debug") c.log_level = LogLevel::kDebug;
    else if (*v == "info") c.log_level = LogLevel::kInfo;
    else if (*v == "warn") c.log_level = LogLevel::kWarn;
    else if (*v == "error") c.log_level = LogLevel::kError;
    else if (*v == "off") c.log_level = LogLevel::kOff;
    else throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_LOG_LEVEL='{}' is not one of debug, info, warn, error, off", *v));
  }
  if (auto v = env("KILN_THREADS")) {
    try {
      c.threads = std::stoi(*v);
    } catch (const std::exception&) {
      c.threads = -1;
    }
    if (c.threads < 0) throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_THREADS='{}' is not a count >= 0", *v));
  }
  return c;
}

}  // namespace kiln
