#pragma once
// Everything needed to compile one semantic key, and the content address of the result.
#include <string>
#include <vector>

#include "kiln/jit/cache_key.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/jit/semantic_key.h"

namespace kiln {

struct BuildRequest {
  SemanticKey key;
  KernelSource source;
  std::vector<std::string> options;  // canonical options, arch excluded
  CacheKey cache_key;
};

BuildRequest make_build_request(const SemanticKey& key);

}  // namespace kiln
