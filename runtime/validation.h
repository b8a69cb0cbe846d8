#pragma once
// Host-side argument checks shared by every launcher. Each throws Error(kInvalidArgument) whose
// message names the argument, what was expected and what was given. No device memory is read.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kiln/runtime/tensor_view.h"

namespace kiln::check {

[[noreturn]] void fail(std::string_view arg, std::string_view expected, std::string_view given);
[[noreturn]] void unsupported(std::string_view arg, std::string_view expected, std::string_view given);
// fail / unsupported for a refusal FlashInfer makes too: the message starts with upstream's phrase for
// it (so code that matches upstream's messages keeps matching), then kiln's detail.
[[noreturn]] void fail_as(std::string_view upstream, std::string_view arg, std::string_view expected,
                          std::string_view given);
[[noreturn]] void unsupported_as(std::string_view upstream, std::string_view arg, std::string_view expected,
                                 std::string_view given);

// Upstream's phrase for the refusals of one argument: while a Phrase lives on this thread, fail() and
// unsupported() start their message with it (the innermost wins), so kiln's checks keep their own
// detail and code that matches FlashInfer's messages keeps matching. The phrase is rendered only when
// a check fails: the success path allocates nothing. Name the renderer; it must outlive the Phrase.
class Phrase {
 public:
  template <class F>
  explicit Phrase(const F& render)
      : render_(&render), call_([](const void* r) { return (*static_cast<const F*>(r))(); }), outer_(top_) {
    top_ = this;
  }
  ~Phrase() { top_ = outer_; }
  Phrase(const Phrase&) = delete;
  Phrase& operator=(const Phrase&) = delete;
  // The innermost live phrase, or "" when none.
  static std::string current();

 private:
  const void* render_;
  std::string (*call_)(const void*);
  Phrase* outer_;
  static thread_local Phrase* top_;
};

void rank(const TensorView& t, std::string_view arg, std::initializer_list<int> allowed);
void dtype(const TensorView& t, std::string_view arg, std::initializer_list<DType> allowed);
void dim(const TensorView& t, std::string_view arg, int d, std::int64_t expected);
void contiguous(const TensorView& t, std::string_view arg);
void aligned(const TensorView& t, std::string_view arg, int bytes);
void not_null(const TensorView& t, std::string_view arg);
// Stride 1 along dimension d (negative counts from the end); a dimension of size 0 or 1 has no
// step to take, so any stride passes there.
void unit_stride(const TensorView& t, std::string_view arg, int d);
// The byte ranges the two views address must not intersect; an empty view addresses no bytes, so
// it is disjoint from everything. The message carries upstream's "<a> must not overlap <b> storage".
void disjoint(const TensorView& a, std::string_view arg_a, const TensorView& b, std::string_view arg_b);
// Finite after rounding to float32.
void finite(double value, std::string_view arg);
// Finite and > 0 after rounding to float32.
void positive_finite(double value, std::string_view arg);

}  // namespace kiln::check
