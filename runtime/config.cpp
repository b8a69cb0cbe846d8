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

// A duration in milliseconds within [lo, hi].
std::chrono::milliseconds parse_ms(const char* name, const std::string& v, long long lo, long long hi) {
  long long n = -1;
  try {
    std::size_t used = 0;
    n = std::stoll(v, &used);
    if (used != v.size()) n = -1;
  } catch (const std::exception&) {
    n = -1;
  }
  if (n < lo || n > hi) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}='{}' is not a number of milliseconds in {}..{}", name, v, lo, hi));
  }
  return std::chrono::milliseconds(n);
}

std::optional<RemoteOptions> remote_from_environment() {
  const auto url = env("KILN_REMOTE_CACHE");
  if (!url) return std::nullopt;
  RemoteOptions r;
  try {
    r.endpoint = parse_redis_url(*url);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_REMOTE_CACHE: {}", e.message()));
  }
  if (auto v = env("KILN_REMOTE_CACHE_PASSWORD")) r.endpoint.password = *v;
  if (auto v = env("KILN_REMOTE_CACHE_PREFIX")) r.key_prefix = *v;
  if (auto v = env("KILN_REMOTE_CACHE_SECRET")) r.secret = *v;
  const auto ms = [](const char* name, std::chrono::milliseconds& out, long long lo, long long hi) {
    if (auto v = env(name)) out = parse_ms(name, *v, lo, hi);
  };
  constexpr long long kDay = 24LL * 3600 * 1000;
  ms("KILN_REMOTE_CACHE_CONNECT_TIMEOUT_MS", r.connect_timeout, 1, 60000);
  ms("KILN_REMOTE_CACHE_TIMEOUT_MS", r.command_timeout, 1, 60000);
  ms("KILN_REMOTE_CACHE_LOCK_TTL_MS", r.lock_ttl, 100, kDay);
  ms("KILN_REMOTE_CACHE_WAIT_MS", r.wait_bound, 0, kDay);
  ms("KILN_REMOTE_CACHE_RETRY_MS", r.retry_after, 0, kDay);
  return r;
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
  c.remote = remote_from_environment();
  return c;
}

}  // namespace kiln
