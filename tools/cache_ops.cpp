#include "tools/cache_ops.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "kiln/jit/arch.h"
#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/runtime/manifest.h"
#include "kiln/runtime/worker_threads.h"
#include "tools/default_manifest.h"

namespace kiln::tools {

using nlohmann::json;

namespace {

// The companions of `keys` (Family::companions) that are not among them, appended once each: a
// prebuilt cache must hold every module a launch of its keys runs. Returns how many.
std::size_t add_companions(std::vector<SemanticKey>& keys) {
  std::set<std::string> seen;
  for (const SemanticKey& k : keys) seen.insert(k.str());
  const std::size_t named = keys.size();
  for (std::size_t i = 0; i < named; ++i) {
    for (SemanticKey& c : companion_keys(keys[i])) {
      if (seen.insert(c.str()).second) keys.push_back(std::move(c));
    }
  }
  return keys.size() - named;
}

}  // namespace

ManifestSelection manifest_selection(const std::string& manifest, const std::optional<std::string>& archs) {
  std::optional<std::vector<std::string>> only_archs;
  if (archs) only_archs = parse_arch_list(*archs);  // an empty --arch is an error, not "all"
  ManifestSelection selection = manifest.empty() ? select_manifest(default_manifest(), "(embedded default)", only_archs)
                                                 : select_manifest_file(manifest, only_archs);
  selection.companions = add_companions(selection.keys);
  return selection;
}

std::vector<SemanticKey> manifest_keys(const std::string& manifest, const std::optional<std::string>& archs) {
  return manifest_selection(manifest, archs).keys;
}

std::vector<PrebuildOutcome> prebuild(
    KernelService& service, const std::vector<SemanticKey>& keys, int jobs,
    const std::function<void(std::size_t, std::size_t, const SemanticKey&, const PrebuildOutcome&)>& progress, bool push) {
  if (jobs < 1) throw Error(ErrorCode::kInvalidArgument, fmt::format("jobs must be >= 1, got {}", jobs));
  RemoteStore* remote = service.remote();
  if (push && remote == nullptr) throw Error(ErrorCode::kInvalidArgument, "push needs a remote cache (KILN_REMOTE_CACHE)");
  // A prebuild's only product is the cache: compiling into memory that is dropped at exit would report
  // success for nothing. (A root that stops taking entries later shows as "writable": false.)
  if (const std::string& why = service.store().open_failure(); !why.empty()) {
    const std::string dir = service.config().cache_dir.string();
    throw Error(ErrorCode::kCacheIo,
                fmt::format("prebuild needs a writable cache directory and {} is not one ({}); pass another one "
                            "(kiln prebuild --cache DIR, kiln.prebuild(cache_dir=DIR)) or set KILN_CACHE_DIR",
                            dir, why),
                {.path = dir});
  }
  std::vector<PrebuildOutcome> outcomes(keys.size());
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::minstd_rand(static_cast<unsigned>(::getpid())));
  // Keys that render the same kernel share one cache entry: the first of each compiles it, and the
  // others go last, so that no worker sits waiting on the entry's lock while another compiles it.
  {
    std::map<std::string, std::size_t> first_of;  // cache key -> the key that builds it
    std::vector<std::size_t> firsts, repeats;
    for (const std::size_t i : order) {
      std::string cache_key;
      try {
        cache_key = make_build_request(keys[i]).cache_key.hex();
      } catch (const Error&) {
        cache_key = keys[i].str();  // the build reports the problem
      }
      const auto [it, added] = first_of.emplace(cache_key, i);
      if (added) {
        firsts.push_back(i);
      } else {
        outcomes[i].shares = keys[it->second].str();
        repeats.push_back(i);
      }
    }
    firsts.insert(firsts.end(), repeats.begin(), repeats.end());
    order = std::move(firsts);
  }
  std::size_t done = 0;
  std::mutex progress_mutex;
  run_items(keys.size(), static_cast<std::size_t>(jobs), [&](std::size_t n) {
    const std::size_t i = order[n];
    const auto start = std::chrono::steady_clock::now();
    PrebuildOutcome& out = outcomes[i];
    try {
      const Artifact a = service.build(keys[i]);
      out.status = a.source == ArtifactSource::kCompiled ? "compiled" : "hit";
      out.detail = std::string(artifact_source_name(a.source));
      if (push) {
        switch (remote->push(*a.entry, &out.push_problem)) {
          case RemoteStore::PushResult::kUploaded: out.pushed = "uploaded"; break;
          case RemoteStore::PushResult::kPresent: out.pushed = "present"; break;
          case RemoteStore::PushResult::kFailed: out.pushed = "failed"; break;
        }
      }
    } catch (const std::exception& e) {  // kiln::Error, or e.g. bad_alloc: the key fails, not the process
      out.status = "failed";
      out.detail = e.what();
    }
    out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(progress_mutex);
    ++done;
    if (progress) progress(done, keys.size(), keys[i], out);
  });
  return outcomes;
}

std::vector<std::size_t> warm_on_devices(KernelService& service, const std::vector<SemanticKey>& keys,
                                         const std::vector<int>& devices, const KernelService::WarmProgress& progress) {
  std::vector<std::size_t> warmed;
  for (int device : devices) {
    const std::string& arch = service.device_arch(device);
    std::vector<SemanticKey> mine;
    for (const SemanticKey& k : keys) {
      if (k.arch() == arch) mine.push_back(k);
    }
    service.warm(mine, {device}, progress);
    warmed.push_back(mine.size());
  }
  return warmed;
}

void print_warm_progress(std::size_t done, std::size_t total, const SemanticKey& key, int device, double ms,
                         const std::string& problem) {
  std::fprintf(stderr, "[%zu/%zu] %-6s %s on device %d (%.0f ms)\n", done, total, problem.empty() ? "warm" : "failed",
               key.str().c_str(), device, ms);
  if (!problem.empty()) std::fprintf(stderr, "    %s\n", problem.c_str());
}

void print_prebuild_progress(std::size_t done, std::size_t total, const SemanticKey& key, const PrebuildOutcome& out) {
  std::fprintf(stderr, "[%zu/%zu] %-8s %s (%s%s%s%s, %.0f ms)\n", done, total, out.status.c_str(), key.str().c_str(),
               out.status == "failed" ? "error" : out.detail.c_str(), out.shares.empty() ? "" : ", a shared module",
               out.pushed.empty() ? "" : ", push ", out.pushed.c_str(), out.ms);
  if (out.status == "failed") std::fprintf(stderr, "    %s\n", out.detail.c_str());
  if (out.pushed == "failed") std::fprintf(stderr, "    push failed: %s\n", out.push_problem.c_str());
}

json prebuild_report(KernelService& service, const ManifestSelection& selection,
                     const std::vector<PrebuildOutcome>& outcomes, double wall_ms, int jobs, bool push) {
  const std::vector<SemanticKey>& keys = selection.keys;
  std::size_t compiled = 0, hits = 0, failed = 0, remote_hits = 0, uploaded = 0, present = 0, push_failed = 0, modules = 0;
  json list = json::array();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const PrebuildOutcome& o = outcomes[i];
    compiled += o.status == "compiled";
    hits += o.status == "hit";
    failed += o.status == "failed";
    remote_hits += o.status == "hit" && o.detail == artifact_source_name(ArtifactSource::kRemote);
    modules += o.shares.empty();
    json item = {{"key", keys[i].str()}, {"outcome", o.status}, {"ms", o.ms}};
    if (o.status == "failed") item["error"] = o.detail;
    else item["source"] = o.detail;
    if (!o.shares.empty()) item["shares"] = o.shares;
    if (push) {
      item["pushed"] = o.pushed;
      if (o.pushed == "failed") item["push_error"] = o.push_problem;
      uploaded += o.pushed == "uploaded";
      present += o.pushed == "present";
      push_failed += o.pushed == "failed";
    }
    list.push_back(item);
  }
  json skipped_list = json::array();
  std::size_t skipped_keys = 0;
  for (const SkippedEntry& s : selection.skipped) {
    skipped_list.push_back({{"entry", s.entry}, {"family", s.family}, {"archs", s.archs}, {"keys", s.keys}});
    skipped_keys += s.keys;
  }
  json report = {{"keys", list},
                 {"companions", selection.companions},
                 {"modules", modules},
                 {"compiled", compiled},
                 {"hits", hits},
                 {"remote_hits", remote_hits},
                 {"failed", failed},
                 {"skipped", skipped_list},
                 {"skipped_keys", skipped_keys},
                 {"wall_ms", wall_ms},
                 {"jobs", jobs},
                 {"cache_dir", service.config().cache_dir.string()},
                 {"writable", service.store().writable()}};
  if (RemoteStore* remote = service.remote()) report["remote"] = remote->counters().to_json();
  if (push) report["push"] = {{"uploaded", uploaded}, {"present", present}, {"failed", push_failed}};
  return report;
}

json store_stats(KernelService& service) {
  const StoreStats s = service.store().stats();
  json layers = json::array();
  for (const LayerStats& l : s.layers) {
    layers.push_back({{"root", l.root.string()}, {"layer", tier_name(l.tier)}, {"present", l.present}, {"entries", l.entries}, {"bytes", l.bytes}});
  }
  json out = {{"layers", layers}, {"quarantined", s.quarantined}, {"temp_files", s.temp_files}, {"writable", s.writable}};
  RemoteStore* remote = service.remote();
  out["remote"] = remote ? remote->fleet_stats().to_json() : json(nullptr);
  return out;
}

}  // namespace kiln::tools
