// Manifests: the list of semantic keys a server will ask for (runtime/manifest.h).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/manifest.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "tools/default_manifest.h"
#include "tests/support/expect_error.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using kiln::ErrorCode;
using kiln::SemanticKey;
using kiln::testing::expect_error;
using kiln::testing::write_text;
using nlohmann::json;

namespace {

struct TempDir : kiln::testing::TempDir {
  TempDir() : kiln::testing::TempDir("kiln_manifest_test") {}
};

SemanticKey writer(const char* op, int page, const char* arch) {
  return SemanticKey("nvfp4_writer", {{"op", op}, {"page_size", page}}, arch);
}

std::vector<std::string> strs(const std::vector<SemanticKey>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.str());
  return out;
}

// Errors of parse_manifest: code kInvalidArgument, message containing every fragment.
void rejects(const std::string& text, const std::vector<std::string>& fragments) {
  INFO("manifest text:\n" << text);
  const kiln::Error e = expect_error([&] { kiln::parse_manifest(text, "test.json"); });
  CHECK(e.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(e.what(), Contains("manifest test.json"));  // the source is named
  // A wrapped policy or key error keeps its own words but not a second "kiln [code]:" prefix.
  const std::string what = e.what();
  CHECK(what.find("kiln [", 1) == std::string::npos);
  for (const auto& f : fragments) CHECK_THAT(e.what(), Contains(f));
}

}  // namespace

TEST_CASE("manifest: keys, policies and ranges expand (cartesian), duplicates removed", "[unit]") {
  const std::string dup = writer("pack", 32, "sm_90a").str();
  const std::string own_arch = writer("append", 128, "sm_120a").str();
  const json doc = {
      {"comment", "test"},
      {"archs", {"sm_90a", "sm_120a"}},
      {"keys", {dup, own_arch, dup}},
      {"policies",
       {{{"family", "nvfp4_writer"}, {"policy", {{"op", {"pack", "append"}}, {"page_size", {32, 64}}}}},
        // Its own archs replace the top-level ones; a scalar field does not expand.
        {{"family", "nvfp4_writer"}, {"archs", {"sm_120a"}}, {"policy", {{"op", "pack"}, {"page_size", {2, 32}}}}}}}};
  const auto keys = kiln::parse_manifest(doc.dump(2), "test.json");

  // keys first, in order, then each policy entry: every combination for every arch, no duplicates.
  const std::vector<std::string> expected = {
      dup,                                       // keys[0]; keys[2] is the same key
      own_arch,                                  // keys[1]: a key keeps its own arch
      writer("append", 32, "sm_90a").str(),      // policies[0]: 2 ops x 2 pages x 2 archs,
      writer("append", 32, "sm_120a").str(),     //   minus pack/32/sm_90a (already listed)
      writer("append", 64, "sm_90a").str(),
      writer("append", 64, "sm_120a").str(),
      writer("pack", 32, "sm_120a").str(),
      writer("pack", 64, "sm_90a").str(),
      writer("pack", 64, "sm_120a").str(),
      writer("pack", 2, "sm_120a").str(),        // policies[1]: only sm_120a; pack/32/sm_120a is a duplicate
  };
  const std::vector<std::string> got = strs(keys);
  CHECK(std::set<std::string>(got.begin(), got.end()).size() == got.size());
  CHECK(std::set<std::string>(got.begin(), got.end()) == std::set<std::string>(expected.begin(), expected.end()));
  CHECK(got.size() == expected.size());
  REQUIRE(got.size() >= 2);
  CHECK(got[0] == dup);
  CHECK(got[1] == own_arch);
}

TEST_CASE("manifest: --arch selects the entries that allow it and skips the others", "[unit]") {
  const json doc = {{"archs", {"sm_90a"}},
                    {"keys", {writer("pack", 64, "sm_90a").str(), writer("pack", 2, "sm_120a").str()}},
                    {"policies",
                     {{{"family", "nvfp4_writer"}, {"archs", {"sm_90a"}}, {"policy", {{"op", {"pack", "append"}}}}},
                      {{"family", "nvfp4_writer"}, {"archs", {"sm_90a", "sm_120a"}}, {"policy", {{"page_size", {32, 128}}}}},
                      // No archs of its own: allowed on every arch, the requested ones replace the top level's.
                      {{"family", "nvfp4_writer"}, {"policy", {{"op", "pack"}, {"page_size", 8}}}}}}};

  const kiln::ManifestSelection only_120 = kiln::select_manifest(doc.dump(), "test.json", std::vector<std::string>{"sm_120a"});
  const std::vector<std::string> expected_120 = {writer("pack", 2, "sm_120a").str(), writer("append", 32, "sm_120a").str(),
                                                 writer("append", 128, "sm_120a").str(), writer("pack", 8, "sm_120a").str()};
  CHECK(strs(only_120.keys) == expected_120);
  // keys[0] names sm_90a only, policies[0] allows sm_90a only: nothing of theirs is compiled for sm_120a.
  REQUIRE(only_120.skipped.size() == 2);
  CHECK(only_120.skipped[0].entry == "keys[0]");
  CHECK(only_120.skipped[0].keys == 1);
  CHECK(only_120.skipped[0].archs == std::vector<std::string>{"sm_90a"});
  CHECK(only_120.skipped[1].entry == "policies[0]");
  CHECK(only_120.skipped[1].family == "nvfp4_writer");
  CHECK(only_120.skipped[1].keys == 2);
  CHECK(only_120.skipped[1].archs == std::vector<std::string>{"sm_90a"});
  CHECK(kiln::parse_manifest(doc.dump(), "test.json", std::vector<std::string>{"sm_120a"}) == only_120.keys);

  const kiln::ManifestSelection only_90 = kiln::select_manifest(doc.dump(), "test.json", std::vector<std::string>{"sm_90a"});
  const std::vector<std::string> expected_90 = {writer("pack", 64, "sm_90a").str(), writer("append", 64, "sm_90a").str(),
                                                writer("append", 32, "sm_90a").str(), writer("append", 128, "sm_90a").str(),
                                                writer("pack", 8, "sm_90a").str()};
  CHECK(strs(only_90.keys) == expected_90);  // pack/64 from keys[0] and from policies[0] is one key
  REQUIRE(only_90.skipped.size() == 1);
  CHECK(only_90.skipped[0].entry == "keys[1]");

  // Both archs: every entry keeps the archs it allows; nothing is skipped. Without --arch, the
  // arch-less entry takes the top-level list.
  const kiln::ManifestSelection both =
      kiln::select_manifest(doc.dump(), "test.json", std::vector<std::string>{"sm_90a", "sm_120a"});
  CHECK(both.skipped.empty());
  CHECK(both.keys.size() == 9);
  const kiln::ManifestSelection plain = kiln::select_manifest(doc.dump(), "test.json");
  CHECK(plain.skipped.empty());
  CHECK(plain.keys.size() == 8);  // pack/8 for sm_90a only

  // --arch makes a manifest without archs usable.
  const json no_archs = {{"policies", {{{"family", "nvfp4_writer"}, {"policy", json::object()}}}}};
  CHECK(strs(kiln::parse_manifest(no_archs.dump(), "t", std::vector<std::string>{"sm_90a"})) ==
        std::vector<std::string>{SemanticKey("nvfp4_writer", json::object(), "sm_90a").str()});

  // A skipped entry is still validated.
  const json bad = {{"policies", {{{"family", "nvfp4_writer"}, {"archs", {"sm_90a"}}, {"policy", {{"page_size", 0}}}}}}};
  const kiln::Error e = expect_error([&] { kiln::select_manifest(bad.dump(), "t", std::vector<std::string>{"sm_120a"}); });
  CHECK(e.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(e.what(), Contains("page_size"));
}

TEST_CASE("manifest: the default manifest's sm_120a-only policies are skipped for sm_90a", "[unit]") {
  const std::string_view text = kiln::tools::default_manifest();
  const kiln::ManifestSelection all = kiln::select_manifest(text, "(default)");
  const kiln::ManifestSelection sm90 = kiln::select_manifest(text, "(default)", std::vector<std::string>{"sm_90a"});
  const kiln::ManifestSelection sm120 = kiln::select_manifest(text, "(default)", std::vector<std::string>{"sm_120a"});
  CHECK(all.skipped.empty());
  // Each arch gets exactly the keys the plain manifest lists for it, and the skipped entries account
  // for every key the plain manifest lists for the other arch only.
  std::vector<std::string> all_90, all_120;
  for (const SemanticKey& k : all.keys) (k.arch() == "sm_90a" ? all_90 : all_120).push_back(k.str());
  std::set<std::string> got_90, got_120;
  for (const SemanticKey& k : sm90.keys) got_90.insert(k.str());
  for (const SemanticKey& k : sm120.keys) got_120.insert(k.str());
  CHECK(got_90 == std::set<std::string>(all_90.begin(), all_90.end()));
  CHECK(got_120 == std::set<std::string>(all_120.begin(), all_120.end()));
  CHECK(sm90.keys.size() == all_90.size());
  std::size_t skipped_90 = 0, skipped_120 = 0;
  for (const auto& s : sm90.skipped) {
    CHECK(s.archs == std::vector<std::string>{"sm_120a"});
    skipped_90 += s.keys;
  }
  for (const auto& s : sm120.skipped) {
    CHECK(s.archs == std::vector<std::string>{"sm_90a"});
    skipped_120 += s.keys;
  }
  // Here no sm_120a-only policy has an sm_90a twin (and the other way round), so the skipped keys are
  // exactly the keys without a twin on the other arch.
  const auto without_twin = [](const std::vector<std::string>& keys, const std::set<std::string>& other, const char* arch) {
    std::size_t n = 0;
    for (const auto& k : keys) n += other.count(SemanticKey::parse(k).with_arch(arch).str()) == 0;
    return n;
  };
  CHECK(skipped_90 == without_twin(all_120, got_90, "sm_90a"));
  CHECK(skipped_120 == without_twin(all_90, got_120, "sm_120a"));
  CHECK(skipped_90 > 0);
  CHECK(skipped_120 > 0);
}

TEST_CASE("manifest: the default sparse_dsv41 policies are the variants the launcher picks, on both targets", "[unit]") {
  // (arch, heads, has_extra, split) -> the variants listed for it.
  std::map<std::string, std::set<std::string>> listed;
  for (const SemanticKey& k : kiln::parse_manifest(kiln::tools::default_manifest(), "(default)")) {
    if (k.family() != "sparse_dsv41") continue;
    const json& p = k.policy();
    listed[k.arch() + " " + p["heads"].dump() + " " + p["has_extra"].dump() + " " + p["split"].dump()].insert(p["variant"].get<std::string>());
  }
  // H 64 and 128, with and without the extra cache, split or not, on each of two targets.
  CHECK(listed.size() == 2 * 2 * 2 * 2);
  for (const auto& [shape, variants] : listed) {
    INFO(shape);
    const std::string arch = shape.substr(0, shape.find(' '));
    std::set<std::string> want;
    for (const auto v : kiln::dsv41::dsv41_variants_for(arch, std::stoi(shape.substr(arch.size() + 1)))) {
      want.insert(kiln::dsv41::dsv41_variant_name(v));
    }
    CHECK(variants == want);
  }
}

TEST_CASE("manifest: an empty manifest gives no keys", "[unit]") {
  CHECK(kiln::parse_manifest("{}", "test.json").empty());
  CHECK(kiln::parse_manifest(R"({"archs": ["sm_90a"], "keys": [], "policies": []})", "test.json").empty());
}

TEST_CASE("manifest: broken JSON names line and column", "[unit]") {
  // The stray 'x' is on line 3, column 3 (1-based).
  rejects("{\n  \"archs\": [\"sm_90a\"],\n  x\n}\n", {"line 3, column 3", "syntax error"});
  // An unexpected second number: the '2' is on line 2, column 14.
  rejects("{\n  \"keys\": [1 2]\n}\n", {"line 2, column 14"});
  // Input that ends early: the error is at the start of the (empty) third line.
  rejects("{\n  \"archs\": [\n", {"line 3, column 1"});
  // First line, first column.
  rejects("]", {"line 1, column 1"});
}

TEST_CASE("manifest: structural errors name the problem", "[unit]") {
  rejects(R"({"archs": ["sm_90a"], "kyes": []})", {"unknown field 'kyes'"});
  rejects(R"([1, 2])", {"top level must be a JSON object"});
  rejects(R"({"archs": ["sm_42"], "policies": []})", {"'sm_42'", "sm_90a"});
  rejects(R"({"archs": ["sm_90a"], "policies": [{"family": "nvfp4_writer", "archs": ["sm_80"], "policy": {}}]})", {"'sm_80'"});
  rejects(R"({"archs": []})", {"archs must be a non-empty list"});
  rejects(R"({"keys": ["nvfp4_writer:sm_90a:op=pack,page_size=64:0000000000000000"]})", {"keys[0]", "does not match"});
  rejects(R"({"keys": ["garbage"]})", {"keys[0]", "cannot parse semantic key"});
  rejects(R"({"keys": [42]})", {"keys[0] is not a string"});
  rejects(R"({"keys": "nvfp4_writer"})", {"keys must be a list"});
  rejects(R"({"archs": ["sm_90a"], "policies": [{"family": "nope", "policy": {}}]})", {"policies[0]", "unknown kernel family 'nope'"});
  rejects(R"({"archs": ["sm_90a"], "policies": [{"family": "nvfp4_writer", "policy": {"page_size": [64, 0]}}]})",
          {"policies[0]", "page_size"});
  rejects(R"({"archs": ["sm_90a"], "policies": [{"policy": {}}]})", {"policies[0] needs \"family\""});
  rejects(R"({"policies": [{"family": "nvfp4_writer", "policy": {}}]})", {"policies[0] names no archs"});
  rejects(R"({"archs": ["sm_90a"], "policies": [{"family": "nvfp4_writer", "policy": {"op": [], "page_size": 64}}]})",
          {"policies[0]", "field 'op' lists no values"});
  rejects(R"({"version": 2, "keys": []})", {"version 2", "reads version 1"});
  rejects(R"({"version": "1", "keys": []})", {"version \"1\""});
  CHECK(kiln::parse_manifest(R"({"version": 1, "comment": "ok", "keys": []})", "test.json").empty());
}

TEST_CASE("manifest: a policy's lists are capped at 10,000 combinations and a bad field fails on the first", "[unit]") {
  const auto entry = [](int lists) {
    json policy = {{"op", "pack"}};
    for (int i = 0; i < lists; ++i) policy[fmt::format("f{}", i)] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    return json{{"archs", {"sm_90a"}}, {"policies", {{{"family", "nvfp4_writer"}, {"policy", policy}}}}}.dump();
  };
  rejects(entry(5), {"policies[0]", "expands to more than 10000 policies"});
  // 10^4 combinations are allowed, and the unknown field is reported from the first one: the error
  // names f0 = 0 (a policy built after the others would name its last values).
  rejects(entry(4), {"policies[0]", "\"f0\":0", "\"f3\":0", "f0"});
  // A value repeated in a list names the same keys again: it counts once towards the cap.
  json repeated = {{"op", "pack"}, {"page_size", json::array()}};
  for (int i = 0; i < 20000; ++i) repeated["page_size"].push_back(64);
  const auto keys = kiln::parse_manifest(
      json{{"archs", {"sm_90a"}}, {"policies", {{{"family", "nvfp4_writer"}, {"policy", repeated}}}}}.dump(), "test.json");
  CHECK(strs(keys) == std::vector<std::string>{writer("pack", 64, "sm_90a").str()});
}

TEST_CASE("manifest: load_manifest of a missing file is kNotFound naming the path", "[unit]") {
  TempDir dir;
  const fs::path missing = dir.path() / "no_such_manifest.json";
  const kiln::Error e = expect_error([&] { kiln::load_manifest(missing); });
  CHECK(e.code() == ErrorCode::kNotFound);
  CHECK_THAT(e.what(), Contains(missing.string()));
  CHECK(e.details().path == missing.string());
}

TEST_CASE("manifest: load_manifest names the file in parse errors", "[unit]") {
  TempDir dir;
  const fs::path file = dir.path() / "broken.json";
  write_text(file, "{\n  \"archs\": [\"sm_90a\",]\n}\n");
  const kiln::Error e = expect_error([&] { kiln::load_manifest(file); });
  CHECK(e.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(e.what(), Contains(file.string()));
  CHECK_THAT(e.what(), Contains("line 2, column 22"));
}

TEST_CASE("manifest: append_to_manifest creates, extends, deduplicates, and parses back", "[unit]") {
  TempDir dir;
  const fs::path file = dir.path() / "misses.json";
  const SemanticKey a = writer("pack", 64, "sm_90a");
  const SemanticKey b = writer("append", 2, "sm_120a");

  kiln::append_to_manifest(file, a);
  REQUIRE(fs::exists(file));
  CHECK(strs(kiln::load_manifest(file)) == std::vector<std::string>{a.str()});

  kiln::append_to_manifest(file, b);
  kiln::append_to_manifest(file, a);  // already recorded: not added twice
  CHECK(strs(kiln::load_manifest(file)) == (std::vector<std::string>{a.str(), b.str()}));

  // The file is plain JSON with a "keys" list, and no temp file is left behind.
  std::ifstream in(file);
  const json doc = json::parse(in);
  CHECK(doc.at("keys") == json({a.str(), b.str()}));
  CHECK_FALSE(fs::exists(file.string() + ".tmp"));

  // Appending to an existing hand-written manifest keeps its other entries.
  const fs::path hand = dir.path() / "hand.json";
  write_text(hand, json({{"archs", {"sm_90a"}}, {"policies", {{{"family", "nvfp4_writer"}, {"policy", {{"op", "pack"}}}}}}}).dump());
  kiln::append_to_manifest(hand, b);
  const auto keys = strs(kiln::load_manifest(hand));
  CHECK(std::set<std::string>(keys.begin(), keys.end()) == std::set<std::string>{a.str(), b.str()});
}
