#pragma once
// The remote tier's part of `kiln bench jit` (needs KILN_REMOTE_CACHE; no GPU).
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/cache/remote_store.h"
#include "kiln/jit/semantic_key.h"

namespace kiln::tools {

// Per-key warm from the remote tier beside the local figures (the entries of `keys` compiled into
// `compiled_dir` are uploaded under a private prefix first), then, when fleet_processes > 0, a
// fleet start: that many `kiln prebuild -j 1` processes over `manifest` (empty: the embedded
// default) at once, each with its own cache directory, without and with the remote tier. Every key
// it wrote to Redis is deleted afterwards.
nlohmann::json bench_remote(const RemoteOptions& configured, const std::filesystem::path& base,
                            const std::filesystem::path& compiled_dir, const std::vector<SemanticKey>& keys, bool gpu,
                            int fleet_processes, const std::string& manifest);

}  // namespace kiln::tools
