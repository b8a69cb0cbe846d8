// The `kiln` CLI with the remote tier: prebuild --push, prebuild --json's remote_hits, stats. Two
// NVFP4 writer keys are compiled (about half a second).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/files.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using kiln::testing::ProcessResult;
using kiln::testing::RedisServer;
using nlohmann::json;

namespace {

// kiln with `args`; the remote tier on when `url` is not empty (prefix cli:).
ProcessResult run_cli(const std::vector<std::string>& args, const kiln::testing::TempDir& scratch, const std::string& url) {
  kiln::testing::Environment env = kiln::testing::kiln_cli_environment(scratch.path());
  if (!url.empty()) {
    env["KILN_REMOTE_CACHE"] = url;
    env["KILN_REMOTE_CACHE_PREFIX"] = "cli:";
    env["KILN_REMOTE_CACHE_CONNECT_TIMEOUT_MS"] = "200";
    env["KILN_REMOTE_CACHE_TIMEOUT_MS"] = "200";
  }
  return kiln::testing::Subprocess(kiln::testing::kiln_cli(args, env, scratch.path())).wait();
}

json parse(const ProcessResult& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  const json j = json::parse(r.out, nullptr, false);
  REQUIRE(j.is_object());
  return j;
}

}  // namespace

TEST_CASE("remote cli: prebuild with push uploads, a second host takes every key from Redis, stats shows them",
          "[remote][cli]") {
  RedisServer server;
  kiln::testing::TempDir dir("kiln_remote_cli");
  const fs::path manifest = dir.path() / "m.json";
  kiln::testing::write_text(manifest, R"({"archs": ["sm_90a"], "policies": [{"family": "nvfp4_writer",
                                        "policy": {"op": "pack", "page_size": [7, 9]}}]})");
  const std::string a = (dir.path() / "a").string(), b = (dir.path() / "b").string();

  const ProcessResult unset = run_cli({"prebuild", "--push", "--manifest", manifest.string(), "--cache", a}, dir, "");
  CHECK(unset.exit_code == 2);
  CHECK_THAT(unset.err, Contains("--push needs a remote cache: set KILN_REMOTE_CACHE"));

  // Compiled without the remote tier, then pushed: both keys are local hits, uploaded by the push.
  REQUIRE(run_cli({"prebuild", "--manifest", manifest.string(), "--cache", a}, dir, "").exit_code == 0);
  const json pushed = parse(run_cli({"prebuild", "--push", "--json", "--manifest", manifest.string(), "--cache", a}, dir, server.url()));
  CHECK(pushed["compiled"] == 0);
  CHECK(pushed["push"]["uploaded"] == 2);
  CHECK(pushed["push"]["failed"] == 0);
  const json again = parse(run_cli({"prebuild", "--push", "--json", "--manifest", manifest.string(), "--cache", a}, dir, server.url()));
  CHECK(again["push"]["present"] == 2);

  const json other = parse(run_cli({"prebuild", "--json", "--manifest", manifest.string(), "--cache", b}, dir, server.url()));
  CHECK(other["compiled"] == 0);
  CHECK(other["remote_hits"] == 2);
  CHECK(other["remote"]["hits"] == 2);
  for (const auto& k : other["keys"]) CHECK(k["source"] == "remote");

  const ProcessResult stats = run_cli({"stats", "--json", "--cache", b}, dir, server.url());
  CHECK(stats.exit_code == 0);
  const json s = parse(stats)["remote"];
  CHECK(s["reachable"] == true);
  CHECK(s["entries"] == 2);
  CHECK(s["locks"] == 0);
  CHECK(s["counters"]["uploads"] == 2);
  CHECK(s["counters"]["hits"] == 2);
  const ProcessResult text = run_cli({"stats", "--cache", b}, dir, server.url());
  CHECK_THAT(text.out, Contains("2 entries, 0 locks held"));

  server.kill();
  const ProcessResult down = run_cli({"prebuild", "--push", "--manifest", manifest.string(), "--cache", a}, dir, server.url());
  CHECK(down.exit_code == 1);
  CHECK_THAT(down.err, Contains("push failed"));
  CHECK_THAT(down.err, Contains("0 uploaded, 0 already there, 2 failed"));
  const ProcessResult stats_down = run_cli({"stats", "--cache", b}, dir, server.url());
  CHECK(stats_down.exit_code == 0);
  CHECK_THAT(stats_down.out, Contains("unreachable"));
}
