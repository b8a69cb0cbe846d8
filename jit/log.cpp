#include "kiln/jit/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace kiln {

namespace {
std::atomic<LogLevel> g_level{LogLevel::kWarn};
std::mutex g_mutex;
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

void log_message(LogLevel level, std::string_view text) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "kiln %s: %.*s\n", kNames[static_cast<int>(level)], static_cast<int>(text.size()), text.data());
}

}  // namespace kiln
