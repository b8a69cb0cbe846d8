// `kiln bench jit` as a process: the report that shows a compile-time regression (NVRTC's phases per
// compile, per key and per family). Built where the tree builds the bench command (the Release tree;
// the sanitizer trees configure -DKILN_BENCH=OFF and leave it out).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

#if KILN_BENCH

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// NVRTC's phase times (whole milliseconds of wall time) and the process's CPU time.
void check_phases(const json& phases) {
  INFO(phases.dump());
  for (const char* phase : {"front_end_ms", "nvvm_ms", "ptxas_ms", "cpu_ms"}) REQUIRE(phases.at(phase).is_number());
  CHECK(phases["front_end_ms"].get<double>() >= 0);
  CHECK(phases["nvvm_ms"].get<double>() > 0);
  CHECK(phases["ptxas_ms"].get<double>() > 0);
  CHECK(phases["cpu_ms"].get<double>() > 0);
}

// The phases of one compile add up to at most the whole build's time (plus the table's rounding).
// Not so for medians over several compiles, taken phase by phase.
void check_one_compile(const json& phases, double total_ms) {
  check_phases(phases);
  const double sum = phases["front_end_ms"].get<double>() + phases["nvvm_ms"].get<double>() + phases["ptxas_ms"].get<double>();
  CHECK(sum <= total_ms + 3.0);
}

// A fixed key's repeated cold compiles: three runs, the median among them.
void check_repeated(const json& entry, const std::string& family) {
  INFO(entry.dump());
  CHECK(entry.at("key").get<std::string>().rfind(family + ":sm_90a:", 0) == 0);
  const json& runs = entry.at("runs_ms");
  REQUIRE(runs.size() == 3);
  const double median = entry.at("median_ms").get<double>();
  int at_most = 0, at_least = 0;
  for (const json& run : runs) {
    at_most += run.get<double>() <= median;
    at_least += run.get<double>() >= median;
  }
  CHECK(at_most >= 2);
  CHECK(at_least >= 2);
  check_phases(entry.at("median_phases"));
}

}  // namespace

TEST_CASE("cli: kiln bench jit reports every compile's NVRTC phases per key and per family", "[nvrtc]") {
  kiln::testing::TempDir dir("kiln_bench_jit_test");
  const fs::path manifest = dir.path() / "writer.json";
  std::ofstream(manifest) << R"({"archs": ["sm_90a"], "policies": [{"family": "nvfp4_writer", "policy": {"op": "pack", "page_size": 64}}]})";
  const fs::path report_file = dir.path() / "jit.json";
  const kiln::testing::ProcessResult r =
      kiln::testing::Subprocess(kiln::testing::kiln_cli({"bench", "jit", "--manifest", manifest.string(), "--cache",
                                                         (dir.path() / "cache").string(), "--out", report_file.string()},
                                                        kiln::testing::kiln_cli_environment(dir.path()), dir.path(), "bench"))
          .wait();
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(report_file);
  REQUIRE(in.good());
  const json report = json::parse(in);
  CHECK(report.at("bench") == "jit");
  CHECK(report.at("nvrtc").is_string());
  const bool gpu = !report.at("gpu").is_null();
  const json& results = report.at("results");

  const json& manifest_compiles = results.at("cold_compile_manifest");
  CHECK(manifest_compiles.at("arch") == "sm_90a");
  const json& families = manifest_compiles.at("per_family");
  REQUIRE(families.size() == 1);
  const json& writer = families.at("nvfp4_writer");
  CHECK(writer.at("keys_compiled") == 1);
  CHECK(writer.at("keys_sharing_a_cubin") == 0);
  check_one_compile(writer.at("median_phases"), writer.at("median_ms").get<double>());  // one key
  if (gpu) {
    CHECK(writer.at("median_load_ms").is_number());
  } else {
    CHECK(writer.at("median_load_ms") == "not measured (no GPU)");
  }
  const json& keys = manifest_compiles.at("per_key");
  REQUIRE(keys.size() == 1);
  CHECK(keys[0].at("key").get<std::string>().rfind("nvfp4_writer:sm_90a:op=pack,page_size=64:", 0) == 0);
  check_one_compile(keys[0], keys[0].at("ms").get<double>());

  check_repeated(results.at("cold_compile_mla"), "mla_decode");
  check_repeated(results.at("cold_compile_sparse"), "sparse_nvfp4");
  CHECK(results.at("disk_hit_warm").at("compiles") == 0);
  const json& prebuild = results.at("prebuild").at("default_manifest");
  CHECK(prebuild.at("keys") == 1);
  CHECK(prebuild.at("manifest") == manifest.string());
}

#endif  // KILN_BENCH
