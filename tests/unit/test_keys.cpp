#include <catch2/catch.hpp>

#include "jit/error.h"
#include "jit/semantic_key.h"

TEST_CASE("placeholder keys", "[unit]") {
  const kiln::SemanticKey k("nvfp4_writer", {{"op", "pack"}, {"page_size", 64}}, "sm_90a");
  CHECK(kiln::SemanticKey::parse(k.str()) == k);
}
