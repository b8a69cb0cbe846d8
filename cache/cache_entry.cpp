#include "kiln/cache/cache_entry.h"

#include <xxhash.h>

#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln {

namespace {

constexpr std::size_t kChecksumBytes = 16;
constexpr std::size_t kKeyBytes = 16;
// Smallest well-formed frame: empty semantic key and metadata, one cubin byte.
constexpr std::size_t kMinFrameBytes = 8 + 4 + kKeyBytes + 4 + 8 + 8 + 1 + kChecksumBytes;

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64_be(std::string& out, std::uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(std::string_view b, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
  return v;
}
std::uint64_t get_be64(std::string_view b) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(b[i]);
  return v;
}

std::string checksum_bytes(std::string_view data) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(data.data(), data.size()));
  return std::string(reinterpret_cast<const char*>(canon.digest), sizeof(canon.digest));
}

// Walks the frame; every take() is checked against what remains, so a damaged length field
// yields a reason instead of a huge allocation or an out-of-bounds read.
class FrameReader {
 public:
  explicit FrameReader(std::string_view bytes) : bytes_(bytes) {}

  std::optional<std::string_view> take(std::size_t n, std::string_view what) {
    if (n > bytes_.size() - pos_) {
      reason_ = fmt::format("truncated: {} needs {} bytes at offset {}, only {} remain", what, n, pos_,
                            bytes_.size() - pos_);
      return std::nullopt;
    }
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  std::optional<std::uint64_t> take_int(std::size_t n, std::string_view what) {
    auto b = take(n, what);
    if (!b) return std::nullopt;
    return get_le(*b, n);
  }

  std::size_t pos() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  const std::string& reason() const { return reason_; }
  void fail(std::string reason) { reason_ = std::move(reason); }

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
  std::string reason_;
};

[[noreturn]] void corrupt(const CacheKey& expected, const std::string& reason) {
  throw Error(ErrorCode::kCacheCorrupt,
              fmt::format("cache entry is corrupt: {}; delete the file or run `kiln verify`, which "
                          "quarantines bad entries so they are rebuilt",
                          reason),
              ErrorDetails{expected.hex(), "", reason});
}

// Magic, schema, key echo and semantic key: shared by decode_entry and decode_entry_header.
std::optional<EntryHeader> read_header(FrameReader& r) {
  auto magic = r.take(8, "magic");
  if (!magic) return std::nullopt;
  if (*magic != kEntryMagic) {
    r.fail("bad magic: not a kiln cache entry");
    return std::nullopt;
  }
  auto schema = r.take_int(4, "schema version");
  if (!schema) return std::nullopt;
  if (*schema != kCacheSchemaVersion) {
    r.fail(fmt::format("schema version {}, this kiln reads {}", *schema, kCacheSchemaVersion));
    return std::nullopt;
  }
  auto key = r.take(kKeyBytes, "key echo");
  if (!key) return std::nullopt;
  auto sem_len = r.take_int(4, "semantic key length");
  if (!sem_len) return std::nullopt;
  if (*sem_len > kMaxSemanticKeyBytes) {
    r.fail(fmt::format("semantic key length {} is out of range (max {})", *sem_len, kMaxSemanticKeyBytes));
    return std::nullopt;
  }
  auto sem = r.take(static_cast<std::size_t>(*sem_len), "semantic key");
  if (!sem) return std::nullopt;
  return EntryHeader{CacheKey{get_be64(key->substr(0, 8)), get_be64(key->substr(8, 8))}, std::string(*sem)};
}

// A length field larger than the bytes left is damage; reject before converting to size_t.
std::optional<std::size_t> take_length(FrameReader& r, std::string_view what) {
  auto len = r.take_int(8, fmt::format("{} length", what));
  if (!len) return std::nullopt;
  if (*len > r.remaining()) {
    r.fail(fmt::format("{} length {} is out of range (truncated file or damaged length field): only {} bytes "
                       "remain at offset {}",
                       what, *len, r.remaining(), r.pos()));
    return std::nullopt;
  }
  return static_cast<std::size_t>(*len);
}

}  // namespace

std::string encode_entry(const CacheEntry& entry) {
  if (entry.cubin.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "refusing to store an empty cubin; the compiler returned no code",
                ErrorDetails{entry.key.hex(), "", ""});
  }
  if (entry.semantic_key.size() > kMaxSemanticKeyBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("semantic key is {} bytes, the cache stores at most {}", entry.semantic_key.size(),
                            kMaxSemanticKeyBytes),
                ErrorDetails{entry.key.hex(), "", ""});
  }
  const std::string meta = entry.metadata.dump();
  std::string out;
  out.reserve(kMinFrameBytes + entry.semantic_key.size() + meta.size() + entry.cubin.size());
  out.append(kEntryMagic);
  put_u32(out, kCacheSchemaVersion);
  put_u64_be(out, entry.key.hi);
  put_u64_be(out, entry.key.lo);
  put_u32(out, static_cast<std::uint32_t>(entry.semantic_key.size()));
  out.append(entry.semantic_key);
  put_u64(out, meta.size());
  out.append(meta);
  put_u64(out, entry.cubin.size());
  out.append(entry.cubin);
  out.append(checksum_bytes(out));
  return out;
}

EntryHeader decode_entry_header(std::string_view prefix) {
  FrameReader r(prefix);
  auto header = read_header(r);
  if (!header) {
    throw Error(ErrorCode::kCacheCorrupt, fmt::format("cache entry header is corrupt: {}", r.reason()),
                ErrorDetails{"", "", r.reason()});
  }
  return std::move(*header);
}

CacheEntry decode_entry(std::string_view bytes, const CacheKey& expected) {
  if (bytes.empty()) corrupt(expected, "empty file");
  if (bytes.size() < kMinFrameBytes) {
    // Still name bad magic for short garbage, which is more useful than "too short".
    if (bytes.substr(0, std::min<std::size_t>(8, bytes.size())) != kEntryMagic.substr(0, std::min<std::size_t>(8, bytes.size())))
      corrupt(expected, "bad magic: not a kiln cache entry");
    corrupt(expected, fmt::format("truncated: {} bytes, a complete entry has at least {}", bytes.size(), kMinFrameBytes));
  }
  // The checksum is the last 16 bytes; the framed fields must end exactly where it starts.
  FrameReader r(bytes.substr(0, bytes.size() - kChecksumBytes));
  auto header = read_header(r);
  if (!header) corrupt(expected, r.reason());
  auto meta_len = take_length(r, "metadata");
  if (!meta_len) corrupt(expected, r.reason());
  std::string_view meta = *r.take(*meta_len, "metadata");
  auto cubin_len = take_length(r, "cubin");
  if (!cubin_len) corrupt(expected, r.reason());
  std::string_view cubin = *r.take(*cubin_len, "cubin");
  if (r.remaining() != 0) {
    corrupt(expected, fmt::format("{} unexpected bytes after the cubin (damaged length field or appended data)",
                                  r.remaining()));
  }
  if (cubin.empty()) corrupt(expected, "empty cubin");
  const std::string_view payload = bytes.substr(0, bytes.size() - kChecksumBytes);
  if (checksum_bytes(payload) != bytes.substr(payload.size())) corrupt(expected, "checksum mismatch");
  // Checked after the checksum: a valid frame with another key is a misfiled entry, not damage.
  if (!(header->key == expected)) {
    corrupt(expected, fmt::format("key echo mismatch: file holds the entry for key {}", header->key.hex()));
  }
  CacheEntry entry;
  entry.key = header->key;
  entry.semantic_key = std::move(header->semantic_key);
  try {
    entry.metadata = nlohmann::json::parse(meta);
  } catch (const nlohmann::json::exception& e) {
    corrupt(expected, fmt::format("metadata is not valid JSON: {}", e.what()));
  }
  entry.cubin.assign(cubin);
  return entry;
}

}  // namespace kiln
