// The real `kiln` CLI as a subprocess: bad input gives one clear line on stderr and exit code 2;
// maintenance commands work on an empty cache. No compiling here (that is the nvrtc suite's job).
//
// The binary comes from kiln::testing::kiln_cli_path().
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using nlohmann::json;
using CliResult = kiln::testing::ProcessResult;

namespace {

struct TempDir : kiln::testing::TempDir {
  TempDir() : kiln::testing::TempDir("kiln_cli_test") {}
};

// Runs kiln with `args` (KILN_CACHE_DIR: `scratch`/env_cache); stdout and stderr go to files in `scratch`.
CliResult run_cli(const std::vector<std::string>& args, const TempDir& scratch) {
  REQUIRE(fs::exists(kiln::testing::kiln_cli_path()));
  return kiln::testing::Subprocess(kiln::testing::kiln_cli(args, kiln::testing::kiln_cli_environment(scratch.path()), scratch.path()))
      .wait();
}

// Bad input: exit code 2, nothing on stdout, exactly one non-empty line on stderr containing every
// fragment.
void expect_bad_input(const CliResult& r, const std::vector<std::string>& fragments) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK((!r.err.empty() && r.err.back() == '\n'));
  CHECK(r.err.size() > 20);  // a sentence, not a code
  for (const auto& f : fragments) CHECK_THAT(r.err, Contains(f));
}

}  // namespace

TEST_CASE("cli: unknown subcommand is bad input", "[unit]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  expect_bad_input(run_cli({"frobnicate", "--cache", cache.string()}, dir), {"unknown command 'frobnicate'", "kiln --help"});
  expect_bad_input(run_cli({}, dir), {"subcommand"});
  expect_bad_input(run_cli({"ls", "--no-such-flag", "--cache", cache.string()}, dir), {"--no-such-flag"});
  CHECK_FALSE(fs::exists(cache));  // rejected before anything touched the cache
}

TEST_CASE("cli: bench of an unknown benchmark, or in a build without bench, is bad input naming the fix", "[unit]") {
  TempDir dir;
  const CliResult r = run_cli({"bench", "nope", "--cache", (dir.path() / "cache").string()}, dir);
#if KILN_BENCH
  expect_bad_input(r, {"unknown benchmark 'nope'", "available: jit, mla"});
#else
  expect_bad_input(r, {"configured with -DKILN_BENCH=OFF", "-DKILN_BENCH=ON"});
#endif
}

TEST_CASE("cli: inspect of an unknown or malformed key is bad input", "[unit]") {
  TempDir dir;
  const std::string cache = (dir.path() / "cache").string();
  // Well-formed key that is in no cache.
  const std::string key = "nvfp4_writer:sm_90a:op=pack,page_size=64:b9d99c6ca8170019";
  expect_bad_input(run_cli({"inspect", key, "--cache", cache}, dir), {"no cache entry for " + key, "kiln prebuild"});
  // Well-formed cache key hex that is in no cache.
  expect_bad_input(run_cli({"inspect", "0123456789abcdef0123456789abcdef", "--cache", cache}, dir),
                   {"no cache entry for 0123456789abcdef0123456789abcdef"});
  // Not a key at all, and a key with a wrong digest.
  expect_bad_input(run_cli({"inspect", "garbage", "--cache", cache}, dir), {"cannot parse semantic key 'garbage'"});
  expect_bad_input(run_cli({"inspect", "nvfp4_writer:sm_90a:op=pack,page_size=64:0000000000000000", "--cache", cache}, dir),
                   {"digest 0000000000000000 does not match"});
  expect_bad_input(run_cli({"inspect", "--cache", cache}, dir), {"KEY"});  // missing argument
}

TEST_CASE("cli: broken manifest is bad input with line and column", "[unit]") {
  TempDir dir;
  const fs::path manifest = dir.path() / "broken.json";
  std::ofstream(manifest) << "{\n  \"archs\": [\"sm_90a\"],\n  x\n}\n";  // 'x' at line 3, column 3
  const fs::path cache = dir.path() / "cache";
  expect_bad_input(run_cli({"prebuild", "--manifest", manifest.string(), "--cache", cache.string()}, dir),
                   {manifest.string(), "line 3, column 3"});

  // Valid JSON, invalid content: still one line, naming the problem.
  std::ofstream(manifest, std::ios::trunc) << R"({"archs": ["sm_90a"], "policies": [{"family": "nvfp4_writer", "policy": {"page_size": 0}}]})";
  expect_bad_input(run_cli({"prebuild", "--manifest", manifest.string(), "--cache", cache.string()}, dir),
                   {"policies[0]", "page_size"});
  std::ofstream(manifest, std::ios::trunc) << R"({"arch": ["sm_90a"]})";
  expect_bad_input(run_cli({"prebuild", "--manifest", manifest.string(), "--cache", cache.string()}, dir),
                   {"unknown field 'arch'"});
}

TEST_CASE("cli: unknown arch is bad input", "[unit]") {
  TempDir dir;
  const std::string cache = (dir.path() / "cache").string();
  expect_bad_input(run_cli({"prebuild", "--arch", "sm_42", "--cache", cache}, dir), {"'sm_42'", "sm_90a", "sm_120a"});
  expect_bad_input(run_cli({"prebuild", "--arch", "sm_90a,sm_42", "--cache", cache}, dir), {"'sm_42'"});
  expect_bad_input(run_cli({"prebuild", "-j", "0", "--cache", cache}, dir), {"-j"});
}

TEST_CASE("cli: prebuild --arch reports the entries that do not allow it as skipped", "[unit]") {
  TempDir dir;
  const fs::path manifest = dir.path() / "other_arch.json";
  std::ofstream(manifest) << R"({"archs": ["sm_90a"], "keys": ["nvfp4_writer:sm_90a:op=append,page_size=64:47bd5efb86be5103"],
    "policies": [{"family": "nvfp4_writer", "archs": ["sm_90a"], "policy": {"op": ["pack", "append"], "page_size": [2, 32]}}]})";
  const fs::path cache = dir.path() / "cache";
  const CliResult r = run_cli({"prebuild", "--manifest", manifest.string(), "--arch", "sm_120a", "--cache", cache.string(), "--json"}, dir);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 0);
  const json report = json::parse(r.out);
  CHECK(report.at("keys").empty());  // nothing compiled for an arch no entry allows
  CHECK(report.at("compiled") == 0);
  CHECK(report.at("skipped_keys") == 5);
  REQUIRE(report.at("skipped").size() == 2);
  CHECK(report.at("skipped")[0].at("entry") == "keys[0]");
  CHECK(report.at("skipped")[1].at("entry") == "policies[0]");
  CHECK(report.at("skipped")[1].at("keys") == 4);
  CHECK(report.at("skipped")[1].at("archs") == json::array({"sm_90a"}));
  CHECK_THAT(r.err, Contains("skipped  manifest policies[0] (nvfp4_writer, 4 keys): it allows sm_90a only"));
  CHECK_THAT(r.err, Contains("5 skipped (2 manifest entries allow none of --arch)"));
}

TEST_CASE("cli: missing manifest file is bad input naming the path", "[unit]") {
  TempDir dir;
  const fs::path missing = dir.path() / "no_such_manifest.json";
  expect_bad_input(run_cli({"prebuild", "--manifest", missing.string(), "--cache", (dir.path() / "cache").string()}, dir),
                   {missing.string()});
}

TEST_CASE("cli: prebuild into a cache that is not a writable directory fails before compiling", "[unit]") {
  TempDir dir;
  const fs::path not_a_dir = dir.path() / "a_file";
  std::ofstream(not_a_dir) << "not a cache";
  const CliResult r = run_cli({"prebuild", "--cache", not_a_dir.string()}, dir);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);  // kCacheIo: the input is fine, the directory is not
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // no progress line: nothing was compiled
  CHECK_THAT(r.err, StartsWith("kiln [cache_io]: prebuild needs a writable cache directory"));
  CHECK_THAT(r.err, Contains(not_a_dir.string()));
  CHECK_THAT(r.err, Contains("--cache"));
  CHECK(fs::is_regular_file(not_a_dir));
}

TEST_CASE("cli: prune without --max-bytes is bad input", "[unit]") {
  TempDir dir;
  const std::string cache = (dir.path() / "cache").string();
  expect_bad_input(run_cli({"prune", "--cache", cache}, dir), {"--max-bytes"});
  expect_bad_input(run_cli({"prune", "--max-bytes", "-5", "--cache", cache}, dir), {"--max-bytes"});
  // With it, an empty cache prunes to nothing and succeeds.
  const CliResult ok = run_cli({"prune", "--max-bytes", "0", "--cache", cache, "--json"}, dir);
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  const json report = json::parse(ok.out);
  CHECK(report.at("removed_entries") == 0);
  CHECK(report.at("remaining_entries") == 0);
}

TEST_CASE("cli: ls, stats and verify succeed on an empty cache", "[unit]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const std::string c = cache.string();

  const CliResult ls = run_cli({"ls", "--cache", c}, dir);
  INFO("ls stderr: " << ls.err);
  CHECK(ls.exit_code == 0);
  CHECK(ls.out.empty());  // no entries, no lines
  const CliResult ls_json = run_cli({"ls", "--cache", c, "--json"}, dir);
  CHECK(ls_json.exit_code == 0);
  CHECK(json::parse(ls_json.out) == json::array());

  const CliResult stats = run_cli({"stats", "--cache", c}, dir);
  INFO("stats stderr: " << stats.err);
  CHECK(stats.exit_code == 0);
  CHECK_THAT(stats.out, Contains("0 entries"));
  CHECK_THAT(stats.out, Contains(c));
  const CliResult stats_json = run_cli({"stats", "--cache", c, "--json"}, dir);
  CHECK(stats_json.exit_code == 0);
  const json s = json::parse(stats_json.out);
  REQUIRE(s.at("layers").size() == 1);
  CHECK(s["layers"][0].at("entries") == 0);
  CHECK(s["layers"][0].at("root") == c);
  CHECK(s.at("quarantined") == 0);
  CHECK(s.at("writable") == true);

  const CliResult verify = run_cli({"verify", "--cache", c}, dir);
  INFO("verify stderr: " << verify.err);
  CHECK(verify.exit_code == 0);
  CHECK_THAT(verify.err, Contains("0 entries checked, 0 bad"));
  const CliResult verify_json = run_cli({"verify", "--cache", c, "--json"}, dir);
  CHECK(verify_json.exit_code == 0);
  const json v = json::parse(verify_json.out);
  CHECK(v.at("checked") == 0);
  CHECK(v.at("bad") == json::array());

  // --cache, not KILN_CACHE_DIR, decided where the cache lives.
  CHECK(fs::exists(cache));
  CHECK_FALSE(fs::exists(dir.path() / "env_cache"));
}

TEST_CASE("cli: --help succeeds and lists the subcommands", "[unit]") {
  TempDir dir;
  const CliResult r = run_cli({"--help"}, dir);
  CHECK(r.exit_code == 0);
  for (const char* sub : {"prebuild", "warm", "ls", "inspect", "verify", "prune", "stats"}) CHECK_THAT(r.out, Contains(sub));
}
