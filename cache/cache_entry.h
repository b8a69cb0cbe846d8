#pragma once
// CacheEntry: one compiled cubin plus what produced it, and its framed on-disk form.
//
// Frame (all integers little-endian):
//   magic "KILNCUB\0" (8) | u32 schema version | key echo (16: hi then lo, big-endian, so the bytes
//   read like CacheKey::hex()) | u32 semantic-key length + bytes | u64 metadata-JSON length + bytes |
//   u64 cubin length + bytes | XXH3-128 of everything before it (16, canonical big-endian).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/jit/cache_key.h"

namespace kiln {

struct CacheEntry {
  CacheKey key;
  std::string semantic_key;  // printable SemanticKey, so `kiln ls` can name the entry
  nlohmann::json metadata;   // NVRTC version, arch, options, compile time, source, lowered name
  std::string cubin;
};

inline constexpr std::string_view kEntryMagic{"KILNCUB\0", 8};
// Semantic keys are short readable strings; a longer length field can only be damage.
inline constexpr std::uint32_t kMaxSemanticKeyBytes = 64 * 1024;

// Throws Error(kInvalidArgument) for an entry that could never be decoded (empty cubin,
// oversized semantic key).
std::string encode_entry(const CacheEntry& entry);

// Throws Error(kCacheCorrupt) naming the first problem found; details().log holds the bare reason.
// Every length is checked against the bytes that remain before anything is allocated from it.
CacheEntry decode_entry(std::string_view bytes, const CacheKey& expected);

// The key echo and semantic key from the start of a frame, without the checksum (cheap listing).
// Throws Error(kCacheCorrupt) if that prefix is damaged or incomplete.
struct EntryHeader {
  CacheKey key;
  std::string semantic_key;
};
EntryHeader decode_entry_header(std::string_view prefix);

// Bytes decode_entry_header needs at most, for callers that read a prefix of the file.
inline constexpr std::size_t kEntryHeaderMaxBytes = 8 + 4 + 16 + 4 + kMaxSemanticKeyBytes;

}  // namespace kiln
