#pragma once
// The cache operations that both interfaces offer (the kiln CLI and the Python package), with
// their JSON reports, so the two print and return the same thing.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/manifest.h"

namespace kiln::tools {

// The keys of a manifest file, or of the embedded default manifest when `manifest` is empty;
// `archs` (comma-separated) selects targets: only the entries that allow one of them are compiled,
// for those of them they allow (select_manifest), and the others are listed as skipped. The keys'
// companions (Family::companions: the modules their launches also run) follow them, once each.
ManifestSelection manifest_selection(const std::string& manifest, const std::optional<std::string>& archs);
std::vector<SemanticKey> manifest_keys(const std::string& manifest, const std::optional<std::string>& archs);

struct PrebuildOutcome {
  std::string status;        // compiled | hit | failed
  std::string detail;        // where the hit came from, or the error
  std::string pushed;        // with push: uploaded | present | failed
  std::string push_problem;  // why the push failed
  std::string shares;        // a key of this run whose module this key's is (one compile for both), or empty
  double ms = 0;
};

// Builds every key into `service`'s cache on `jobs` threads, in a per-process random order (so that
// processes prebuilding one manifest together compile different keys first), keys that share another
// key's cache entry after all the others. With `push`, also
// uploads each key to the service's remote tier (which it must have). `progress` (optional) is
// called under a lock after each key with (done, total, key, outcome). A cache root that cannot be
// opened for writing is Error(kCacheIo) before anything is compiled.
std::vector<PrebuildOutcome> prebuild(
    KernelService& service, const std::vector<SemanticKey>& keys, int jobs,
    const std::function<void(std::size_t, std::size_t, const SemanticKey&, const PrebuildOutcome&)>& progress = {},
    bool push = false);

// Warms each key on every device of `devices` whose arch it targets, one device at a time (its keys over
// the service's thread pool); returns how many keys each device warmed, in the order of `devices`.
// `progress` as KernelService::warm's. Throws the first failure after a device's keys all finish.
std::vector<std::size_t> warm_on_devices(KernelService& service, const std::vector<SemanticKey>& keys,
                                         const std::vector<int>& devices, const KernelService::WarmProgress& progress = {});

// "[done/total] warm|failed key on device D (ms)" on stderr, and the error under a failed one: what
// `kiln warm` prints (a `progress` for warm_on_devices()).
void print_warm_progress(std::size_t done, std::size_t total, const SemanticKey& key, int device, double ms,
                         const std::string& problem);

// One progress line per finished key on stderr, "[done/total] outcome key (source, ms)", and the
// error under a failed one: what `kiln prebuild` prints (a `progress` for prebuild()).
void print_prebuild_progress(std::size_t done, std::size_t total, const SemanticKey& key, const PrebuildOutcome& out);

// The report of a prebuild of `selection.keys` (outcomes parallel to them):
// {"keys": [{"key", "outcome", "ms"[, "source"][, "error"][, "pushed"[, "push_error"]]}], "companions",
//  "compiled", "hits", "remote_hits", "failed", "skipped": [{"entry", "family", "archs", "keys"}],
//  "skipped_keys", "wall_ms", "jobs", "cache_dir", "writable"[, "remote": counters]
//  [, "push": {"uploaded", "present", "failed"}]}
nlohmann::json prebuild_report(KernelService& service, const ManifestSelection& selection,
                               const std::vector<PrebuildOutcome>& outcomes, double wall_ms, int jobs, bool push = false);

// {"layers": [{"root", "layer", "present", "entries", "bytes"}], "quarantined", "temp_files", "writable",
//  "remote": null or {"endpoint", "reachable"[, "problem"], "entries", "locks", "counters"}}
// The remote counters are the fleet's: every process adds its own to a hash in Redis.
nlohmann::json store_stats(KernelService& service);

}  // namespace kiln::tools
