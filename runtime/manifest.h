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

// An entry that allows none of the requested archs (kiln prebuild --arch): reported, not compiled.
struct SkippedEntry {
  std::string entry;               // "keys[3]" or "policies[2]"
  std::string family;
  std::vector<std::string> archs;  // the archs the entry allows
  std::size_t keys = 0;            // keys it names per arch (the policy's combinations; 1 for a key)
};

struct ManifestSelection {
  std::vector<SemanticKey> keys;
  std::vector<SkippedEntry> skipped;
  std::size_t companions = 0;  // the last `companions` keys are companions of the others (kiln prebuild adds them)
};

// Parses manifest text. `source_name` is used in errors, which give line and column.
// `only_archs`, when set (kiln prebuild --arch), selects targets instead of the manifest's top-level
// list: a policy entry with its own archs gets those of them that are requested, a policy entry
// without archs allows every arch and gets all of them, a key allows its own arch only. An entry
// left with none is skipped, so that no key is compiled for a target its entry does not name.
ManifestSelection select_manifest(std::string_view text, std::string_view source_name,
                                  const std::optional<std::vector<std::string>>& only_archs = std::nullopt);

// The keys of select_manifest, without the skipped entries.
std::vector<SemanticKey> parse_manifest(std::string_view text, std::string_view source_name,
                                        const std::optional<std::vector<std::string>>& only_archs = std::nullopt);

ManifestSelection select_manifest_file(const std::filesystem::path& file,
                                       const std::optional<std::vector<std::string>>& only_archs = std::nullopt);
std::vector<SemanticKey> load_manifest(const std::filesystem::path& file,
                                       const std::optional<std::vector<std::string>>& only_archs = std::nullopt);

// Adds `key` to the manifest file (created if missing) under a file lock, atomically (temp + rename).
void append_to_manifest(const std::filesystem::path& file, const SemanticKey& key);

}  // namespace kiln
