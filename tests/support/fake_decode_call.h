#pragma once
// Sparse decode calls over fake device addresses, for host-only validation tests: each tensor of a
// call gets a 1 GiB region of its own, aligned and never dereferenced, so views overlap only where
// a test makes them, and a call that reaches the driver is a bug.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kiln/runtime/tensor_view.h"

namespace kiln::testing::fake {

constexpr std::uintptr_t region(int i) { return std::uintptr_t(i) << 30; }
inline constexpr std::uintptr_t kQ = region(1), kKv = region(2), kIdx = region(3), kOut = region(4), kLse = region(5),
                                kLen = region(6), kSink = region(7), kXKv = region(8), kXIdx = region(9), kXLen = region(10),
                                kMidOut = region(11), kMidLse = region(12);

inline void* addr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

inline TensorView view(std::uintptr_t a, DType t, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(addr(a), t, shape);
}

// A cache [P, page, record] of bytes, with an optional padded page stride (bytes).
inline TensorView cache3(std::uintptr_t a, std::int64_t pages, std::int64_t page, std::int64_t record, std::int64_t page_stride = 0) {
  TensorView v = view(a, DType::kU8, {pages, page, record});
  if (page_stride) v.strides[0] = page_stride;
  return v;
}

// One call's tensors: q [T, H, 512] bf16, a main cache of 16 pages of 64 tokens of `record` bytes,
// indices [T, topk] i32, output [T, H, 512] bf16 and out_lse [T, H] fp32; with_extra adds an extra
// cache of `extra_record`-byte tokens and its indices, with_mid the split scratch. `Derived` (the
// test's call) adds plan() and run().
template <class Derived, class Options>
struct DecodeCall {
  int tokens, heads, topk;
  std::int64_t extra_record;
  TensorView q, kv, indices, output, out_lse;
  double sm_scale = 1.0 / std::sqrt(512.0);
  Options opt;

  DecodeCall(int t, int h, int k, std::int64_t record, std::int64_t extra_record_bytes)
      : tokens(t),
        heads(h),
        topk(k),
        extra_record(extra_record_bytes),
        q(view(kQ, DType::kBf16, {t, h, 512})),
        kv(cache3(kKv, 16, 64, record)),
        indices(view(kIdx, DType::kI32, {t, k})),
        output(view(kOut, DType::kBf16, {t, h, 512})),
        out_lse(view(kLse, DType::kF32, {t, h})) {}

  Derived& with_extra(int extra_topk, int extra_page = 2) {
    opt.extra_kv_cache = cache3(kXKv, 64, extra_page, extra_record);
    opt.extra_indices = view(kXIdx, DType::kI32, {tokens, extra_topk});
    return static_cast<Derived&>(*this);
  }
  Derived& with_mid(int splits) {
    opt.mid_out = view(kMidOut, DType::kBf16, {tokens, heads, splits, 512});
    opt.mid_lse = view(kMidLse, DType::kF32, {tokens, heads, splits});
    return static_cast<Derived&>(*this);
  }
};

}  // namespace kiln::testing::fake
