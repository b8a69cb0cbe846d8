// libFuzzer target: the cache entry parser (decode_entry, decode_entry_header).
// The properties live in fuzz_checks.cpp, shared with the regression unit test.
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kiln::fuzz::check_entry_input(data, size);
  return 0;
}
