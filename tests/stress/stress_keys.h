#pragma once
// The key set of the kill stress test: every nvfp4_writer policy op x page_size for two archs
// (12 keys). Page sizes differ from the default manifest's on purpose, so nothing else warms them.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jit/semantic_key.h"

namespace kiln::stress {

inline std::vector<SemanticKey> stress_keys() {
  std::vector<SemanticKey> keys;
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    for (const char* op : {"pack", "append"}) {
      for (int page_size : {16, 48, 96}) {
        keys.emplace_back("nvfp4_writer", nlohmann::json{{"op", op}, {"page_size", page_size}}, arch);
      }
    }
  }
  return keys;
}

}  // namespace kiln::stress
