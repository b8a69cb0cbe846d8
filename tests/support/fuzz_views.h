#pragma once
// Random host-only inputs for the launcher fuzz tests: tensor views at fake, disjoint, 256-byte
// aligned addresses that are never dereferenced.
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/runtime/tensor_view.h"

namespace kiln::testing::fuzz {

using Rng = std::mt19937_64;

inline std::int64_t rnd(Rng& r, std::int64_t lo, std::int64_t hi) {  // inclusive
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(r);
}
inline bool coin(Rng& r, double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(r) < p; }

// Tensor i lives in its own 1 TiB region at a random 256-byte aligned offset: disjoint and aligned.
inline std::uintptr_t region(Rng& r, int i) { return (std::uintptr_t(i + 1) << 40) + std::uintptr_t(rnd(r, 0, 4095)) * 256; }

// A contiguous view of `shape` at `a`. Fuzzed shapes can be huge: the strides saturate instead of
// overflowing (signed overflow is UB).
inline TensorView make(std::uintptr_t a, DType t, std::vector<std::int64_t> shape) {
  TensorView v;
  v.data = reinterpret_cast<void*>(a);
  v.dtype = t;
  v.rank = static_cast<int>(shape.size());
  std::int64_t s = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = s;
    if (__builtin_mul_overflow(s, shape[d], &s)) s = INT64_MAX;
  }
  return v;
}

// A paged cache of `pages` pages of `page` `record`-byte rows in any accepted view: 2-D [P, page *
// record], 3-D, HND or NHD; the page stride padded by 16 x [1, max_pad16] bytes 30% of the time.
inline TensorView cache_view(Rng& r, std::uintptr_t a, std::int64_t pages, std::int64_t page, std::int64_t record, std::int64_t max_pad16) {
  const std::int64_t stride = page * record + (coin(r, 0.3) ? 16 * rnd(r, 1, max_pad16) : 0);
  TensorView v;
  switch (rnd(r, 0, 3)) {
    case 0: v = make(a, DType::kU8, {pages, page * record}); break;
    case 1: v = make(a, DType::kU8, {pages, page, record}); break;
    case 2: v = make(a, DType::kU8, {pages, 1, page, record}); break;
    default: v = make(a, DType::kU8, {pages, page, 1, record}); break;
  }
  v.strides[0] = stride;
  return v;
}

}  // namespace kiln::testing::fuzz
