// The framed cache-entry format: round trip and every kind of damage decode_entry must reject.
#include <fmt/format.h>
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>

#include "kiln/cache/cache_entry.h"
#include "kiln/jit/error.h"

namespace {

using kiln::CacheEntry;
using kiln::CacheKey;

const CacheKey kKeyA{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
const CacheKey kKeyB{0x1111111111111111ULL, 0x2222222222222222ULL};

CacheEntry sample_entry(const CacheKey& key = kKeyA) {
  CacheEntry e;
  e.key = key;
  e.semantic_key = "nvfp4_writer/sm_90a/pack_hnd.3f9a";
  e.metadata = {{"nvrtc", "12.4"}, {"arch", "sm_90a"}, {"options", {"-std=c++17", "--use_fast_math"}},
                {"compile_ms", 412.5}, {"source", "#include <x.cuh>\ntemplate __global__ void k<1>();"},
                {"lowered_name", "_Z1kILi1EEvv"}};
  for (int i = 0; i < 300; ++i) e.cubin.push_back(static_cast<char>(i * 7 + 3));
  e.cubin[10] = '\0';  // cubins are binary; embedded NULs must survive
  return e;
}

// Reason (details().log) of the kCacheCorrupt error decode_entry throws; fails the test otherwise.
std::string corrupt_reason(std::string_view bytes, const CacheKey& expected = kKeyA) {
  try {
    kiln::decode_entry(bytes, expected);
  } catch (const kiln::Error& e) {
    REQUIRE(e.code() == kiln::ErrorCode::kCacheCorrupt);
    CHECK(e.details().key == expected.hex());
    return e.details().log;
  }
  FAIL("decode_entry accepted damaged bytes");
  return {};
}

void put_le(std::string& s, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Builds a frame field by field (with a correct checksum), to reach the checks behind the checksum.
std::string hand_frame(std::uint64_t sem_len, std::string_view sem, std::uint64_t meta_len, std::string_view meta,
                       std::uint64_t cubin_len, std::string_view cubin, const CacheKey& key = kKeyA) {
  std::string s(kiln::kEntryMagic);
  put_le(s, kiln::kCacheSchemaVersion, 4);
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((key.hi >> (8 * i)) & 0xff));
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((key.lo >> (8 * i)) & 0xff));
  put_le(s, sem_len, 4);
  s += sem;
  put_le(s, meta_len, 8);
  s += meta;
  put_le(s, cubin_len, 8);
  s += cubin;
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(s.data(), s.size()));
  s.append(reinterpret_cast<const char*>(c.digest), 16);
  return s;
}

}  // namespace

TEST_CASE("cache entry: encode then decode returns every field unchanged", "[unit][cache]") {
  const CacheEntry e = sample_entry();
  const std::string bytes = kiln::encode_entry(e);
  const CacheEntry d = kiln::decode_entry(bytes, kKeyA);
  CHECK(d.key == e.key);
  CHECK(d.semantic_key == e.semantic_key);
  CHECK(d.metadata == e.metadata);
  CHECK(d.cubin == e.cubin);
  CHECK(bytes.substr(0, 8) == std::string("KILNCUB\0", 8));
  CHECK(kiln::encode_entry(d) == bytes);  // deterministic framing
}

TEST_CASE("cache entry: the key echo reads like CacheKey::hex()", "[unit][cache]") {
  const std::string bytes = kiln::encode_entry(sample_entry());
  std::string echo_hex;
  for (int i = 12; i < 28; ++i) echo_hex += fmt::format("{:02x}", static_cast<unsigned char>(bytes[i]));
  CHECK(echo_hex == kKeyA.hex());
  const kiln::EntryHeader h = kiln::decode_entry_header(bytes.substr(0, 100));
  CHECK(h.key == kKeyA);
  CHECK(h.semantic_key == sample_entry().semantic_key);
}

TEST_CASE("cache entry: an empty input is rejected as an empty file", "[unit][cache]") {
  CHECK(corrupt_reason("") == "empty file");
}

TEST_CASE("cache entry: every truncation point is rejected", "[unit][cache]") {
  const std::string bytes = kiln::encode_entry(sample_entry());
  for (std::size_t cut = 1; cut < bytes.size(); ++cut) {
    INFO("cut at " << cut << " of " << bytes.size());
    const std::string reason = corrupt_reason(std::string_view(bytes).substr(0, cut));
    CHECK(!reason.empty());
  }
  // A cut inside the fixed header names the truncation itself.
  CHECK_THAT(corrupt_reason(std::string_view(bytes).substr(0, 20)), Catch::Contains("truncated"));
}

TEST_CASE("cache entry: a flipped bit anywhere is rejected", "[unit][cache]") {
  const std::string bytes = kiln::encode_entry(sample_entry());
  for (std::size_t pos = 0; pos < bytes.size(); ++pos) {
    for (unsigned char mask : {0x01, 0x80}) {
      std::string bad = bytes;
      bad[pos] = static_cast<char>(static_cast<unsigned char>(bad[pos]) ^ mask);
      INFO("flip mask " << int(mask) << " at byte " << pos);
      CHECK(!corrupt_reason(bad).empty());
    }
  }
}

TEST_CASE("cache entry: damage is named precisely", "[unit][cache]") {
  const std::string good = kiln::encode_entry(sample_entry());
  SECTION("bad magic") {
    std::string bad = good;
    bad[0] = 'X';
    CHECK_THAT(corrupt_reason(bad), Catch::Contains("bad magic"));
  }
  SECTION("other schema version") {
    std::string bad = good;
    bad[8] = static_cast<char>(kiln::kCacheSchemaVersion + 1);
    CHECK_THAT(corrupt_reason(bad), Catch::Contains("schema version"));
  }
  SECTION("flipped byte in the cubin") {
    std::string bad = good;
    bad[bad.size() - 20] ^= 0x10;
    CHECK(corrupt_reason(bad) == "checksum mismatch");
  }
  SECTION("flipped byte in the key echo") {
    std::string bad = good;
    bad[15] ^= 0x01;
    CHECK(corrupt_reason(bad) == "checksum mismatch");
  }
  SECTION("entry of another key") {
    CHECK_THAT(corrupt_reason(good, kKeyB), Catch::StartsWith("key echo mismatch") && Catch::Contains(kKeyA.hex()));
  }
  SECTION("garbage bytes") {
    std::mt19937 rng(7);
    std::string garbage(4096, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    CHECK_THAT(corrupt_reason(garbage), Catch::Contains("bad magic"));
    CHECK_THAT(corrupt_reason("hello"), Catch::Contains("bad magic"));
  }
  SECTION("appended bytes") {
    // Valid checksum over a frame whose fields end early: the trailing data is reported.
    std::string frame = hand_frame(3, "abc", 2, "{}", 1, "x");
    std::string padded = frame.substr(0, frame.size() - 16) + "zz";
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(padded.data(), padded.size()));
    padded.append(reinterpret_cast<const char*>(c.digest), 16);
    CHECK_THAT(corrupt_reason(padded), Catch::Contains("unexpected bytes"));
  }
}

TEST_CASE("cache entry: huge length fields are rejected without allocating", "[unit][cache]") {
  // If decode trusted these lengths it would try to allocate exabytes; Catch would see bad_alloc.
  CHECK_THAT(corrupt_reason(hand_frame(0xffffffffULL, "abc", 2, "{}", 1, "x")), Catch::Contains("out of range"));
  CHECK_THAT(corrupt_reason(hand_frame(3, "abc", 0xffffffffffffffffULL, "{}", 1, "x")), Catch::Contains("out of range"));
  CHECK_THAT(corrupt_reason(hand_frame(3, "abc", 2, "{}", 1ULL << 62, "x")), Catch::Contains("out of range"));
  CHECK_THAT(corrupt_reason(hand_frame(3, "abc", 2, "{}", 2, "x")), Catch::Contains("out of range"));
}

TEST_CASE("cache entry: metadata that is not JSON is rejected", "[unit][cache]") {
  CHECK_THAT(corrupt_reason(hand_frame(3, "abc", 9, "{not json", 1, "x")), Catch::Contains("not valid JSON"));
}

TEST_CASE("cache entry: an empty cubin is neither written nor accepted", "[unit][cache]") {
  CacheEntry e = sample_entry();
  e.cubin.clear();
  REQUIRE_THROWS_AS(kiln::encode_entry(e), kiln::Error);
  CHECK_THAT(corrupt_reason(hand_frame(3, "abc", 2, "{}", 0, "")), Catch::Contains("empty cubin"));
}

TEST_CASE("cache entry: the error message names the key and says what to do", "[unit][cache]") {
  try {
    kiln::decode_entry("", kKeyA);
    FAIL("no throw");
  } catch (const kiln::Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains(kKeyA.hex()) && Catch::Contains("kiln verify"));
  }
}
