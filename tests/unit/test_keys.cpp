// SemanticKey (printable, parseable, validated policies) and CacheKey (content address of a cubin).
//
// Golden values are hard-coded on purpose: any change to the key format or the hashing must show up
// here as a failing test and be made deliberately (bump kCacheSchemaVersion, update the goldens).
// The cross-process checks re-run this binary (/proc/self/exe) with the hidden test "kiln_key_probe",
// started from another cwd with another TZ and HOME, so no process state, path or time can leak in.
#include <sys/wait.h>
#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/jit/build_request.h"
#include "kiln/jit/cache_key.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/jit/template_bundle.h"
#include "tests/support/expect_error.h"
#include "tests/support/files.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using kiln::CacheKey;
using kiln::ErrorCode;
using kiln::SemanticKey;
using kiln::testing::expect_error;
using kiln::testing::read_text;
using nlohmann::json;

namespace {

// The fixed writer key whose printable form (and so its digest) is golden.
constexpr const char* kGoldenWriterKey = "nvfp4_writer:sm_90a:op=pack,page_size=64:b9d99c6ca8170019";
// compute_cache_key over golden_inputs() below.
constexpr const char* kGoldenCacheKey = "45d107df3bd39159c4bd55e8147e6d41";

SemanticKey golden_writer_key() { return SemanticKey("nvfp4_writer", {{"op", "pack"}, {"page_size", 64}}, "sm_90a"); }

// Synthetic inputs that do not depend on NVRTC or the templates, so the golden value is stable
// across toolkits and template edits and changes only if the hashing itself changes.
std::string golden_cache_key_hex() {
  const std::vector<std::string> names = {"kiln::golden_kernel<64, true>"};
  const std::vector<std::string> options = {"-std=c++17", "-DKILN_NVRTC=1"};
  return kiln::compute_cache_key({.source = "#include \"golden/kernel.cuh\"\n",
                                  .name_expressions = names,
                                  .template_bundle = "golden template bundle bytes",
                                  .nvrtc_major = 12,
                                  .nvrtc_minor = 8,
                                  .options = options,
                                  .arch = "sm_90a"})
      .hex();
}

struct TempDir : kiln::testing::TempDir {
  TempDir() : kiln::testing::TempDir("kiln_keys_test") {}
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Runs this test binary's hidden probe in a fresh process with the given cwd and environment
// overrides; returns the lines it wrote.
std::vector<std::string> run_probe(const fs::path& cwd, const std::map<std::string, std::string>& env_overrides) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const fs::path out = cwd / "probe.out";
  kiln::testing::Environment env = kiln::testing::current_environment();
  for (const auto& [k, v] : env_overrides) env[k] = v;
  env["KILN_KEY_PROBE_OUT"] = out.string();
  // Keep the probe's Catch2 report out of this test's output.
  const kiln::testing::ProcessResult r = kiln::testing::Subprocess({.argv = {self.string(), "kiln_key_probe"},
                                                                    .env = env,
                                                                    .stdout_file = "probe.log",
                                                                    .stderr_file = "probe.log",
                                                                    .cwd = cwd})
                                             .wait();
  INFO("probe process status " << r.wait_status);
  REQUIRE(WIFEXITED(r.wait_status));
  REQUIRE(WEXITSTATUS(r.wait_status) == 0);
  return lines_of(read_text(out));
}

// Rebuilds template_bundle_bytes() from the embedded files, with `flip_file` (if any) having one
// byte at `flip_at` changed. Same framing as jit/template_bundle.cpp.
std::string bundle_with_flip(std::optional<std::size_t> flip_file, std::size_t flip_at) {
  std::string out;
  const auto files = kiln::embedded_templates();
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::string contents(files[i].contents);
    if (flip_file && *flip_file == i) contents[flip_at] = static_cast<char>(contents[flip_at] ^ 0x01);
    for (const std::string_view part : {files[i].name, std::string_view(contents)}) {
      const std::uint64_t n = part.size();
      out.append(reinterpret_cast<const char*>(&n), sizeof n);
      out.append(part);
    }
  }
  return out;
}

struct KeyParts {
  std::string source;
  std::vector<std::string> names;
  std::string bundle;
  int major;
  int minor;
  std::vector<std::string> options;
  std::string arch;

  CacheKey key() const {
    return kiln::compute_cache_key({.source = source,
                                    .name_expressions = names,
                                    .template_bundle = bundle,
                                    .nvrtc_major = major,
                                    .nvrtc_minor = minor,
                                    .options = options,
                                    .arch = arch});
  }
};

KeyParts parts_of(const kiln::BuildRequest& r) {
  const kiln::NvrtcVersion v = kiln::Compiler::nvrtc_version();
  return KeyParts{r.source.source, r.source.name_expressions, std::string(kiln::template_bundle_bytes()), v.major, v.minor,
                  r.options, r.key.arch()};
}

}  // namespace

// Hidden (never listed, so ctest does not run it): the probe that the cross-process tests exec.
TEST_CASE("kiln_key_probe", "[.][probe]") {
  const char* out = std::getenv("KILN_KEY_PROBE_OUT");
  REQUIRE(out != nullptr);
  const SemanticKey key = golden_writer_key();
  std::ofstream(out) << golden_cache_key_hex() << "\n"
                     << key.str() << "\n"
                     << kiln::make_build_request(key).cache_key.hex() << "\n"
                     << kiln::make_build_request(key.with_arch("sm_120a")).cache_key.hex() << "\n"
                     << fs::current_path().string() << "\n";
}

TEST_CASE("semantic key: printable form starts with family and exact arch, and is golden", "[unit]") {
  const SemanticKey key = golden_writer_key();
  CHECK(key.str() == kGoldenWriterKey);
  CHECK_THAT(key.str(), StartsWith("nvfp4_writer:sm_90a:"));
  CHECK(key.family() == "nvfp4_writer");
  CHECK(key.arch() == "sm_90a");
  CHECK(key.policy() == json({{"op", "pack"}, {"page_size", 64}}));
  CHECK_THAT(key.with_arch("sm_120a").str(), StartsWith("nvfp4_writer:sm_120a:op=pack,page_size=64:"));
}

TEST_CASE("semantic key: parse(str()) round-trips and digests differ between keys", "[unit]") {
  std::set<std::string> digests;
  for (const char* op : {"pack", "append"}) {
    for (int page : {1, 2, 32, 64, 1024}) {
      for (const char* arch : {"sm_90a", "sm_120a"}) {
        const SemanticKey key("nvfp4_writer", {{"op", op}, {"page_size", page}}, arch);
        INFO(key.str());
        CHECK_THAT(key.str(), StartsWith(std::string("nvfp4_writer:") + arch + ":"));
        const SemanticKey back = SemanticKey::parse(key.str());
        CHECK(back == key);
        CHECK(back.str() == key.str());
        CHECK(back.policy() == key.policy());
        CHECK(back.family() == key.family());
        CHECK(back.arch() == key.arch());
        digests.insert(key.str().substr(key.str().rfind(':') + 1));
      }
    }
  }
  CHECK(digests.size() == 2 * 5 * 2);  // no two keys share a digest
}

TEST_CASE("semantic key: policy defaults are filled and field order does not matter", "[unit]") {
  const SemanticKey defaults("nvfp4_writer", json::object(), "sm_90a");
  CHECK(defaults == SemanticKey("nvfp4_writer", {{"page_size", 64}, {"op", "append"}}, "sm_90a"));
  CHECK(defaults.policy() == json({{"op", "append"}, {"page_size", 64}}));
}

TEST_CASE("semantic key: parse rejects malformed text with a message naming the problem", "[unit]") {
  const std::string good = kGoldenWriterKey;
  const std::string body = good.substr(0, good.rfind(':'));
  const auto rejects = [](const std::string& text, const std::vector<std::string>& fragments) {
    INFO("parsing '" << text << "'");
    const kiln::Error e = expect_error([&] { SemanticKey::parse(text); });
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    for (const auto& f : fragments) CHECK_THAT(e.what(), Contains(f));
  };

  SECTION("bad digest") {
    rejects(body + ":b9d99c6ca8170018", {"digest b9d99c6ca8170018 does not match", "b9d99c6ca8170019"});
    rejects(body + ":b9d99c6ca81700", {"does not match"});          // truncated
    rejects(body + ":zzzzzzzzzzzzzzzz", {"does not match"});        // not hex
    rejects(body + ":", {"does not match"});                        // empty
    rejects(good + "0", {"does not match"});                        // one digit too many
  }
  SECTION("non-canonical") {
    // Fields out of order, a default left out, a leading zero: each names the canonical key.
    rejects("nvfp4_writer:sm_90a:page_size=64,op=pack:b9d99c6ca8170019", {"not in canonical form", good});
    rejects("nvfp4_writer:sm_90a:op=pack:b9d99c6ca8170019", {"not in canonical form", good});
    rejects("nvfp4_writer:sm_90a:op=pack,page_size=064:b9d99c6ca8170019", {"not in canonical form", good});
  }
  SECTION("garbage") {
    rejects("", {"cannot parse semantic key", "four ':'-separated parts"});
    rejects("garbage", {"cannot parse semantic key 'garbage'", "four ':'-separated parts"});
    rejects("nvfp4_writer:sm_90a", {"four ':'-separated parts"});
    rejects("nvfp4_writer:sm_90a:op=pack", {"four ':'-separated parts"});
    rejects("nvfp4_writer:sm_90a:op:b9d99c6ca8170019", {"field 'op' is not name=value"});
    rejects("nvfp4_writer:sm_90a:=pack:b9d99c6ca8170019", {"is not name=value"});
  }
  SECTION("unknown family") {
    rejects("no_such_family:sm_90a:op=pack:0123456789abcdef", {"unknown kernel family 'no_such_family'", "nvfp4_writer"});
  }
  SECTION("unknown arch") {
    rejects("nvfp4_writer:sm_42:op=pack,page_size=64:b9d99c6ca8170019", {"'sm_42' is not a supported target", "sm_90a", "sm_120a"});
    rejects("nvfp4_writer:sm_90:op=pack,page_size=64:b9d99c6ca8170019", {"'sm_90'"});  // the "a" target is exact
  }
  SECTION("invalid policy inside a key") {
    rejects("nvfp4_writer:sm_90a:op=pack,page_size=0:b9d99c6ca8170019", {"page_size"});
    rejects("nvfp4_writer:sm_90a:op=copy,page_size=64:b9d99c6ca8170019", {"'op'", "copy"});
  }
}

TEST_CASE("semantic key: nvfp4_writer policy validation names the field", "[unit]") {
  const auto rejects = [](const json& policy, const std::vector<std::string>& fragments) {
    INFO("policy " << policy.dump());
    const kiln::Error e = expect_error([&] { SemanticKey("nvfp4_writer", policy, "sm_90a"); });
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    for (const auto& f : fragments) CHECK_THAT(e.what(), Contains(f));
  };
  rejects({{"op", "pack"}, {"pages", 64}}, {"no field 'pages'", "op, page_size"});
  rejects({{"op", "copy"}}, {"'op'", "\"copy\"", "pack", "append"});
  rejects({{"op", 1}}, {"'op'"});
  rejects({{"page_size", 0}}, {"'page_size'", "[1, 1024]", "got 0"});
  rejects({{"page_size", 5000}}, {"'page_size'", "got 5000"});
  rejects({{"page_size", -64}}, {"'page_size'"});
  rejects({{"page_size", "64"}}, {"'page_size'"});  // a string is not an integer
  rejects({{"page_size", 64.5}}, {"'page_size'"});
  rejects(json::array({1, 2}), {"must be a JSON object"});
  // Boundaries are accepted.
  CHECK_NOTHROW(SemanticKey("nvfp4_writer", {{"page_size", 1}}, "sm_90a"));
  CHECK_NOTHROW(SemanticKey("nvfp4_writer", {{"page_size", 1024}}, "sm_90a"));
  // And the family and arch themselves are validated in the constructor.
  CHECK(expect_error([] { SemanticKey("nope", json::object(), "sm_90a"); }).code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(expect_error([] { SemanticKey("nvfp4_writer", json::object(), "sm_80"); }).what(), Contains("'sm_80'"));
}

TEST_CASE("cache key: hex form and parse_hex", "[unit]") {
  const CacheKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  CHECK(k.hex() == "0123456789abcdeffedcba9876543210");
  CHECK(CacheKey::parse_hex(k.hex()) == k);
  CHECK(CacheKey::parse_hex("0123456789ABCDEFFEDCBA9876543210") == k);
  CHECK_FALSE(CacheKey::parse_hex("0123456789abcdeffedcba987654321").has_value());    // 31 digits
  CHECK_FALSE(CacheKey::parse_hex("0123456789abcdeffedcba98765432100").has_value());  // 33 digits
  CHECK_FALSE(CacheKey::parse_hex("0123456789abcdefgedcba9876543210").has_value());   // 'g'
}

TEST_CASE("cache key: is XXH3-128 over the length-prefixed inputs", "[unit]") {
  // The documented framing, spelled out byte by byte: a second, independent derivation of the golden.
  std::string stream;
  const auto u64 = [&](std::uint64_t v) { stream.append(reinterpret_cast<const char*>(&v), sizeof v); };
  const auto bytes = [&](std::string_view b) {
    u64(b.size());
    stream.append(b);
  };
  bytes("kiln-cache-key");
  u64(kiln::kCacheSchemaVersion);
  bytes("#include \"golden/kernel.cuh\"\n");
  u64(1);
  bytes("kiln::golden_kernel<64, true>");
  bytes("golden template bundle bytes");
  u64(12);
  u64(8);
  u64(2);
  bytes("-std=c++17");
  bytes("-DKILN_NVRTC=1");
  bytes("sm_90a");
  const XXH128_hash_t h = XXH3_128bits(stream.data(), stream.size());
  CHECK(CacheKey{h.high64, h.low64}.hex() == kGoldenCacheKey);
  CHECK(kiln::kCacheSchemaVersion == 1);  // bumping it must come with new goldens
}

TEST_CASE("cache key: golden value for fixed inputs, in this and in separate processes", "[unit]") {
  const std::string here = golden_cache_key_hex();
  CHECK(here == kGoldenCacheKey);
  const std::string request_here = kiln::make_build_request(golden_writer_key()).cache_key.hex();
  const std::string request_120_here = kiln::make_build_request(golden_writer_key().with_arch("sm_120a")).cache_key.hex();

  // Two fresh processes, different cwd (one nested deeper), TZ and HOME: identical keys everywhere.
  TempDir a, b;
  const fs::path deep = b.path() / "some" / "deeper" / "dir";
  fs::create_directories(deep);
  const auto first = run_probe(a.path(), {{"TZ", "UTC"}, {"HOME", a.path().string()}});
  const auto second = run_probe(deep, {{"TZ", "Pacific/Chatham"}, {"HOME", "/nonexistent"}, {"LC_ALL", "C"}});
  REQUIRE(first.size() == 5);
  REQUIRE(second.size() == 5);
  CHECK(first[4] != second[4]);  // the probes really ran in different directories
  for (const auto& probe : {first, second}) {
    CHECK(probe[0] == kGoldenCacheKey);
    CHECK(probe[1] == kGoldenWriterKey);
    CHECK(probe[2] == request_here);
    CHECK(probe[3] == request_120_here);
  }
}

TEST_CASE("cache key: every input changes it", "[unit]") {
  const SemanticKey key = golden_writer_key();
  const kiln::BuildRequest request = kiln::make_build_request(key);
  const KeyParts base = parts_of(request);
  // The reconstruction must equal what make_build_request hashed, or the variations prove nothing.
  REQUIRE(base.key() == request.cache_key);
  REQUIRE(bundle_with_flip(std::nullopt, 0) == kiln::template_bundle_bytes());

  std::set<std::string> seen = {request.cache_key.hex()};
  const auto differs = [&](const CacheKey& k, const std::string& what) {
    INFO("changing " << what);
    CHECK(k != request.cache_key);
    CHECK(seen.insert(k.hex()).second);  // and differs from every other variation too
  };

  SECTION("policy fields and arch, through make_build_request") {
    differs(kiln::make_build_request(SemanticKey("nvfp4_writer", {{"op", "append"}, {"page_size", 64}}, "sm_90a")).cache_key, "op");
    differs(kiln::make_build_request(SemanticKey("nvfp4_writer", {{"op", "pack"}, {"page_size", 32}}, "sm_90a")).cache_key, "page_size");
    differs(kiln::make_build_request(key.with_arch("sm_120a")).cache_key, "arch (make_build_request)");
    // Same key again: same cache key (nothing random or time-dependent).
    CHECK(kiln::make_build_request(key).cache_key == request.cache_key);
  }
  SECTION("each raw input") {
    KeyParts p = base;
    p.arch = "sm_120a";
    differs(p.key(), "arch");
    p = base;
    p.source += " ";
    differs(p.key(), "source");
    p = base;
    REQUIRE_FALSE(p.names.empty());
    p.names[0].back() = p.names[0].back() == '>' ? ' ' : '>';
    differs(p.key(), "a name expression");
    p = base;
    p.names.push_back(p.names[0]);
    differs(p.key(), "the number of name expressions");
    p = base;
    p.options.push_back("-lineinfo");
    differs(p.key(), "an added option");
    p = base;
    REQUIRE_FALSE(p.options.empty());
    p.options[0] += "x";
    differs(p.key(), "an option's text");
    p = base;
    p.options.pop_back();
    differs(p.key(), "a removed option");
    p = base;
    p.minor += 1;
    differs(p.key(), "the NVRTC minor version");
    p = base;
    p.major += 1;
    differs(p.key(), "the NVRTC major version");
  }
  SECTION("one byte of any embedded template") {
    const auto files = kiln::embedded_templates();
    REQUIRE(files.size() > 0);
    for (std::size_t i = 0; i < files.size(); ++i) {
      REQUIRE_FALSE(files[i].contents.empty());
      for (const std::size_t at : {std::size_t{0}, files[i].contents.size() / 2, files[i].contents.size() - 1}) {
        KeyParts p = base;
        p.bundle = bundle_with_flip(i, at);
        differs(p.key(), std::string(files[i].name) + " byte " + std::to_string(at));
      }
    }
  }
  SECTION("field boundaries are unambiguous (length-prefixed)") {
    KeyParts p = base, q = base;
    p.options = {"-ab", "c"};
    q.options = {"-a", "bc"};
    CHECK(p.key() != q.key());
    p = base;
    q = base;
    p.source = base.source + "x";
    q.names[0] = "x" + base.names[0];
    p.names = base.names;
    CHECK(p.key() != q.key());
  }
}

TEST_CASE("cache key: no absolute path of this machine in the rendered source or options", "[unit]") {
  // Paths a leaky implementation could pick up: the binary's directories (build tree, checkout), cwd,
  // HOME and the temp dir.
  std::vector<std::string> paths;
  for (fs::path p = fs::read_symlink("/proc/self/exe").parent_path(); p.has_relative_path(); p = p.parent_path()) {
    paths.push_back(p.string());
  }
  paths.push_back(fs::current_path().string());
  if (const char* home = std::getenv("HOME"); home && *home) paths.push_back(home);
  paths.push_back(fs::temp_directory_path().string());

  for (const char* arch : {"sm_90a", "sm_120a"}) {
    for (const char* op : {"pack", "append"}) {
      const kiln::BuildRequest r = kiln::make_build_request(SemanticKey("nvfp4_writer", {{"op", op}, {"page_size", 64}}, arch));
      std::vector<std::string> texts = r.options;
      texts.push_back(r.source.source);
      for (const auto& n : r.source.name_expressions) texts.push_back(n);
      for (const auto& text : texts) {
        INFO("text: " << text);
        for (const auto& p : paths) {
          if (p.size() > 1) CHECK_THAT(text, !Contains(p));
        }
        // No token starts an absolute path: a '/' right after start, quote, '<', '=' or space.
        CHECK(text.rfind('/', 0) == std::string::npos);
        for (const char* lead : {"\"/", "</", "=/", " /", "\t/", "\n/"}) CHECK_THAT(text, !Contains(lead));
        CHECK_THAT(text, !Contains("__DATE__"));
        CHECK_THAT(text, !Contains("__TIME__"));
        CHECK_THAT(text, !Contains("__FILE__"));
      }
      // No debug or line info options (they would embed paths into the cubin).
      for (const auto& o : r.options) {
        CHECK(o != "-G");
        CHECK(o != "-lineinfo");
        CHECK_THAT(o, !StartsWith("--generate-line-info"));
        CHECK_THAT(o, !StartsWith("-I"));
      }
    }
  }
}

TEST_CASE("compiler: NVRTC's timing table is read out of the log and removed from it", "[unit]") {
  std::string log =
      "kiln_kernel.cu(3): warning #177-D: variable \"x\" was declared but never referenced\n\n"
      "File name, phase name, metric, unit\n"
      "kiln_kernel.cu, CUDA C++ Frontend, 383, ms\n"
      "kiln_kernel.cu, NVVM Optimizer, 3204, ms\n"
      "kiln_kernel.cu, PTX Translation, 2789, ms\n";
  const kiln::CompilePhases p = kiln::Compiler::take_phases(log);
  CHECK(p.front_end_ms == 383);
  CHECK(p.nvvm_ms == 3204);
  CHECK(p.ptxas_ms == 2789);
  CHECK(log == "kiln_kernel.cu(3): warning #177-D: variable \"x\" was declared but never referenced");

  std::string only_table = "\nFile name, phase name, metric, unit\nkiln_kernel.cu, CUDA C++ Frontend, 7, ms\n";
  CHECK(kiln::Compiler::take_phases(only_table).front_end_ms == 7);
  CHECK(only_table.empty());

  std::string no_table = "kiln_kernel.cu(1): error: identifier \"y\" is undefined\n1 error detected";
  const std::string before = no_table;
  const kiln::CompilePhases none = kiln::Compiler::take_phases(no_table);
  CHECK(none.front_end_ms + none.nvvm_ms + none.ptxas_ms == 0);
  CHECK(no_table == before);

  // Every option a compile passes is hashed into the cache key (make_build_request uses this list).
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    const auto options = kiln::Compiler::canonical_options(arch);
    for (const char* o : {"--no-cache", "--time=-", "--frandom-seed=0", "--ptxas-options=--split-compile=4"}) CHECK(std::find(options.begin(), options.end(), o) != options.end());
    // NVVM's split compilation leaves sm_90a machine code as it is and changes sm_120a's.
    CHECK((std::find(options.begin(), options.end(), "--split-compile=4") != options.end()) == (std::string(arch) == "sm_90a"));
  }
}
