#pragma once
// What the GPU suites of the two sparse MLA decodes (NVFP4 and DeepSeek-V4.1 caches) share. Both
// take q [T, H, 512] bf16, indices and lengths in i32 and sinks [H] in fp32, write out [T, H, 512]
// bf16 and out_lse [T, H] fp32, and take split scratch mid_out [T, H, S, 512] bf16 and
// mid_lse [T, H, S] fp32.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/jit/semantic_key.h"
#include "tests/support/device_buffer.h"

namespace kiln::testing {

// Device memory of one case, sized from the host inputs. S = chunks covers every plan.
struct SparseDecodeBuffers {
  SparseDecodeBuffers(int tokens, int heads, int chunks, std::size_t indices, std::size_t extra_indices);

  // New values at the same addresses (graph replays read them there). `in` holds q, idx, xidx, len
  // and xlen; the optional ones are empty where the case has none.
  template <class Inputs>
  void upload(const Inputs& in) const {
    q.upload(in.q);
    idx.upload(in.idx);
    if (!in.xidx.empty()) xidx.upload(in.xidx);
    if (!in.len.empty()) len.upload(in.len);
    if (!in.xlen.empty()) xlen.upload(in.xlen);
  }
  // NaN in every output and scratch byte: whatever the decode leaves unwritten fails the comparison.
  void poison() const;

  int tokens, heads, split_stride;
  DeviceBuffer q, idx, xidx, len, xlen, sink, out, lse, mid_out, mid_lse;
};

// out and out_lse of one launch, on the host.
struct SparseDecodeOutputs {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
};

// Waits for the device, then copies out and out_lse back.
SparseDecodeOutputs download_outputs(const SparseDecodeBuffers& b);
bool same_bits(const SparseDecodeOutputs& a, const SparseDecodeOutputs& b);

// |got - ref| <= atol + rtol |ref|. A zero rtol leaves the bound at atol even where ref is infinite
// (0 * inf is NaN, which every comparison would fail).
struct Tolerance {
  double atol = 0, rtol = 0;
  double bound(double ref) const { return rtol == 0 ? atol : atol + rtol * std::fabs(ref); }
};

// One launch against the oracle. NaN counts as the largest error; an LSE equal to an infinite
// reference has none.
struct SparseDecodeErrors {
  std::size_t bad = 0, bad_lse = 0, nan = 0;
  std::size_t bad_empty = 0;  // counted by callers whose oracle marks rows without candidates
  double max_err = 0, max_lse_err = 0;
  double max_ratio = 0;  // |err| / bound over outputs and finite-reference LSE
  std::size_t worst = 0, worst_lse = 0;
  float worst_got = 0, worst_ref = 0;
  bool ok() const { return bad == 0 && bad_lse == 0 && bad_empty == 0; }
};

SparseDecodeErrors compare_outputs(const SparseDecodeOutputs& got, const std::vector<float>& ref, const std::vector<float>& ref_lse,
                                   const Tolerance& out_tol, const Tolerance& lse_tol);

// "token t head h dim d" (or "token t head h" for an LSE) of a flat index, for failure messages.
std::string output_position(int heads, std::size_t index, bool lse);

// Each distinct key warmed once on device 0, in parallel (compiles overlap on the host's cores and
// stay out of the per-case times); prints what it took, under `suite`.
void warm_distinct(const std::vector<SemanticKey>& keys, const char* suite);

}  // namespace kiln::testing
