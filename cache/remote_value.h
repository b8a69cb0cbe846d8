#pragma once
// The value kiln stores in Redis for one cache key: the entry's frame (cache_entry.h), followed,
// when a secret is configured, by a signature trailer:
//   frame | HMAC-SHA256(secret, frame) (32) | "KILNSIG1" (8)
// The tag covers the whole frame, key echo included, so a validly signed entry moved under
// another key is still rejected (by the key echo check, after the tag check).
#include <string>
#include <string_view>

#include "kiln/cache/cache_entry.h"

namespace kiln {

inline constexpr std::string_view kSignatureMagic{"KILNSIG1", 8};
inline constexpr std::size_t kSignatureTagBytes = 32;

// Throws like encode_entry.
std::string encode_remote_value(const CacheEntry& entry, std::string_view secret);

// With a secret: the trailer must be present and its tag must match, before any byte of the frame
// is parsed. Without one: a trailer, if present, is ignored (nothing is trusted then anyway). Then
// the frame is decoded and checked like a disk entry. Throws Error(kCacheCorrupt); details().log
// holds the bare reason ("unsigned: ...", "mis-signed: ...", or decode_entry's reason).
CacheEntry decode_remote_value(std::string_view value, const CacheKey& expected, std::string_view secret);

}  // namespace kiln
