// fleet_worker: one "host" of the fleet test (fleet_supervisor.cpp): a server starting up. It
// builds a KernelService from the environment (KILN_REMOTE_CACHE... as a server would), warms its
// keys over a thread pool (compiling, or taking them from the remote tier or its own cache
// directory), and writes what it got to --out as JSON: per key the source and the cubin's XXH3-64,
// the wall time and the counters. The file is renamed into place, so a SIGKILLed worker leaves none.
//
// Usage: fleet_worker --cache DIR --out FILE --keys 0,3,5 [--threads 2] [--dump-dir DIR]
// Keys are indices into fleet_keys(). Exit 0 when every key was served, 1 otherwise.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "fleet_keys.h"
#include "kiln/jit/error.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/kernel_service.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int usage(const std::string& why) {
  std::fprintf(stderr, "fleet_worker: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cache, out, dump_dir, keys_text;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return usage("missing value after " + arg);
    const std::string v = argv[++i];
    if (arg == "--cache") cache = v;
    else if (arg == "--out") out = v;
    else if (arg == "--keys") keys_text = v;
    else if (arg == "--threads") threads = std::stoi(v);
    else if (arg == "--dump-dir") dump_dir = v;
    else return usage("unknown argument " + arg);
  }
  if (cache.empty() || out.empty() || keys_text.empty()) return usage("--cache, --out and --keys are required");
  std::vector<int> mine;
  for (std::size_t pos = 0; pos < keys_text.size();) {
    const std::size_t end = std::min(keys_text.find(',', pos), keys_text.size());
    mine.push_back(std::stoi(keys_text.substr(pos, end - pos)));
    pos = end + 1;
  }

  kiln::register_builtin_families();
  const auto start = Clock::now();
  try {
    kiln::Config config = kiln::Config::from_environment();
    config.cache_dir = cache;
    config.read_only_layers.clear();
    // KILN_DUMP_SOURCE writes <cache key>.log after each finished compile: the supervisor counts
    // compiles from those files, which a SIGKILL cannot take back.
    if (!dump_dir.empty()) config.dump_dir = dump_dir;
    kiln::set_log_level(config.log_level);
    json report = {{"pid", ::getpid()}, {"keys", json::object()}};
    {
      kiln::KernelService service(config);
      const std::vector<kiln::SemanticKey> keys = kiln::fleet::fleet_keys();
      std::shuffle(mine.begin(), mine.end(), std::minstd_rand(static_cast<unsigned>(::getpid())));
      std::atomic<std::size_t> next{0};
      std::atomic<int> failures{0};
      std::mutex mutex;
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
          for (std::size_t i = next++; i < mine.size(); i = next++) {
            const int k = mine[i];
            const auto t0 = Clock::now();
            try {
              const kiln::Artifact a = service.build(keys.at(static_cast<std::size_t>(k)));
              const std::uint64_t hash = XXH3_64bits(a.entry->cubin.data(), a.entry->cubin.size());
              const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
              std::lock_guard<std::mutex> lock(mutex);
              report["keys"][std::to_string(k)] = {{"source", kiln::artifact_source_name(a.source)},
                                                   {"hash", fmt::format("{:016x}", hash)},
                                                   {"ms", ms}};
            } catch (const kiln::Error& e) {
              ++failures;
              std::fprintf(stderr, "fleet_worker: key %d: %s\n", k, e.what());
            }
          }
        });
      }
      for (auto& t : pool) t.join();
      report["service"] = service.counters().to_json();
      if (kiln::RemoteStore* remote = service.remote()) report["remote"] = remote->counters().to_json();
      report["failures"] = failures.load();
      report["wall_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    }  // the service (and its remote tier) is gone: counters flushed, nothing left running
    const std::string tmp = out + ".tmp";
    std::ofstream(tmp) << report.dump() << "\n";
    std::filesystem::rename(tmp, out);
    return report["failures"].get<int>() == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet_worker: %s\n", e.what());
    return 1;
  }
}
