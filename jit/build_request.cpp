#include "kiln/jit/build_request.h"

#include "kiln/jit/compiler.h"
#include "kiln/jit/family.h"
#include "kiln/jit/template_bundle.h"

namespace kiln {

BuildRequest make_build_request(const SemanticKey& key) {
  KernelSource source = find_family(key.family()).render(key.policy());
  const std::vector<std::string> options = Compiler::canonical_options(key.arch());
  const NvrtcVersion nvrtc = Compiler::nvrtc_version();
  const CacheKey cache_key = compute_cache_key({.source = source.source,
                                                .name_expressions = source.name_expressions,
                                                .template_bundle = template_bundle_bytes(),
                                                .nvrtc_major = nvrtc.major,
                                                .nvrtc_minor = nvrtc.minor,
                                                .options = options,
                                                .arch = key.arch()});
  return BuildRequest{key, std::move(source), options, cache_key};
}

}  // namespace kiln
