// NVRTC compiles (no GPU): every key of the embedded default manifest for every arch, determinism,
// compile errors, the KernelService tiers and counters, miss recording, and `kiln prebuild` from
// real processes. NVRTC compiles cost 0.2-5 s each, so every test compiles as little as it can: the
// default manifest is compiled once, by `kiln prebuild`, and its cache entries are checked here.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kiln/cache/cubin_store.h"
#include "kiln/jit/build_request.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/manifest.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "tests/support/expect_error.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tools/default_manifest.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using kiln::ErrorCode;
using kiln::SemanticKey;
using kiln::testing::expect_error;
using nlohmann::json;
using CliResult = kiln::testing::ProcessResult;

namespace {

struct TempDir : kiln::testing::TempDir {
  TempDir() : kiln::testing::TempDir("kiln_nvrtc_test") {}
};

SemanticKey writer(const char* op, int page, const char* arch) {
  return SemanticKey("nvfp4_writer", {{"op", op}, {"page_size", page}}, arch);
}

kiln::Config config_for(const fs::path& cache_dir) {
  kiln::Config c;  // not from_environment: the test decides every setting
  c.cache_dir = cache_dir;
  c.log_level = kiln::LogLevel::kError;
  return c;
}

// ---- running the kiln CLI as real processes ----

// A started `kiln` process; stdout/stderr go to files in `scratch` so that many can run at once.
std::unique_ptr<kiln::testing::Subprocess> start_cli(const std::vector<std::string>& args, const fs::path& scratch, const std::string& tag) {
  REQUIRE(fs::exists(kiln::testing::kiln_cli_path()));
  return std::make_unique<kiln::testing::Subprocess>(
      kiln::testing::kiln_cli(args, kiln::testing::kiln_cli_environment(scratch), scratch, tag));
}

CliResult run_cli(const std::vector<std::string>& args, const fs::path& scratch, const std::string& tag = "cli") {
  return start_cli(args, scratch, tag)->wait();
}

// Parses the --json report of `kiln prebuild` and checks its shape.
json prebuild_report(const CliResult& r) {
  INFO("prebuild stderr:\n" << r.err);
  INFO("prebuild stdout:\n" << r.out);
  REQUIRE(r.exit_code == 0);
  const json report = json::parse(r.out);
  for (const char* field : {"keys", "compiled", "hits", "failed", "wall_ms"}) REQUIRE(report.contains(field));
  REQUIRE(report["keys"].is_array());
  CHECK(report["wall_ms"].is_number());
  CHECK(report["wall_ms"].get<double>() >= 0);
  for (const json& item : report["keys"]) {
    REQUIRE(item.contains("key"));
    REQUIRE(item.contains("outcome"));
  }
  return report;
}

std::multiset<std::string> outcomes(const json& report) {
  std::multiset<std::string> out;
  for (const json& item : report["keys"]) out.insert(item["outcome"].get<std::string>());
  return out;
}

// ---- a family whose source never compiles ----

class BrokenFamily final : public kiln::Family {
 public:
  std::string_view name() const override { return "kiln_test_broken"; }
  json canonicalize(const json& policy) const override {
    json out = {{"variant", 1}};
    if (policy.contains("variant")) out["variant"] = policy["variant"];
    return out;
  }
  kiln::KernelSource render(const json&) const override {
    // A missing expression: NVRTC reports "expected an expression".
    return kiln::KernelSource{"extern \"C\" __global__ void kiln_broken_kernel(int* out) { int x = ; out[0] = x; }\n",
                              {"kiln_broken_kernel"}};
  }
};

SemanticKey broken_key() {
  kiln::register_family(std::make_unique<BrokenFamily>());  // idempotent
  return SemanticKey("kiln_test_broken", {{"variant", 1}}, "sm_90a");
}

}  // namespace

TEST_CASE("compile: the same key compiled twice gives byte-identical cubins", "[nvrtc]") {
  const SemanticKey key = writer("append", 64, "sm_120a");
  const kiln::BuildRequest request = kiln::make_build_request(key);
  const kiln::Compiler compiler;
  const kiln::CompileResult a = compiler.compile(request.source, key.arch(), key.str());
  const kiln::CompileResult b = compiler.compile(request.source, key.arch(), key.str());
  REQUIRE_FALSE(a.cubin.empty());
  CHECK(a.cubin == b.cubin);
  CHECK(a.lowered_names == b.lowered_names);
  // And nothing of this machine's paths made it into the binary.
  CHECK(a.cubin.find(fs::current_path().string()) == std::string::npos);
  CHECK(a.cubin.find(fs::read_symlink("/proc/self/exe").parent_path().string()) == std::string::npos);
}

TEST_CASE("compile: a kernel that reads a namespace-scope constant gives byte-identical cubins", "[nvrtc]") {
  // The templates' constants have internal linkage; unless the options fix the seed, NVRTC names their
  // symbols after the clock's second and the process id, so the two compiles lie more than a second
  // apart. The writer above has no such symbol, so it cannot show this.
  const kiln::KernelSource source{
      "namespace kiln_test { constexpr int kTable[4] = {3, 1, 4, 1}; }\n"
      "template <int kScale> __global__ void kiln_table_kernel(int* out, int i) { out[0] = kScale * kiln_test::kTable[i & 3]; }\n",
      {"kiln_table_kernel<2>"}};
  const kiln::Compiler compiler;
  const kiln::CompileResult a = compiler.compile(source, "sm_90a", "table");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const kiln::CompileResult b = compiler.compile(source, "sm_90a", "table");
  REQUIRE(a.cubin.find("_INTERNAL_") != std::string::npos);  // the case this test is about
  CHECK(a.cubin == b.cubin);
}

TEST_CASE("compile: a syntax error raises kCompileFailed with the key and NVRTC's log", "[nvrtc]") {
  const SemanticKey key = broken_key();
  const kiln::BuildRequest request = kiln::make_build_request(key);
  const kiln::Error e = expect_error([&] { kiln::Compiler().compile(request.source, key.arch(), key.str()); });
  CHECK(e.code() == ErrorCode::kCompileFailed);
  CHECK(e.details().key == key.str());
  CHECK_THAT(e.details().log, Contains("error"));
  CHECK_THAT(e.details().log, Contains("expected an expression"));
  CHECK_THAT(e.what(), Contains("expected an expression"));  // the log is in the message too
  CHECK_THAT(e.what(), Contains(key.str()));

  // Through the service: counted as a failure, nothing published, and a retry fails the same way.
  TempDir dir;
  kiln::KernelService service(config_for(dir.path()));
  for (int attempt = 0; attempt < 2; ++attempt) {
    const kiln::Error s = expect_error([&] { service.build(key); });
    CHECK(s.code() == ErrorCode::kCompileFailed);
    CHECK(s.details().key == key.str());
  }
  CHECK(service.counters().compile_failures == 2);
  CHECK(service.counters().compiles == 0);
  CHECK(service.store().list().empty());
}

// The launch path's lookup on a machine without a GPU (CI): a miss builds the key, whose arch comes
// from the device, so the driver is asked first and nothing is compiled or published.
TEST_CASE("acquire: a miss without a driver throws kDriver and compiles nothing", "[nvrtc]") {
  if (kiln::Driver::get().available()) {
    WARN("skipped: this machine has a CUDA driver, so the miss would warm the key (the gpu suite covers that)");
    return;
  }
  kiln::register_builtin_families();
  TempDir dir;
  kiln::KernelService service(config_for(dir.path()));
  const kiln::nvfp4::WriterPolicy policy{kiln::nvfp4::WriterOp::kAppend, 64};
  const kiln::Error e = expect_error([&] { kiln::acquire(service, policy, nullptr, 0); });
  CHECK(e.code() == ErrorCode::kDriver);
  CHECK(service.counters().compiles == 0);
  CHECK(service.store().list().empty());
}

TEST_CASE("warm: a policy no arch accepts is bad input before any device is asked", "[nvrtc]") {
  kiln::register_builtin_families();
  TempDir dir;
  kiln::KernelService service(config_for(dir.path()));
  // Device 7 need not exist: with or without a driver, the policy is refused first.
  const kiln::Error sparse = expect_error([&] { kiln::sparse::warm_sparse(kiln::sparse::SparsePolicy{7, 1}, {7}, service); });
  CHECK(sparse.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(sparse.what(), Contains("heads"));
  const kiln::Error writer = expect_error([&] { kiln::nvfp4::warm({kiln::nvfp4::WriterOp::kPack, 0}, {7}, service); });
  CHECK(writer.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(writer.what(), Contains("page_size"));
  CHECK(service.counters().compiles == 0);
}

TEST_CASE("service: one key from 4 threads compiles once, then a disk hit, then a read-only layer hit",
          "[nvrtc][concurrency]") {
  TempDir first, second;
  const SemanticKey key = writer("pack", 32, "sm_90a");
  const kiln::CacheKey cache_key = kiln::make_build_request(key).cache_key;

  std::string cubin;
  {
    kiln::KernelService service(config_for(first.path()));
    std::vector<kiln::Artifact> got(4);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        ++ready;
        while (ready.load() < 4) std::this_thread::yield();  // start together
        got[t] = service.build(key);
      });
    }
    for (auto& t : threads) t.join();
    const kiln::ServiceCounters c = service.counters();
    CHECK(c.compiles == 1);
    CHECK(c.memory_hits == 3);
    CHECK(c.disk_hits == 0);
    CHECK(c.compile_ms > 0);
    int compiled = 0;
    for (const auto& a : got) {
      REQUIRE(a.entry);
      CHECK(a.entry == got[0].entry);  // one shared artifact
      compiled += a.source == kiln::ArtifactSource::kCompiled;
    }
    CHECK(compiled == 1);
    CHECK(got[0].entry->semantic_key == key.str());
    CHECK(got[0].entry->key == cache_key);
    cubin = got[0].entry->cubin;
    CHECK(fs::exists(kiln::CubinStore::entry_path(first.path(), cache_key)));
  }
  {
    // A new service (as a new process would) on the same directory: disk hit, no compile.
    kiln::KernelService service(config_for(first.path()));
    const kiln::Artifact a = service.build(key);
    CHECK(a.source == kiln::ArtifactSource::kDisk);
    CHECK(a.entry->cubin == cubin);
    const kiln::ServiceCounters c = service.counters();
    CHECK(c.disk_hits == 1);
    CHECK(c.compiles == 0);
    CHECK(c.read_only_hits == 0);
  }
  {
    // The first directory as a prebuilt read-only layer, an empty writable one.
    kiln::Config config = config_for(second.path());
    config.read_only_layers = {first.path()};
    kiln::KernelService service(config);
    const kiln::Artifact a = service.build(key);
    CHECK(a.source == kiln::ArtifactSource::kReadOnlyLayer);
    CHECK(a.entry->cubin == cubin);
    const kiln::ServiceCounters c = service.counters();
    CHECK(c.read_only_hits == 1);
    CHECK(c.disk_hits == 0);
    CHECK(c.compiles == 0);
    // A hit in a read-only layer is not copied into the writable one.
    CHECK_FALSE(fs::exists(kiln::CubinStore::entry_path(second.path(), cache_key)));
    // Asking again is a memory hit.
    CHECK(service.build(key).entry == a.entry);
    CHECK(service.counters().memory_hits == 1);
  }
}

TEST_CASE("service: sealed on an empty cache refuses to compile and names the key", "[nvrtc]") {
  TempDir dir;
  kiln::Config config = config_for(dir.path());
  config.sealed = true;
  kiln::KernelService service(config);
  CHECK(service.sealed());
  const SemanticKey key = writer("append", 2, "sm_90a");
  const kiln::Error e = expect_error([&] { service.build(key); });
  CHECK(e.code() == ErrorCode::kSealed);
  CHECK(e.details().key == key.str());
  CHECK_THAT(e.what(), Contains(key.str()));
  CHECK_THAT(e.what(), Contains("sealed"));
  const kiln::ServiceCounters c = service.counters();
  CHECK(c.compiles == 0);
  CHECK(c.compile_failures == 0);
  CHECK(service.store().list().empty());
  // Still sealed on a second try (the failure was not cached as success).
  CHECK(expect_error([&] { service.build(key); }).code() == ErrorCode::kSealed);
}

TEST_CASE("service: recorded misses form a manifest that kiln prebuild accepts", "[nvrtc]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const fs::path record = dir.path() / "misses.json";
  const SemanticKey a = writer("pack", 2, "sm_90a");
  const SemanticKey b = writer("append", 128, "sm_120a");
  {
    kiln::Config config = config_for(cache);
    config.record_misses = record;
    kiln::KernelService service(config);
    CHECK(service.build(a).source == kiln::ArtifactSource::kCompiled);
    CHECK(service.build(b).source == kiln::ArtifactSource::kCompiled);
    service.build(a);  // a memory hit is not a miss
    CHECK(service.counters().compiles == 2);
  }
  const auto recorded = kiln::load_manifest(record);
  std::set<std::string> got;
  for (const auto& k : recorded) got.insert(k.str());
  CHECK(recorded.size() == 2);
  CHECK(got == std::set<std::string>{a.str(), b.str()});

  {
    // A disk hit is not a miss either: the record does not grow.
    kiln::Config config = config_for(cache);
    config.record_misses = record;
    kiln::KernelService service(config);
    CHECK(service.build(a).source == kiln::ArtifactSource::kDisk);
    CHECK(kiln::load_manifest(record).size() == 2);
  }

  const json report = prebuild_report(
      run_cli({"prebuild", "--manifest", record.string(), "--cache", cache.string(), "-j", "2", "--json"}, dir.path()));
  CHECK(report["compiled"] == 0);
  CHECK(report["hits"] == 2);
  CHECK(report["failed"] == 0);
  std::set<std::string> listed;
  for (const json& item : report["keys"]) listed.insert(item["key"].get<std::string>());
  CHECK(listed == got);
}

// One test for the whole default manifest: it is the most expensive thing here (every key is one
// NVRTC compile), so the cubins that `kiln prebuild` compiles are also the ones checked key by key.
TEST_CASE("default manifest: kiln prebuild compiles every key for sm_90a and sm_120a, and a second run compiles nothing",
          "[nvrtc]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const auto named_keys = kiln::parse_manifest(kiln::tools::default_manifest(), "(embedded default)");
  REQUIRE(!named_keys.empty());
  // prebuild also compiles the keys' companions (the split combine and merge modules), once each.
  std::vector<SemanticKey> manifest_keys = named_keys;
  std::set<std::string> companions;
  for (const auto& k : named_keys) {
    for (const SemanticKey& c : kiln::companion_keys(k)) {
      if (companions.insert(c.str()).second) manifest_keys.push_back(c);
    }
  }
  CHECK(companions.size() > 0);
  const std::size_t n = manifest_keys.size();
  std::set<std::string> expected;
  std::map<std::string, std::set<std::string>> policies_by_arch;  // arch -> family + policy
  for (const auto& k : manifest_keys) {
    expected.insert(k.str());
    policies_by_arch[k.arch()].insert(k.family() + " " + k.policy().dump());
  }
  // Both targets are covered. Families may be arch-specific (mla_decode is sm_90a only), but the
  // writer's policies are the same on both, so a server on either GPU finds its cache writer.
  REQUIRE(policies_by_arch.size() == 2);
  REQUIRE(policies_by_arch.count("sm_90a") == 1);
  REQUIRE(policies_by_arch.count("sm_120a") == 1);
  const auto writer_policies = [&](const std::string& arch) {
    std::set<std::string> out;
    for (const auto& p : policies_by_arch[arch]) {
      if (p.rfind("nvfp4_writer ", 0) == 0) out.insert(p);
    }
    return out;
  };
  CHECK_FALSE(writer_policies("sm_90a").empty());
  CHECK(writer_policies("sm_90a") == writer_policies("sm_120a"));
  // No key that can never launch on its target: each sparse key is a kernel the launcher runs there.
  for (const auto& k : manifest_keys) {
    if (k.family() != "sparse_nvfp4") continue;
    INFO(k.str());
    bool launchable = false;
    for (const auto kernel : kiln::sparse::sparse_kernels_for(k.arch(), k.policy()["heads"].get<int>()))
      launchable |= k.policy()["kernel"] == kiln::sparse::sparse_kernel_name(kernel);
    CHECK(launchable);
  }
  // And every kernel the launcher may pick for a manifest policy is in the manifest, so a server that
  // prebuilt and warmed it never meets a cold key inside graph capture.
  std::map<std::string, std::set<std::string>> sparse_kernels;  // arch, heads, extra pool, split -> kernels
  for (const auto& k : manifest_keys) {
    if (k.family() != "sparse_nvfp4") continue;
    const json& p = k.policy();
    sparse_kernels[k.arch() + " " + p["heads"].dump() + " " + p["has_extra"].dump() + " " + p["split"].dump()].insert(
        p["kernel"].get<std::string>());
  }
  for (const auto& [shape, kernels] : sparse_kernels) {
    INFO(shape);
    const std::string arch = shape.substr(0, shape.find(' '));
    const int heads = std::stoi(shape.substr(arch.size() + 1));
    for (const auto kernel : kiln::sparse::sparse_kernels_for(arch, heads)) {
      CHECK(kernels.count(kiln::sparse::sparse_kernel_name(kernel)) == 1);
    }
  }

  // Keys that render one kernel (MLA keys that differ only in H within a row class, SQ or the mask;
  // sparse keys that differ only in H or split) share a cache entry: the first compiles it, the
  // others hit, and the report names the key whose module each shares.
  std::map<std::string, std::set<std::string>> keys_by_entry;  // cache key -> semantic keys
  for (const auto& k : manifest_keys) keys_by_entry[kiln::make_build_request(k).cache_key.hex()].insert(k.str());
  const std::size_t distinct = keys_by_entry.size();
  CHECK(distinct < n);

  const CliResult first_run = run_cli({"prebuild", "--cache", cache.string(), "-j", "2", "--json"}, dir.path(), "first");
  const json first = prebuild_report(first_run);
  CHECK(first["compiled"] == distinct);
  CHECK(first["modules"] == distinct);
  CHECK(first["hits"] == n - distinct);
  CHECK(first["failed"] == 0);
  CHECK(first["keys"].size() == n);
  CHECK(first["companions"] == companions.size());
  CHECK(outcomes(first).count("compiled") == distinct);
  std::set<std::string> listed;
  std::size_t sharing = 0;
  for (const json& item : first["keys"]) {
    const std::string key = item["key"].get<std::string>();
    listed.insert(key);
    const SemanticKey parsed = SemanticKey::parse(key);  // printable keys parse back
    CHECK_THAT(key, StartsWith(parsed.family() + ":" + parsed.arch() + ":"));
    if (item["outcome"] == "failed") FAIL_CHECK(key << ": " << item.dump());  // names the key that failed
    if (item.contains("shares")) {  // a hit on a module another key of the run compiled
      CHECK(item["outcome"] == "hit");
      const SemanticKey owner = SemanticKey::parse(item["shares"].get<std::string>());
      CHECK(kiln::make_build_request(owner).cache_key == kiln::make_build_request(parsed).cache_key);
      ++sharing;
    }
  }
  CHECK(sharing == n - distinct);
  CHECK(listed == expected);
  CHECK_THAT(first_run.err, Contains(fmt::format("prebuild: {} keys ({} of them companion modules of the others) in {} modules: {} "
                                                 "compiled, {} hit, 0 failed",
                                                 n, companions.size(), distinct, distinct, n - distinct)));  // the summary

  const json second = prebuild_report(run_cli({"prebuild", "--cache", cache.string(), "-j", "2", "--json"}, dir.path(), "second"));
  CHECK(second["compiled"] == 0);
  CHECK(second["hits"] == n);
  CHECK(second["failed"] == 0);
  CHECK(outcomes(second).count("hit") == n);

  // Every key's entry, found through this process's make_build_request: a non-empty ELF cubin that
  // defines every lowered name, one per name expression.
  kiln::CubinStore store({.root = cache});
  for (const auto& key : manifest_keys) {
    INFO("key " << key.str());
    const kiln::BuildRequest request = kiln::make_build_request(key);
    const auto hit = store.lookup(request.cache_key);
    REQUIRE(hit.has_value());
    const kiln::CacheEntry& e = hit->entry;
    CHECK(keys_by_entry.at(request.cache_key.hex()).count(e.semantic_key) == 1);  // the key, or one sharing its kernel
    // NVRTC's phase table was read: every compile has a front end, NVVM and ptxas, in whole ms.
    const json& phases = e.metadata.at("compile_phases_ms");
    CHECK(phases.at("front_end").get<double>() + phases.at("nvvm").get<double>() + phases.at("ptxas").get<double>() > 0);
    CHECK(phases.at("front_end").get<double>() + phases.at("nvvm").get<double>() + phases.at("ptxas").get<double>() <=
          e.metadata.at("compile_ms").get<double>() + 3);
    CHECK(e.cubin.size() > 64);
    CHECK(e.cubin.compare(0, 4, "\x7f" "ELF") == 0);  // a real cubin, not PTX
    CHECK(e.metadata.at("arch") == key.arch());
    CHECK(e.metadata.at("name_expressions") == json(request.source.name_expressions));
    const json& lowered = e.metadata.at("lowered_names");
    REQUIRE(lowered.size() == request.source.name_expressions.size());
    for (const json& name : lowered) {
      CHECK_FALSE(name.get<std::string>().empty());
      CHECK(e.cubin.find(name.get<std::string>()) != std::string::npos);
    }
  }

  // The cubin another process compiled is byte-identical to one compiled here (first writer key:
  // cheapest to compile).
  const auto writer_key = std::find_if(manifest_keys.begin(), manifest_keys.end(),
                                       [](const SemanticKey& k) { return k.family() == "nvfp4_writer"; });
  REQUIRE(writer_key != manifest_keys.end());
  const kiln::BuildRequest request = kiln::make_build_request(*writer_key);
  const kiln::CompileResult here = kiln::Compiler().compile(request.source, writer_key->arch(), writer_key->str());
  CHECK(store.lookup(request.cache_key)->entry.cubin == here.cubin);
  CHECK(store.lookup(request.cache_key)->entry.metadata.at("lowered_names") == json(here.lowered_names));

  // And `kiln inspect` finds it by its printable key.
  const CliResult inspect = run_cli({"inspect", writer_key->str(), "--cache", cache.string()}, dir.path(), "inspect");
  CHECK(inspect.exit_code == 0);
  const json info = json::parse(inspect.out);
  CHECK(info["key"] == writer_key->str());
  CHECK(info["cache_key"] == request.cache_key.hex());
  CHECK(info["companions"] == json::array());
  // An MLA key's entry names its combine module, itself an entry of the cache.
  const auto mla_key = std::find_if(manifest_keys.begin(), manifest_keys.end(),
                                    [](const SemanticKey& k) { return k.family() == "mla_decode"; });
  REQUIRE(mla_key != manifest_keys.end());
  const json mla_info = json::parse(run_cli({"inspect", mla_key->str(), "--cache", cache.string()}, dir.path(), "inspect_mla").out);
  REQUIRE(mla_info["companions"].size() == 1);
  CHECK(mla_info["companions"][0] == kiln::companion_keys(*mla_key).at(0).str());
  CHECK(run_cli({"inspect", mla_info["companions"][0].get<std::string>(), "--cache", cache.string()}, dir.path(), "inspect_combine")
            .exit_code == 0);
  // A key whose module another key compiled is shown as itself, with its own companions, beside the
  // key the entry was compiled for.
  const auto shared_item = std::find_if(first["keys"].begin(), first["keys"].end(), [](const json& item) {
    return item.contains("shares") && SemanticKey::parse(item["key"].get<std::string>()).family() == "mla_decode";
  });
  REQUIRE(shared_item != first["keys"].end());
  const SemanticKey shared = SemanticKey::parse((*shared_item)["key"].get<std::string>());
  const json shared_info = json::parse(run_cli({"inspect", shared.str(), "--cache", cache.string()}, dir.path(), "inspect_shared").out);
  CHECK(shared_info["key"] == shared.str());
  CHECK(shared_info["compiled_for"] == (*shared_item)["shares"]);
  CHECK(shared_info["companions"] == json::array({kiln::companion_keys(shared).at(0).str()}));
  const json by_hex = json::parse(run_cli({"inspect", shared_info["cache_key"].get<std::string>(), "--cache", cache.string()},
                                          dir.path(), "inspect_hex").out);
  CHECK(by_hex["key"] == (*shared_item)["shares"]);
  CHECK_FALSE(by_hex.contains("compiled_for"));
}

TEST_CASE("cli: 8 concurrent kiln prebuild processes compile a key once", "[nvrtc][concurrency]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const fs::path manifest = dir.path() / "one.json";
  const SemanticKey key = writer("append", 32, "sm_90a");
  std::ofstream(manifest) << json({{"keys", {key.str()}}}).dump();

  std::vector<std::unique_ptr<kiln::testing::Subprocess>> procs;
  for (int i = 0; i < 8; ++i) {
    std::string tag = "proc";  // built with append: GCC 12 warns falsely (-Wrestrict) on "p" + to_string(i)
    tag.append(std::to_string(i));
    procs.push_back(start_cli({"prebuild", "--manifest", manifest.string(), "-j", "1", "--cache", cache.string(), "--json"},
                              dir.path(), tag));
  }
  int compiled = 0, hits = 0;
  for (auto& p : procs) {
    const json report = prebuild_report(p->wait());
    REQUIRE(report["keys"].size() == 1);
    CHECK(report["keys"][0]["key"] == key.str());
    CHECK(report["failed"] == 0);
    compiled += report["compiled"].get<int>();
    hits += report["hits"].get<int>();
    CHECK(report["compiled"].get<int>() + report["hits"].get<int>() == 1);
  }
  CHECK(compiled == 1);
  CHECK(hits == 7);

  const CliResult verify = run_cli({"verify", "--cache", cache.string(), "--json"}, dir.path(), "verify");
  INFO(verify.err);
  CHECK(verify.exit_code == 0);
  const json v = json::parse(verify.out);
  CHECK(v["checked"] == 1);
  CHECK(v["bad"] == json::array());
}

TEST_CASE("cli: a prebuild whose cache stops taking entries fails after the run and says so", "[nvrtc]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const fs::path manifest = dir.path() / "one.json";
  const SemanticKey key = writer("pack", 32, "sm_90a");
  std::ofstream(manifest) << json({{"keys", {key.str()}}}).dump();
  // The directory opens fine, then every write past 4 KiB (an entry is ~15 KiB) fails with EFBIG, as a
  // full disk fails with ENOSPC (SIGXFSZ ignored, so the write fails instead of killing kiln).
  kiln::testing::SpawnOptions limited = kiln::testing::kiln_cli({"prebuild", "--manifest", manifest.string(), "--cache", cache.string()},
                                                                  kiln::testing::kiln_cli_environment(dir.path()), dir.path(), "limited");
  limited.argv.insert(limited.argv.begin(), {"/bin/sh", "-c", "trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\""});
  const CliResult r = kiln::testing::Subprocess(limited).wait();
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("is not writable"));  // the store's one warning
  CHECK_THAT(r.err, Contains("compiled " + key.str()));
  CHECK_THAT(r.err, Contains("stopped taking entries"));
  const CliResult verify = run_cli({"verify", "--cache", cache.string(), "--json"}, dir.path(), "verify");
  INFO(verify.err);
  CHECK(verify.exit_code == 0);
  CHECK(json::parse(verify.out)["checked"] == 0);
}

TEST_CASE("driver: without a GPU driver, warm fails with a clear kDriver error", "[nvrtc]") {
  if (kiln::Driver::get().available()) {
    WARN("a CUDA driver is present here; the no-driver behaviour is covered on machines without one");
    return;
  }
  // The global service reads its cache dir from the environment: keep it away from the user's cache.
  TempDir dir;
  ::setenv("KILN_CACHE_DIR", dir.str().c_str(), 1);
  ::unsetenv("KILN_CACHE_PATH");
  const kiln::Error e = expect_error([] { kiln::nvfp4::warm(kiln::nvfp4::WriterPolicy{}, {0}); });
  CHECK(e.code() == ErrorCode::kDriver);
  CHECK_THAT(e.what(), Contains("GPU"));
  CHECK_THAT(e.what(), Contains("driver"));
  CHECK_FALSE(kiln::Driver::get().reason().empty());
  CHECK_THAT(e.what(), Contains(kiln::Driver::get().reason()));
  // Building (no GPU) still works on such a machine; nothing was compiled by the failed warm.
  CHECK(kiln::KernelService::global().counters().compiles == 0);

  // Warming a list reports every (key, device) as it finishes, failures with their message, then
  // throws the first failure.
  kiln::KernelService service(config_for(dir.path() / "list"));
  const std::vector<SemanticKey> keys = {writer("pack", 32, "sm_90a"), writer("append", 32, "sm_90a")};
  std::vector<std::size_t> done;
  std::set<std::string> reported;
  const kiln::Error list_error = expect_error([&] {
    service.warm(keys, {0, 1}, [&](std::size_t n, std::size_t total, const SemanticKey& key, int device, double ms,
                                   const std::string& problem) {
      CHECK(total == 4);
      CHECK(ms >= 0);
      CHECK_THAT(problem, Contains("driver"));
      done.push_back(n);
      reported.insert(key.str() + "@" + std::to_string(device));
    });
  });
  CHECK(list_error.code() == ErrorCode::kDriver);
  CHECK(done == std::vector<std::size_t>{1, 2, 3, 4});
  CHECK(reported.size() == 4);
  CHECK(service.counters().compiles == 0);
}
