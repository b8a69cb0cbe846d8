#pragma once
// A kernel family as the JIT sees it: a policy schema (validate + canonicalise) and a renderer.
// The engine knows nothing else about a family; planners and launchers live in runtime/.
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/kernel_source.h"
#include "kiln/jit/semantic_key.h"

namespace kiln {

class Family {
 public:
  virtual ~Family() = default;

  virtual std::string_view name() const = 0;

  // Validates a policy (a flat JSON object of ints, bools and short strings), fills defaults and
  // returns it with sorted keys. Throws Error(kInvalidArgument) naming the field.
  virtual nlohmann::json canonicalize(const nlohmann::json& policy) const = 0;

  // Renders the source for a canonical policy (no validation: canonicalize ran first).
  virtual KernelSource render(const nlohmann::json& canonical_policy) const = 0;

  // Keys of other families whose modules this key's launches also run, for the same arch: a kernel
  // that depends on fewer policy fields than the key's own (a split decode's combine) is a module of
  // its own, compiled once for every key that shares it. Warmed with the key; none by default.
  virtual std::vector<SemanticKey> companions(const nlohmann::json& canonical_policy, std::string_view arch) const {
    (void)canonical_policy;
    (void)arch;
    return {};
  }
};

// The companions of `key` (its family's rule, on the key's arch).
std::vector<SemanticKey> companion_keys(const SemanticKey& key);

// JSON for error messages: never throws (invalid UTF-8 in user input is replaced, not rethrown).
std::string json_text(const nlohmann::json& value);

// Families register once at start-up (explicit calls, not static initialisers, which static linking drops).
void register_family(std::unique_ptr<Family> family);
const Family& find_family(std::string_view name);  // throws Error(kInvalidArgument) listing known names

}  // namespace kiln
