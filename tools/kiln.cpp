// The kiln CLI: prebuild, warm, ls, inspect, verify, prune, stats, bench.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/manifest.h"
#include "tools/bench/options.h"
#include "tools/bench/mla.h"
#include "tools/bench/sparse.h"
#include "tools/bench/sparse_dsv41.h"
#include "tools/bench/writer.h"
#include "tools/cache_ops.h"

namespace kiln::tools {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kExitBadInput = 2;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct CommonOptions {
  std::string cache_dir;
  bool json = false;
};

Config make_config(const CommonOptions& o) {
  Config c = Config::from_environment();
  if (!o.cache_dir.empty()) c.cache_dir = o.cache_dir;
  set_log_level(c.log_level);
  return c;
}

int run_prebuild(const CommonOptions& common, const std::string& manifest, const std::optional<std::string>& archs, int jobs,
                 bool push) {
  if (jobs < 1) throw Error(ErrorCode::kInvalidArgument, fmt::format("-j must be >= 1, got {}", jobs));
  const ManifestSelection selection = manifest_selection(manifest, archs);
  const std::vector<SemanticKey>& keys = selection.keys;
  KernelService service(make_config(common));
  if (push && service.remote() == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "prebuild --push needs a remote cache: set KILN_REMOTE_CACHE=redis://host:port (README: the remote tier)");
  }
  for (const SkippedEntry& s : selection.skipped) {
    std::fprintf(stderr, "skipped  manifest %s (%s, %zu key%s): it allows %s only\n", s.entry.c_str(), s.family.c_str(), s.keys,
                 s.keys == 1 ? "" : "s", fmt::format("{}", fmt::join(s.archs, ", ")).c_str());
  }
  const auto start = Clock::now();
  const std::vector<PrebuildOutcome> outcomes = prebuild(service, keys, jobs, print_prebuild_progress, push);
  const double wall = ms_since(start);
  const json report = prebuild_report(service, selection, outcomes, wall, jobs, push);
  if (common.json) std::printf("%s\n", report.dump(2).c_str());
  const std::string remote_hits =
      service.remote() ? fmt::format(" ({} from the remote cache)", report["remote_hits"].get<std::size_t>()) : "";
  const std::string skipped =
      selection.skipped.empty() ? ""
                                : fmt::format(", {} skipped ({} manifest entries allow none of --arch)",
                                              report["skipped_keys"].get<std::size_t>(), selection.skipped.size());
  const std::string companions =
      selection.companions == 0 ? "" : fmt::format(" ({} of them companion modules of the others)", selection.companions);
  std::fprintf(stderr, "prebuild: %zu keys%s in %zu modules: %zu compiled, %zu hit%s, %zu failed%s in %.1f s (-j %d, cache %s)\n",
               keys.size(), companions.c_str(), report["modules"].get<std::size_t>(), report["compiled"].get<std::size_t>(),
               report["hits"].get<std::size_t>(), remote_hits.c_str(),
               report["failed"].get<std::size_t>(), skipped.c_str(), wall / 1000.0, jobs, service.config().cache_dir.c_str());
  std::size_t push_failed = 0;
  if (push) {
    const json& p = report["push"];
    push_failed = p["failed"].get<std::size_t>();
    std::fprintf(stderr, "push to %s: %zu uploaded, %zu already there, %zu failed\n",
                 service.remote()->options().endpoint.describe().c_str(), p["uploaded"].get<std::size_t>(),
                 p["present"].get<std::size_t>(), push_failed);
  }
  // A root that stops taking entries mid-run (full disk, read-only remount) has warned once; what
  // was compiled after that is not in the cache.
  const bool stored = service.store().writable();
  if (!stored) {
    std::fprintf(stderr, "prebuild: the cache directory %s stopped taking entries during the run: keys compiled after "
                 "that are not in it (see the warning above); free space or fix its permissions and run again\n",
                 service.config().cache_dir.c_str());
  }
  return report["failed"].get<std::size_t>() == 0 && push_failed == 0 && stored ? 0 : 1;
}

int run_warm(const CommonOptions& common, const std::string& manifest, std::vector<int> devices) {
  const Driver& d = Driver::get();
  d.require("warm kernels");
  if (devices.empty()) {
    int count = 0;
    d.check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    for (int i = 0; i < count; ++i) devices.push_back(i);
  }
  const std::vector<SemanticKey> keys = manifest_keys(manifest, std::nullopt);
  KernelService service(make_config(common));
  const auto start = Clock::now();
  const std::vector<std::size_t> per_device = warm_on_devices(service, keys, devices, print_warm_progress);
  std::size_t warmed = 0;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    std::fprintf(stderr, "device %d (%s): %zu keys warm\n", devices[i], service.device_arch(devices[i]).c_str(), per_device[i]);
    warmed += per_device[i];
  }
  const std::size_t skipped = keys.size() * devices.size() - warmed;
  const ServiceCounters c = service.counters();
  json report = {{"warmed", warmed}, {"skipped_other_arch", skipped}, {"wall_ms", ms_since(start)},
                 {"remote_hits", c.remote_hits}, {"counters", c.to_json()}};
  if (RemoteStore* remote = service.remote()) report["remote"] = remote->counters().to_json();
  if (common.json) std::printf("%s\n", report.dump(2).c_str());
  std::fprintf(stderr, "warm: %zu key-device pairs in %.1f ms: %llu compiles, %llu disk hits, %llu read-only hits, %llu remote hits, %llu loads\n",
               warmed, ms_since(start), static_cast<unsigned long long>(c.compiles), static_cast<unsigned long long>(c.disk_hits),
               static_cast<unsigned long long>(c.read_only_hits), static_cast<unsigned long long>(c.remote_hits),
               static_cast<unsigned long long>(c.loads));
  return 0;
}

int run_ls(const CommonOptions& common) {
  KernelService service(make_config(common));
  json list = json::array();
  for (const ListedEntry& e : service.store().list()) {
    list.push_back({{"cache_key", e.key_hex}, {"key", e.semantic_key}, {"bytes", e.bytes}, {"layer", tier_name(e.tier)},
                    {"file", e.file.string()}, {"problem", e.problem}});
    if (!common.json) {
      std::printf("%s  %8llu  %-9s %s%s\n", e.key_hex.c_str(), static_cast<unsigned long long>(e.bytes),
                  std::string(tier_name(e.tier)).c_str(), e.semantic_key.c_str(),
                  e.problem.empty() ? "" : fmt::format("  [{}]", e.problem).c_str());
    }
  }
  if (common.json) std::printf("%s\n", list.dump(2).c_str());
  return 0;
}

int run_inspect(const CommonOptions& common, const std::string& text) {
  KernelService service(make_config(common));
  std::optional<CacheKey> cache_key = CacheKey::parse_hex(text);
  std::optional<SemanticKey> asked;
  if (!cache_key) {
    asked = SemanticKey::parse(text);
    cache_key = make_build_request(*asked).cache_key;
  }
  const auto hit = service.store().lookup(*cache_key);
  if (!hit) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("no cache entry for {}; run `kiln prebuild` (or check --cache / KILN_CACHE_PATH)", text),
                {.key = cache_key->hex()});
  }
  // Keys whose kernels compile to the same module share its entry, which records the key it was
  // compiled for: a semantic key asked for is shown as itself, with that key beside it.
  const SemanticKey shown = asked ? *asked : SemanticKey::parse(hit->entry.semantic_key);
  json out = {{"cache_key", cache_key->hex()},          {"key", shown.str()},
              {"layer", tier_name(hit->tier)},           {"file", hit->file.string()},
              {"cubin_bytes", hit->entry.cubin.size()}, {"metadata", hit->entry.metadata}};
  if (shown.str() != hit->entry.semantic_key) out["compiled_for"] = hit->entry.semantic_key;
  // The modules a launch of this key also runs (they are entries of their own).
  json companions = json::array();
  for (const SemanticKey& c : companion_keys(shown)) companions.push_back(c.str());
  out["companions"] = companions;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

int run_verify(const CommonOptions& common) {
  KernelService service(make_config(common));
  const VerifyReport r = service.store().verify();
  for (const BadEntry& b : r.bad) {
    std::fprintf(stderr, "bad entry %s (%s): %s%s\n", b.file.c_str(), std::string(tier_name(b.tier)).c_str(), b.reason.c_str(),
                 b.quarantined ? " -> quarantined" : "");
  }
  if (common.json) {
    json bad = json::array();
    for (const BadEntry& b : r.bad) bad.push_back({{"file", b.file.string()}, {"reason", b.reason}, {"quarantined", b.quarantined}});
    std::printf("%s\n", json{{"checked", r.checked}, {"bad", bad}}.dump(2).c_str());
  }
  std::fprintf(stderr, "verify: %llu entries checked, %zu bad\n", static_cast<unsigned long long>(r.checked), r.bad.size());
  return r.ok() ? 0 : 1;
}

int run_prune(const CommonOptions& common, long long max_bytes) {
  if (max_bytes < 0) throw Error(ErrorCode::kInvalidArgument, fmt::format("--max-bytes must be >= 0, got {}", max_bytes));
  KernelService service(make_config(common));
  const PruneReport r = service.store().prune(static_cast<std::uint64_t>(max_bytes));
  json out = {{"removed_entries", r.removed_entries}, {"removed_quarantined", r.removed_quarantined},
              {"freed_bytes", r.freed_bytes}, {"remaining_entries", r.remaining_entries}, {"remaining_bytes", r.remaining_bytes}};
  if (common.json) std::printf("%s\n", out.dump(2).c_str());
  std::fprintf(stderr, "prune: removed %llu entries (%llu bytes); %llu entries, %llu bytes remain\n",
               static_cast<unsigned long long>(r.removed_entries), static_cast<unsigned long long>(r.freed_bytes),
               static_cast<unsigned long long>(r.remaining_entries), static_cast<unsigned long long>(r.remaining_bytes));
  return 0;
}

int run_stats(const CommonOptions& common) {
  KernelService service(make_config(common));
  const json s = store_stats(service);
  if (common.json) {
    std::printf("%s\n", s.dump(2).c_str());
    return 0;
  }
  for (const json& l : s["layers"]) {
    std::printf("%-9s %s: %llu entries, %llu bytes%s\n", l["layer"].get<std::string>().c_str(), l["root"].get<std::string>().c_str(),
                l["entries"].get<unsigned long long>(), l["bytes"].get<unsigned long long>(), l["present"].get<bool>() ? "" : " (absent)");
  }
  std::printf("quarantined: %llu files; temp files: %llu; writable: %s\n", s["quarantined"].get<unsigned long long>(),
              s["temp_files"].get<unsigned long long>(), s["writable"].get<bool>() ? "yes" : "no");
  const json& r = s["remote"];
  if (r.is_null()) {
    std::printf("remote    none (KILN_REMOTE_CACHE is not set)\n");
  } else if (!r["reachable"].get<bool>()) {
    std::printf("remote    %s: unreachable: %s\n", r["endpoint"].get<std::string>().c_str(), r["problem"].get<std::string>().c_str());
  } else {
    const json& c = r["counters"];
    const auto n = [&](const char* name) { return c[name].get<unsigned long long>(); };
    std::printf("remote    %s: %llu entries, %llu locks held\n", r["endpoint"].get<std::string>().c_str(),
                r["entries"].get<unsigned long long>(), r["locks"].get<unsigned long long>());
    std::printf("remote    fleet counters: %llu hits, %llu misses, %llu uploads, %llu rejected, %llu lock waits (%llu timed "
                "out), %llu errors\n",
                n("hits"), n("misses"), n("uploads"), n("rejected"), n("lock_waits"), n("wait_timeouts"), n("errors"));
  }
  return 0;
}

int main_impl(int argc, char** argv) {
  register_builtin_families();
  CLI::App app{"kiln: runtime JIT compilation service for specialised CUDA kernels"};
  app.require_subcommand(1);
  CommonOptions common;
  const auto add_common = [&](CLI::App* sub) {
    sub->add_option("--cache", common.cache_dir, "writable cache directory (default: $KILN_CACHE_DIR, ~/.cache/kiln)");
    sub->add_flag("--json", common.json, "print one JSON object on stdout");
  };

  std::string manifest;
  std::optional<std::string> archs;
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* prebuild = app.add_subcommand("prebuild", "compile every key of a manifest into the cache (no GPU needed)");
  prebuild->add_option("--manifest", manifest, "manifest JSON (default: the embedded default manifest)");
  prebuild->add_option("--arch", archs, "comma-separated targets (e.g. sm_90a,sm_120a): only the manifest entries that allow one of them are compiled (an entry without archs allows every arch); the others are reported as skipped");
  prebuild->add_option("-j,--jobs", jobs, "parallel compiles");
  bool push = false;
  prebuild->add_flag("--push", push, "also upload every key to the remote cache (KILN_REMOTE_CACHE); fails if it cannot");
  add_common(prebuild);

  std::vector<int> devices;
  auto* warm = app.add_subcommand("warm", "load every key of a manifest onto the GPUs (compiles only on a miss)");
  warm->add_option("--manifest", manifest, "manifest JSON (default: the embedded default manifest)");
  warm->add_option("--device", devices, "device ordinals (default: all)");
  add_common(warm);

  auto* ls = app.add_subcommand("ls", "list cache entries of every layer");
  add_common(ls);
  std::string key_text;
  auto* inspect = app.add_subcommand("inspect", "show one entry's metadata (semantic key or 32-hex cache key)");
  inspect->add_option("KEY", key_text)->required();
  add_common(inspect);
  auto* verify = app.add_subcommand("verify", "re-checksum every entry; quarantine bad ones; exit 1 if any");
  add_common(verify);
  long long max_bytes = -1;
  auto* prune = app.add_subcommand("prune", "shrink the writable layer to --max-bytes (LRU); read-only layers untouched");
  prune->add_option("--max-bytes", max_bytes)->required();
  add_common(prune);
  auto* stats = app.add_subcommand("stats", "entries and bytes per layer; the remote tier's entries and fleet counters");
  add_common(stats);

  BenchOptions bench_options;
  auto* bench = app.add_subcommand("bench", "measure on this machine: jit (compile/warm/lookup/launch), mla, sparse, sparse_dsv41, writer (kernels, GPU)");
  bench->add_option("WHAT", bench_options.what, "jit, mla, sparse, sparse_dsv41 or writer")->required();
  bench->add_option("--out", bench_options.out, "write the JSON report to this file");
  bench->add_flag("--quick", bench_options.quick, "mla/sparse/sparse_dsv41/writer: a small smoke subset");
  bench->add_option("--only", bench_options.only,
                    "sparse, sparse_dsv41: only the config of this name, e.g. \"T=64 H=128 topk=2048\" (for profilers); mla: only "
                    "this group (grid, mixed, fp8, packed, page, kernel) or config name");
  bench->add_option("--splits", bench_options.splits,
                    "sparse with --only: time that config at this split count instead of the planner's (for tuning the planner)");
  bench->add_option("--fleet", bench_options.fleet,
                    "jit with KILN_REMOTE_CACHE: processes of the fleet start, without and with the remote tier (0: skip)");
  bench->add_option("--manifest", bench_options.manifest, "jit: the manifest of the per-family cold compiles, the whole-manifest prebuild and the fleet start (default: the embedded default)");
  add_common(bench);

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) known |= sub->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr, "kiln: unknown command '%s'; expected prebuild, warm, ls, inspect, verify, prune, stats or bench (see kiln --help)\n", argv[1]);
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kiln: %s (see kiln --help)\n", e.what());
    return kExitBadInput;
  }

  try {
    if (*prebuild) return run_prebuild(common, manifest, archs, jobs, push);
    if (*warm) return run_warm(common, manifest, devices);
    if (*ls) return run_ls(common);
    if (*inspect) return run_inspect(common, key_text);
    if (*verify) return run_verify(common);
    if (*prune) return run_prune(common, max_bytes);
    if (*stats) return run_stats(common);
    if (*bench) {
#if KILN_BENCH
      bench_options.cache_dir = common.cache_dir;
      if (bench_options.what == "mla") return run_bench_mla(bench_options);
      if (bench_options.what == "sparse") return run_bench_sparse(bench_options);
      if (bench_options.what == "sparse_dsv41") return run_bench_sparse_dsv41(bench_options);
      if (bench_options.what == "writer") return run_bench_writer(bench_options);
      return run_bench(bench_options);
#else
      throw Error(ErrorCode::kUnsupported,
                  "kiln bench: this kiln was configured with -DKILN_BENCH=OFF; reconfigure with -DKILN_BENCH=ON to build it");
#endif
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    const ErrorCode c = e.code();
    return c == ErrorCode::kInvalidArgument || c == ErrorCode::kNotFound || c == ErrorCode::kUnsupported ? kExitBadInput : 1;
  }
  return kExitBadInput;
}

}  // namespace
}  // namespace kiln::tools

int main(int argc, char** argv) { return kiln::tools::main_impl(argc, argv); }
