#include "tools/bench/remote.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "kiln/cache/cubin_store.h"
#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/runtime/kernel_service.h"
#include "tools/bench/ceilings.h"

extern char** environ;

namespace kiln::tools {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
fs::path fresh_dir(const fs::path& path) {
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

// Deletes every key under `prefix` (the bench's own, so nothing else is touched).
void delete_prefix(const RemoteOptions& o) {
  try {
    RedisConnection c(o.endpoint, o.connect_timeout, std::chrono::seconds(5));
    std::string cursor = "0";
    do {
      const RedisReply r = c.command({"SCAN", cursor, "MATCH", o.key_prefix + "*", "COUNT", "1000"});
      if (r.is_error() || r.elements.size() != 2) return;
      cursor = r.elements[0].str;
      for (const RedisReply& k : r.elements[1].elements) c.command({"DEL", k.str});
    } while (cursor != "0");
  } catch (const Error& e) {
    std::fprintf(stderr, "bench: could not delete the bench's keys under %s: %s\n", o.key_prefix.c_str(), e.what());
  }
}

struct FleetRun {
  double wall_ms = 0;
  std::uint64_t compiled = 0, remote_hits = 0, lock_waits = 0, failed_processes = 0, keys = 0;
};

// `processes` x `kiln prebuild --json -j 1 --cache DIR/i` started together; remote tier on with
// `prefix`, off with an empty one.
FleetRun fleet_start(int processes, const fs::path& dir, const std::string& prefix, const std::string& manifest) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    // No read-only layers, no miss recording; the remote tier only when asked for.
    if (v.starts_with("KILN_CACHE_PATH=") || v.starts_with("KILN_RECORD_MISSES=") || v.starts_with("KILN_CACHE_DIR=")) continue;
    if (prefix.empty() && v.starts_with("KILN_REMOTE_CACHE")) continue;
    if (v.starts_with("KILN_REMOTE_CACHE_PREFIX=")) continue;
    env.emplace_back(v);
  }
  if (!prefix.empty()) env.push_back("KILN_REMOTE_CACHE_PREFIX=" + prefix);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  FleetRun run;
  std::vector<pid_t> pids;
  const auto start = BenchClock::now();
  for (int i = 0; i < processes; ++i) {
    const fs::path cache = fresh_dir(dir / std::to_string(i));
    std::vector<std::string> args = {self, "prebuild", "--json", "-j", "1", "--cache", cache.string()};
    if (!manifest.empty()) args.insert(args.end(), {"--manifest", fs::absolute(manifest).string()});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = (dir / fmt::format("{}.json", i)).string();
    const std::string err = (dir / fmt::format("{}.log", i)).string();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(ErrorCode::kInternal, "bench: fork failed");
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o < 0 || e < 0) ::_exit(126);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    run.failed_processes += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  run.wall_ms = bench_ms_since(start);
  for (int i = 0; i < processes; ++i) {
    std::ifstream in(dir / fmt::format("{}.json", i));
    std::stringstream text;
    text << in.rdbuf();
    const json r = json::parse(text.str(), nullptr, false);
    if (!r.is_object()) continue;
    run.compiled += r.value("compiled", 0ull);
    run.remote_hits += r.value("remote_hits", 0ull);
    run.keys = r["keys"].size();
    if (r.contains("remote")) run.lock_waits += r["remote"].value("lock_waits", 0ull);
  }
  return run;
}

}  // namespace

json bench_remote(const RemoteOptions& configured, const fs::path& base, const fs::path& compiled_dir,
                  const std::vector<SemanticKey>& keys, bool gpu, int fleet_processes, const std::string& manifest) {
  RemoteOptions o = configured;
  o.key_prefix = fmt::format("{}bench.{}:", configured.key_prefix, ::getpid());
  json out = {{"endpoint", o.endpoint.describe()}, {"signed", !o.secret.empty()}};
  struct Cleanup {
    const RemoteOptions& o;
    ~Cleanup() { delete_prefix(o); }
  } cleanup{o};

  // Upload what the cold run compiled, then warm it into an empty local cache.
  {
    RemoteStore remote(o);
    CubinStore compiled(CubinStore::Options{.root = compiled_dir});
    for (const SemanticKey& key : keys) {
      const auto hit = compiled.lookup(make_build_request(key).cache_key);
      std::string problem;
      if (!hit || remote.push(hit->entry, &problem) == RemoteStore::PushResult::kFailed) {
        throw Error(ErrorCode::kCacheIo, fmt::format("bench: cannot upload {} to {}: {}", key.str(),
                                                     o.endpoint.describe(), hit ? problem : "not compiled"));
      }
    }
  }
  {
    Config c = Config::from_environment();
    c.cache_dir = fresh_dir(base / "remote-warm");
    c.read_only_layers.clear();
    c.record_misses.reset();
    c.sealed = false;
    c.remote = o;
    KernelService service(c);
    RemoteStore fetcher(o);
    json per_key = json::array();
    std::vector<double> warm_ms, fetch_ms;
    for (const SemanticKey& key : keys) {
      const auto t0 = BenchClock::now();
      const ArtifactSource source = service.build(key).source;
      if (gpu) service.warm(key, 0);
      warm_ms.push_back(bench_ms_since(t0));
      if (source != ArtifactSource::kRemote) {
        throw Error(ErrorCode::kInternal, fmt::format("bench: {} came from {}, not the remote tier", key.str(),
                                                      artifact_source_name(source)));
      }
      const auto t1 = BenchClock::now();
      if (!fetcher.fetch(make_build_request(key).cache_key)) throw Error(ErrorCode::kInternal, "bench: remote fetch missed");
      fetch_ms.push_back(bench_ms_since(t1));
      per_key.push_back({{"key", key.str()}, {"warm_ms", warm_ms.back()}, {"fetch_ms", fetch_ms.back()}});
    }
    out["remote_hit_warm"] = {{"per_key", per_key},
                              {"median_ms", bench_median(warm_ms)},
                              {"includes", gpu ? "Redis read, verify, local publish (fsync), cuModuleLoadData, attributes"
                                               : "Redis read, verify, local publish (fsync); no GPU"}};
    out["remote_fetch"] = {{"median_ms", bench_median(fetch_ms)}, {"includes", "Redis read + checksum (+ HMAC) verify"}};
    std::fprintf(stderr, "remote-hit warm: median %.3f ms per key (fetch + verify alone %.3f ms)\n", bench_median(warm_ms),
                 bench_median(fetch_ms));
  }

  if (fleet_processes > 0) {
    json fleet = {{"processes", fleet_processes},
                  {"manifest", manifest.empty() ? std::string("embedded default") : manifest},
                  {"jobs_per_process", 1}};
    for (const bool remote : {false, true}) {
      const std::string prefix = remote ? fmt::format("{}fleet:", o.key_prefix) : "";
      std::fprintf(stderr, "fleet start: %d processes x the default manifest, %s ...\n", fleet_processes,
                   remote ? "with the remote tier" : "local caches only");
      const FleetRun r =
          fleet_start(fleet_processes, fresh_dir(base / (remote ? "fleet-remote" : "fleet-local")), prefix, manifest);
      fleet[remote ? "remote" : "local"] = {{"wall_ms", r.wall_ms},         {"compiles", r.compiled},
                                            {"remote_hits", r.remote_hits}, {"lock_waits", r.lock_waits},
                                            {"keys_per_process", r.keys},   {"failed_processes", r.failed_processes}};
      std::fprintf(stderr, "fleet start %s: %llu compiles, %llu remote hits, %.1f s\n", remote ? "remote" : "local",
                   static_cast<unsigned long long>(r.compiled), static_cast<unsigned long long>(r.remote_hits),
                   r.wall_ms / 1000);
      if (r.failed_processes != 0) {
        throw Error(ErrorCode::kInternal, fmt::format("bench: {} fleet processes failed; logs in {}", r.failed_processes,
                                                      (base / (remote ? "fleet-remote" : "fleet-local")).string()));
      }
    }
    out["fleet_start"] = fleet;
  }
  return out;
}

}  // namespace kiln::tools
