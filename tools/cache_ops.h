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

namespace kiln::tools {

// The keys of a manifest file, or of the embedded default manifest when `manifest` is empty;
// `archs` (comma-separated) replaces the manifest's targets.
std::vector<SemanticKey> manifest_keys(const std::string& manifest, const std::optional<std::string>& archs);

struct PrebuildOutcome {
  std::string status;  // compiled | hit | failed
  std::string detail;  // where the hit came from, or the error
  double ms = 0;
};

// Builds every key into `service`'s cache on `jobs` threads. `progress` (optional) is called under
// a lock after each key with (done, total, key, outcome).
std::vector<PrebuildOutcome> prebuild(
    KernelService& service, const std::vector<SemanticKey>& keys, int jobs,
    const std::function<void(std::size_t, std::size_t, const SemanticKey&, const PrebuildOutcome&)>& progress = {});

// {"keys": [{"key", "outcome", "ms"[, "error"]}], "compiled", "hits", "failed", "wall_ms", "jobs",
//  "cache_dir", "writable"}
nlohmann::json prebuild_report(KernelService& service, const std::vector<SemanticKey>& keys,
                               const std::vector<PrebuildOutcome>& outcomes, double wall_ms, int jobs);

// {"layers": [{"root", "layer", "present", "entries", "bytes"}], "quarantined", "temp_files", "writable"}
nlohmann::json store_stats(KernelService& service);

}  // namespace kiln::tools
