#include "tests/support/sparse_decode.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include "kiln/runtime/kernel_service.h"
#include "tests/support/nvfp4_reference.h"

namespace kiln::testing {
namespace {

constexpr std::size_t kDims = 512;
// 0xff is NaN in bf16 (0xffff) and fp32 (0xffffffff).
constexpr std::uint8_t kNanByte = 0xff;

}  // namespace

SparseDecodeBuffers::SparseDecodeBuffers(int tokens, int heads, int chunks, std::size_t indices, std::size_t extra_indices)
    : tokens(tokens),
      heads(heads),
      split_stride(chunks),
      q(static_cast<std::size_t>(tokens) * heads * kDims * 2),
      idx(indices * 4),
      xidx(std::max<std::size_t>(extra_indices, 1) * 4),
      len(std::max<std::size_t>(tokens, 1) * 4),
      xlen(std::max<std::size_t>(tokens, 1) * 4),
      sink(static_cast<std::size_t>(heads) * 4),
      out(static_cast<std::size_t>(tokens) * heads * kDims * 2),
      lse(static_cast<std::size_t>(tokens) * heads * 4),
      mid_out(static_cast<std::size_t>(tokens) * heads * chunks * kDims * 2),
      mid_lse(static_cast<std::size_t>(tokens) * heads * chunks * 4) {}

void SparseDecodeBuffers::poison() const {
  for (const DeviceBuffer* b : {&out, &lse, &mid_out, &mid_lse}) b->fill(kNanByte);
}

SparseDecodeOutputs download_outputs(const SparseDecodeBuffers& b) {
  const std::size_t rows = static_cast<std::size_t>(b.tokens) * b.heads;
  return {b.out.download<std::uint16_t>(rows * kDims), b.lse.download<float>(rows)};
}

bool same_bits(const SparseDecodeOutputs& a, const SparseDecodeOutputs& b) {
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() && std::memcmp(a.out.data(), b.out.data(), a.out.size() * 2) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

SparseDecodeErrors compare_outputs(const SparseDecodeOutputs& got, const std::vector<float>& ref, const std::vector<float>& ref_lse,
                                   const Tolerance& out_tol, const Tolerance& lse_tol) {
  const auto ratio = [](double err, double bound) { return std::isnan(err) ? std::numeric_limits<double>::infinity() : err / bound; };
  SparseDecodeErrors r;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float o = bf16_to_float(got.out[i]);
    const double e = std::fabs(static_cast<double>(o) - ref[i]);
    r.nan += std::isnan(o);
    const double bound = out_tol.bound(ref[i]);
    if (!(e <= bound)) ++r.bad;
    r.max_ratio = std::max(r.max_ratio, ratio(e, bound));
    if (!(e <= r.max_err)) {  // NaN compares false: a NaN becomes the worst
      r.max_err = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      r.worst = i;
      r.worst_got = o;
      r.worst_ref = ref[i];
    }
  }
  for (std::size_t i = 0; i < ref_lse.size(); ++i) {
    const bool same_inf = std::isinf(ref_lse[i]) && got.lse[i] == ref_lse[i];
    const double e = same_inf ? 0.0 : std::fabs(static_cast<double>(got.lse[i]) - ref_lse[i]);
    const double bound = lse_tol.bound(ref_lse[i]);
    if (!(e <= bound)) ++r.bad_lse;
    if (!same_inf) r.max_ratio = std::max(r.max_ratio, ratio(e, bound));
    if (!(e <= r.max_lse_err)) {
      r.max_lse_err = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      r.worst_lse = i;
    }
  }
  return r;
}

std::string output_position(int heads, std::size_t index, bool lse) {
  std::ostringstream s;
  const std::size_t row = lse ? index : index / kDims;
  s << "token " << row / heads << " head " << row % heads;
  if (!lse) s << " dim " << index % kDims;
  return s.str();
}

void warm_distinct(const std::vector<SemanticKey>& keys, const char* suite) {
  KernelService& service = KernelService::global();
  std::vector<SemanticKey> distinct;
  std::set<std::string> seen;
  for (const SemanticKey& key : keys) {
    if (seen.insert(key.str()).second) distinct.push_back(key);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto before = service.counters();
  service.warm(distinct, {0});
  const auto after = service.counters();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: warmed %zu keys in %.0f ms (%llu compiled, %.0f ms of compile time over threads)\n", suite, distinct.size(), ms,
              static_cast<unsigned long long>(after.compiles - before.compiles), after.compile_ms - before.compile_ms);
  std::fflush(stdout);
}

}  // namespace kiln::testing
