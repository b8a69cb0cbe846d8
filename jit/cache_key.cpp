#include "kiln/jit/cache_key.h"

#include <xxhash.h>

#include <cstring>

namespace kiln {

namespace {

// Every field is length-prefixed so that no two different input lists hash the same byte stream.
class KeyHasher {
 public:
  KeyHasher() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~KeyHasher() { XXH3_freeState(state_); }
  KeyHasher(const KeyHasher&) = delete;
  KeyHasher& operator=(const KeyHasher&) = delete;

  void add(std::string_view bytes) {
    const std::uint64_t n = bytes.size();
    XXH3_128bits_update(state_, &n, sizeof n);
    XXH3_128bits_update(state_, bytes.data(), bytes.size());
  }
  void add(std::uint64_t v) { XXH3_128bits_update(state_, &v, sizeof v); }
  CacheKey finish() const {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    return CacheKey{h.high64, h.low64};
  }

 private:
  XXH3_state_t* state_;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string CacheKey::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[i] = kDigits[(hi >> (60 - 4 * i)) & 0xf];
    out[16 + i] = kDigits[(lo >> (60 - 4 * i)) & 0xf];
  }
  return out;
}

std::optional<CacheKey> CacheKey::parse_hex(std::string_view text) {
  if (text.size() != 32) return std::nullopt;
  CacheKey key;
  for (int i = 0; i < 32; ++i) {
    const int v = hex_value(text[i]);
    if (v < 0) return std::nullopt;
    std::uint64_t& word = i < 16 ? key.hi : key.lo;
    word = (word << 4) | static_cast<std::uint64_t>(v);
  }
  return key;
}

CacheKey compute_cache_key(const CacheKeyInputs& in) {
  KeyHasher h;
  h.add(std::string_view("kiln-cache-key"));
  h.add(std::uint64_t{kCacheSchemaVersion});
  h.add(in.source);
  h.add(std::uint64_t{in.name_expressions.size()});
  for (const auto& name : in.name_expressions) h.add(name);
  h.add(in.template_bundle);
  h.add(static_cast<std::uint64_t>(in.nvrtc_major));
  h.add(static_cast<std::uint64_t>(in.nvrtc_minor));
  h.add(std::uint64_t{in.options.size()});
  for (const auto& opt : in.options) h.add(opt);
  h.add(in.arch);
  return h.finish();
}

}  // namespace kiln
