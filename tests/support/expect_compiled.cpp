#include "tests/support/expect_compiled.h"

#include <catch2/catch.hpp>

#include "kiln/jit/error.h"

namespace kiln::testing {

nlohmann::json expect_compiled(KernelService& service, const SemanticKey& key) {
  Artifact artifact;
  try {
    artifact = service.build(key);
  } catch (const Error& e) {
    FAIL(e.what() << "\n" << e.details().log);
  }
  REQUIRE(artifact.entry != nullptr);
  CHECK(artifact.source == ArtifactSource::kCompiled);
  CHECK(artifact.entry->cubin.size() > 1000);
  CHECK(artifact.entry->semantic_key == key.str());
  return artifact.entry->metadata.at("lowered_names");
}

}  // namespace kiln::testing
