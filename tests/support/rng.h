#pragma once
// Test input generators shared by the GPU suites: reproducible, fast and identical on every
// platform (the std distributions are not).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

namespace kiln::testing {

// Reproducible by default; `kiln_gpu_tests --rng-seed N` (or `time`) draws other inputs.
inline std::uint64_t base_seed() {
  const unsigned s = Catch::rngSeed();
  return s != 0 ? s : 20251129u;
}

// splitmix64 plus Box-Muller: fast enough to fill tens of MB per case.
struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) / 16777216.f; }
  float normal() {
    const float u1 = (static_cast<float>(next() >> 40) + 1.f) / 16777217.f;
    const float u2 = static_cast<float>(next() >> 40) / 16777216.f;
    return std::sqrt(-2.f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

}  // namespace kiln::testing
