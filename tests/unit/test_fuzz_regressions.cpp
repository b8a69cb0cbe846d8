// Replays every committed fuzz input (seed corpora and saved crash inputs under tests/fuzz/) through
// the same property checks the libFuzzer targets run, so a fixed parser bug stays fixed in the
// ordinary unit suite, without clang or libFuzzer. Each bug the fuzzers found also has a named
// test below that states the expected behaviour in plain terms.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
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

// Current virtual size, so the child's address-space limit is "what it has + a budget" (ASan
// and TSan reserve terabytes of shadow up front; a fixed limit would stop them from starting).
rlim_t virtual_size_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long pages = 0;
  if (f) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
}

// Runs check(input) in a child process with 1 GiB more address space and 60 s of time, so an
// input that once blew up memory or looped fails this test instead of the machine.
// Returns "" when the check passed, else what happened.
template <typename Check>
std::string run_isolated(Check check, const std::string& bytes) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlim_t limit = virtual_size_bytes() + (rlim_t{1} << 30);
    const rlimit as{limit, limit};
    ::setrlimit(RLIMIT_AS, &as);
    ::alarm(60);
    try {
      check(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::bad_alloc&) {
      ::_exit(3);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      ::_exit(2);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case 0: return "";
      case 3: return "std::bad_alloc: the input exhausted 1 GiB of memory";
      case 2: return "a property was violated or an unexpected exception escaped (see stderr)";
      default: return "exit status " + std::to_string(WEXITSTATUS(status)) + " (a sanitizer report? see stderr)";
    }
  }
  if (WIFSIGNALED(status)) {
    return WTERMSIG(status) == SIGALRM ? std::string("did not finish in 60 s")
                                       : "killed by signal " + std::to_string(WTERMSIG(status));
  }
  return "unknown status";
}

template <typename Check>
void replay(const std::string& target, Check check) {
  const auto files = inputs_of(target);
  REQUIRE(files.size() >= 3);  // the seed corpus is committed; an empty list means a wrong path
  for (const auto& f : files) {
    INFO("input " << f.string());
    CHECK(run_isolated(check, read_bytes(f)) == "");
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

// Found by reasoning about expand() and confirmed by the manifest fuzzer: a 341-byte manifest whose
// policy has seven list fields of ten values expands to 10^7 policies in memory before any field
// is validated -> std::bad_alloc (uncaught: kiln prebuild aborts) or the OOM killer. It must be a
// plain kInvalidArgument naming the policy, found before anything large is allocated.
TEST_CASE("fuzz regressions: a manifest policy that expands to millions of keys is rejected, not allocated",
          "[unit][fuzz]") {
  const std::string bomb = read_bytes(fuzz_dir() / "regressions" / "manifest" / "cartesian_bomb.json");
  REQUIRE(bomb.size() > 300);
  const auto expect_invalid_argument = [](const std::uint8_t* data, std::size_t size) {
    kiln::register_builtin_families();
    try {
      kiln::parse_manifest(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), "bomb");
    } catch (const kiln::Error& e) {
      if (e.code() == kiln::ErrorCode::kInvalidArgument) return;
      throw;
    }
    throw std::logic_error("the manifest was accepted");
  };
  CHECK(run_isolated(expect_invalid_argument, bomb) == "");
}

// Found by fuzz_manifest: nlohmann::json::parse throws json::out_of_range (406, "number overflow")
// for a number like 1e999, and parse_manifest caught only json::parse_error, so the exception
// escaped as a non-kiln error (kiln prebuild --manifest died with std::terminate).
TEST_CASE("fuzz regressions: a manifest with an out-of-range number is invalid_argument, not a crash", "[unit][fuzz]") {
  kiln::register_builtin_families();
  for (const char* text : {R"({"archs": ["sm_90a"], "version": 1e999})", "776e66666666666666666666666", "-1e400"}) {
    INFO(text);
    try {
      kiln::parse_manifest(text, "overflow.json");
      FAIL("accepted");
    } catch (const kiln::Error& e) {
      CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find("overflow.json") != std::string::npos);
    } catch (const std::exception& e) {
      FAIL(std::string("a non-kiln exception escaped: ") + e.what());
    }
  }
}

// Found by fuzz_semantic_key: a printable key whose field value holds a byte that is not UTF-8
// (here 0xB9) reached the family's validation, whose error message dumps the value with
// nlohmann::json::dump(), which throws json::type_error 316 on invalid UTF-8: `kiln inspect` with
// such an argument died with std::terminate instead of printing one line and exiting 2.
TEST_CASE("fuzz regressions: a semantic key with non-UTF-8 bytes is invalid_argument, not a crash", "[unit][fuzz]") {
  kiln::register_builtin_families();
  for (const std::string name : {"non_utf8_value", "non_utf8_op"}) {
    INFO(name);
    const std::string text = read_bytes(fuzz_dir() / "regressions" / "semantic_key" / name);
    REQUIRE(!text.empty());
    try {
      kiln::SemanticKey::parse(text);
      FAIL("accepted");
    } catch (const kiln::Error& e) {
      CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
    } catch (const std::exception& e) {
      FAIL(std::string("a non-kiln exception escaped: ") + e.what());
    }
  }
}

// Found by fuzz_semantic_key: a well-formed MLA key with page_size 126 fails the family's rule,
// which is `unsupported` (a value kiln does not implement), not `invalid_argument`; the parser's
// message wrapped the rule's whole what(), so "kiln [unsupported]: " appeared twice.
TEST_CASE("fuzz regressions: a key with an unimplemented page size is unsupported, said once", "[unit][fuzz]") {
  kiln::register_builtin_families();
  const std::string text = read_bytes(fuzz_dir() / "regressions" / "semantic_key" / "unsupported_page_size");
  REQUIRE(!text.empty());
  try {
    kiln::SemanticKey::parse(text);
    FAIL("accepted");
  } catch (const kiln::Error& e) {
    const std::string what = e.what();
    CHECK(e.code() == kiln::ErrorCode::kUnsupported);
    CHECK(what.find("page_size") != std::string::npos);
    CHECK(what.find("kiln [") == what.rfind("kiln ["));
  }
}
