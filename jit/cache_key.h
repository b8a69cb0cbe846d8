#pragma once
// CacheKey: the content address of one compiled cubin (XXH3-128 over everything that shapes it).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct CacheKey {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  std::string hex() const;  // 32 lowercase hex digits, hi first
  static std::optional<CacheKey> parse_hex(std::string_view text);

  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// Bumped whenever the rendering, framing or key inputs change meaning.
inline constexpr std::uint32_t kCacheSchemaVersion = 1;

struct CacheKeyInputs {
  std::string_view source;               // rendered KernelSource text
  const std::vector<std::string>& name_expressions;
  std::string_view template_bundle;      // bytes of every embedded template, in a fixed order
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  const std::vector<std::string>& options;  // canonical NVRTC options for the arch (the arch itself excluded)
  std::string_view arch;                 // exact arch, e.g. "sm_90a"
};

CacheKey compute_cache_key(const CacheKeyInputs& inputs);

}  // namespace kiln
