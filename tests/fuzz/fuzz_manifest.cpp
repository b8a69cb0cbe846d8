// libFuzzer target: the manifest parser (parse_manifest).
// The properties live in fuzz_checks.cpp, shared with the regression unit test.
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kiln::fuzz::check_manifest_input(data, size);
  return 0;
}
