#pragma once
// A manifest names the semantic keys a server will ask for, so a GPU-less machine can prebuild them.
//
// {
//   "archs": ["sm_90a", "sm_120a"],                       // targets for entries that name none
//   "keys": ["nvfp4_writer:sm_90a:op=pack,page_size=64:..."],
//   "policies": [{"family": "nvfp4_writer", "archs": [...],  // archs optional
//                 "policy": {"op": ["pack", "append"], "page_size": [32, 64]}}]  // lists expand
// }
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/semantic_key.h"

namespace kiln {

// Parses manifest text. `source_name` is used in errors, which give line and column.
// `arch_override`, when set, replaces every entry's targets (kiln prebuild --arch).
std::vector<SemanticKey> parse_manifest(std::string_view text, std::string_view source_name,
                                        const std::optional<std::vector<std::string>>& arch_override = std::nullopt);

std::vector<SemanticKey> load_manifest(const std::filesystem::path& file,
                                       const std::optional<std::vector<std::string>>& arch_override = std::nullopt);

// Adds `key` to the manifest file (created if missing) under a file lock, atomically (temp + rename).
void append_to_manifest(const std::filesystem::path& file, const SemanticKey& key);

}  // namespace kiln
