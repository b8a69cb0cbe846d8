// libFuzzer target: the semantic-key parser (SemanticKey::parse).
// The properties live in fuzz_checks.cpp, shared with the regression unit test.
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kiln::fuzz::check_semantic_key_input(data, size);
  return 0;
}
