#pragma once
// The properties each fuzz target checks, shared with tests/unit/test_fuzz_regressions.cpp so a
// saved crash input replays through exactly the code the fuzzer ran.
//
// A parser may reject any input, but only with kiln::Error of its documented code; anything else
// (another exception type, another code, a crash, a sanitizer report) is a bug. Accepted input
// must round-trip. A violated property throws PropertyViolation, which libFuzzer reports as a
// crash (uncaught exception -> abort) and Catch2 as a failed test.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/cache_entry.h"
#include "kiln/cache/remote_value.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/manifest.h"

namespace kiln::fuzz {

struct PropertyViolation : std::logic_error {
  using std::logic_error::logic_error;
};

inline void expect(bool ok, const std::string& what) {
  if (!ok) throw PropertyViolation(what);
}

inline void expect_code(const Error& e, ErrorCode code, std::string_view parser) {
  expect(e.code() == code, std::string(parser) + " threw kiln::Error with an unexpected code: " + e.what());
}

// Text naming a policy: malformed input is kInvalidArgument; a well-formed value that a family's rule
// marks as not implemented (e.g. an MLA page size of 126) is kUnsupported.
inline void expect_policy_code(const Error& e, std::string_view parser) {
  expect(e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kUnsupported,
         std::string(parser) + " threw kiln::Error with an unexpected code: " + e.what());
}

// The key the seed entries were written for (fixed, so the fuzzer can reach the key-echo check).
inline constexpr CacheKey kFuzzKey{0x0123456789abcdefull, 0xfedcba9876543210ull};

// Header-only so the regression unit test replays inputs without another library target.
inline std::string with_checksum(std::string_view payload) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(payload.data(), payload.size()));
  return std::string(payload) + std::string(reinterpret_cast<const char*>(canon.digest), sizeof(canon.digest));
}

inline void check_decoded(const CacheEntry& e, std::string_view bytes, const CacheKey& expected) {
  expect(e.key == expected, "decode_entry accepted an entry whose key echo differs from the expected key");
  expect(!e.cubin.empty(), "decode_entry accepted an empty cubin");
  // Re-encoding and decoding gives the same entry (metadata JSON may be re-formatted, not changed).
  const CacheEntry again = decode_entry(encode_entry(e), expected);
  expect(again.semantic_key == e.semantic_key && again.cubin == e.cubin && again.metadata == e.metadata,
         "encode(decode(x)) does not decode to the same entry");
  const EntryHeader h = decode_entry_header(bytes);
  expect(h.key == e.key && h.semantic_key == e.semantic_key, "decode_entry_header disagrees with decode_entry");
}

// Input byte 0 picks the mode: odd -> the rest is a frame *without* its checksum and the harness
// appends a correct one, so the fuzzer gets past the checksum into lengths, key echo and metadata
// JSON; even -> the rest is a whole file as read from disk.
inline void check_entry_input(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return;
  const bool fix_checksum = (data[0] & 1) != 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string bytes = fix_checksum ? with_checksum(rest) : std::string(rest);
  // Expect the key the frame echoes when its header reads, so a decode can succeed.
  CacheKey expected = kFuzzKey;
  try {
    expected = decode_entry_header(bytes).key;
  } catch (const Error& e) {
    expect_code(e, ErrorCode::kCacheCorrupt, "decode_entry_header");
  }
  for (const CacheKey& key : {expected, kFuzzKey}) {
    try {
      const CacheEntry entry = decode_entry(bytes, key);
      check_decoded(entry, bytes, key);
    } catch (const Error& e) {
      expect_code(e, ErrorCode::kCacheCorrupt, "decode_entry");
    }
    // The same bytes as a value read from the remote tier: without a secret it decodes like a
    // frame (after an optional signature trailer); with one, no input can carry a valid tag.
    try {
      decode_remote_value(bytes, key, "");
    } catch (const Error& e) {
      expect_code(e, ErrorCode::kCacheCorrupt, "decode_remote_value");
    }
    try {
      decode_remote_value(bytes, key, "fuzz secret");
      expect(false, "decode_remote_value accepted a value without a valid HMAC tag");
    } catch (const Error& e) {
      expect_code(e, ErrorCode::kCacheCorrupt, "decode_remote_value");
    }
  }
}

// Input byte 0, bit 0: also parse with an --arch override.
inline void check_manifest_input(const std::uint8_t* data, std::size_t size) {
  register_builtin_families();
  if (size == 0) return;
  const bool override_archs = (data[0] & 1) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::optional<std::vector<std::string>> archs;
  if (override_archs) archs = std::vector<std::string>{"sm_120a"};
  try {
    const std::vector<SemanticKey> keys = parse_manifest(text, "fuzz", archs);
    for (const SemanticKey& k : keys) {
      // Every key a manifest yields prints and parses back (manifests and logs name keys this way).
      expect(SemanticKey::parse(k.str()) == k, "a manifest key does not round-trip: " + k.str());
      if (override_archs) expect(k.arch() == "sm_120a", "--arch override not applied to " + k.str());
    }
  } catch (const Error& e) {
    expect_policy_code(e, "parse_manifest");
  }
}

inline void check_semantic_key_input(const std::uint8_t* data, std::size_t size) {
  register_builtin_families();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const SemanticKey k = SemanticKey::parse(text);
    expect(k.str() == text, "parse accepted a key that is not in canonical form");
    expect(SemanticKey(k.family(), k.policy(), k.arch()) == k, "a parsed key does not rebuild from its parts");
    // A valid key's companions are valid keys of its arch, without companions of their own.
    for (const SemanticKey& c : companion_keys(k)) {
      expect(SemanticKey::parse(c.str()) == c && c.arch() == k.arch() && companion_keys(c).empty(),
             "companion " + c.str() + " of " + k.str() + " is not a plain key of the same arch");
    }
  } catch (const Error& e) {
    expect_policy_code(e, "SemanticKey::parse");
  }
}

}  // namespace kiln::fuzz
