#pragma once
// The keys of the fleet test: 16 NVFP4 writer keys (two ops x four page sizes x two archs), cheap
// to compile (~0.2 s each here), with page sizes no other test or manifest uses.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/jit/semantic_key.h"

namespace kiln::fleet {

inline std::vector<SemanticKey> fleet_keys() {
  std::vector<SemanticKey> keys;
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    for (const char* op : {"pack", "append"}) {
      for (int page_size : {3, 5, 11, 13}) {
        keys.emplace_back("nvfp4_writer", nlohmann::json{{"op", op}, {"page_size", page_size}}, arch);
      }
    }
  }
  return keys;
}

}  // namespace kiln::fleet
