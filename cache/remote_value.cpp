#include "kiln/cache/remote_value.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln {

namespace {

constexpr std::size_t kTrailerBytes = kSignatureTagBytes + kSignatureMagic.size();

std::string hmac_sha256(std::string_view secret, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), out, &len) == nullptr ||
      len != kSignatureTagBytes) {
    throw Error(ErrorCode::kInternal, "HMAC-SHA256 failed in libcrypto");
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool has_trailer(std::string_view value) {
  return value.size() >= kTrailerBytes && value.substr(value.size() - kSignatureMagic.size()) == kSignatureMagic;
}

[[noreturn]] void rejected(const CacheKey& expected, const std::string& reason) {
  throw Error(ErrorCode::kCacheCorrupt, fmt::format("remote cache entry rejected: {}", reason),
              ErrorDetails{expected.hex(), "", reason});
}

}  // namespace

std::string encode_remote_value(const CacheEntry& entry, std::string_view secret) {
  std::string value = encode_entry(entry);
  if (secret.empty()) return value;
  value += hmac_sha256(secret, value);
  value.append(kSignatureMagic);
  return value;
}

CacheEntry decode_remote_value(std::string_view value, const CacheKey& expected, std::string_view secret) {
  std::string_view frame = value;
  if (!secret.empty()) {
    if (!has_trailer(value)) {
      rejected(expected, "unsigned: the value carries no HMAC tag (written without KILN_REMOTE_CACHE_SECRET, or forged)");
    }
    frame = value.substr(0, value.size() - kTrailerBytes);
    const std::string_view tag = value.substr(frame.size(), kSignatureTagBytes);
    const std::string want = hmac_sha256(secret, frame);
    if (CRYPTO_memcmp(want.data(), tag.data(), kSignatureTagBytes) != 0) {
      rejected(expected, "mis-signed: the HMAC tag does not match (written with another secret, or forged)");
    }
  } else if (has_trailer(value)) {
    frame = value.substr(0, value.size() - kTrailerBytes);
  }
  try {
    return decode_entry(frame, expected);
  } catch (const Error& e) {
    rejected(expected, e.details().log.empty() ? e.what() : e.details().log);
  }
}

}  // namespace kiln
