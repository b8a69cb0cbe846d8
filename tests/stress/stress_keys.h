#pragma once
// The key set of the kill stress test: every nvfp4_writer policy op x page_size for two archs
// (indices 0-11, the cheap keys the read-only and full-disk phases use), then one mla_decode and one
// sparse_nvfp4 key per arch (12-15: compiles of 1-3 s, so kills land inside them). Page sizes and
// policies differ from the default manifest's on purpose, so nothing else warms them.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/sparse_nvfp4/family.h"

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
  using mla::MaskType;
  using mla::MlaDecodePolicy;
  using sparse::SparsePolicy;
  keys.push_back(MlaDecodePolicy{16, 32, 8192, 1, false, DType::kBf16, DType::kBf16, MaskType::kDense}.key("sm_90a"));
  keys.push_back(MlaDecodePolicy{8, 16, 4096, 2, true, DType::kE4m3, DType::kBf16, MaskType::kCausal}.key("sm_120a"));
  keys.push_back(SparsePolicy{8, 1, false, true}.key("sm_90a"));
  keys.push_back(SparsePolicy{32, 2, true, false}.key("sm_120a"));
  return keys;
}

}  // namespace kiln::stress
