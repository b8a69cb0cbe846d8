#pragma once
// Every KILN_* environment variable is read here and nowhere else (README has the table).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kiln/cache/remote_store.h"
#include "kiln/jit/log.h"

namespace kiln {

struct Config {
  std::filesystem::path cache_dir;                        // KILN_CACHE_DIR, else XDG_CACHE_HOME/kiln, else ~/.cache/kiln
  std::vector<std::filesystem::path> read_only_layers;    // KILN_CACHE_PATH, colon-separated
  bool sealed = false;                                    // KILN_SEALED=1
  std::optional<std::filesystem::path> record_misses;     // KILN_RECORD_MISSES=file
  LogLevel log_level = LogLevel::kWarn;                   // KILN_LOG_LEVEL=debug|info|warn|error|off
  std::optional<std::filesystem::path> dump_dir;          // KILN_DUMP_SOURCE=dir: rendered source + log per compile
  int threads = 0;                                        // KILN_THREADS (warm-up pool; 0 = hardware threads)
  std::optional<RemoteOptions> remote;                    // KILN_REMOTE_CACHE=redis://... and KILN_REMOTE_CACHE_*

  // Reads the environment. Throws Error(kInvalidArgument) naming the variable for malformed values.
  static Config from_environment();
};

}  // namespace kiln
