#include "tools/bench/sparse_common.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "kiln/runtime/driver.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"

namespace kiln::tools {

namespace {

constexpr std::size_t kPatternBytes = 24 * kBenchMiB;    // distinct host-made pages, replicated
constexpr std::size_t kRotateBytes = 1024 * kBenchMiB;   // gathered per replay, at least (L2: 50 MB)
constexpr double kLongReplayMs = 100;                    // stop at 5 samples past this (time budget)

// The per-call buffers of a timed decode (the same for both families): Q filled with bf16 values,
// output and out_lse poisoned with NaN, mid_out/mid_lse for `splits` > 1.
class SparseCallBuffers {
 public:
  SparseCallBuffers(int tokens, int heads, int topk, int splits, const std::string& where);
  TensorView q() const;
  TensorView output() const;
  TensorView out_lse() const;
  std::optional<TensorView> mid_out() const;
  std::optional<TensorView> mid_lse() const;
  // NaN/Inf values among the outputs and LSEs (none when every row had a valid candidate).
  std::size_t nonfinite(const std::string& where) const;

 private:
  int tokens_, heads_, splits_;
  BenchDeviceMemory q_, out_, lse_;
  std::optional<BenchDeviceMemory> mid_out_, mid_lse_;
};

SparseCallBuffers::SparseCallBuffers(int tokens, int heads, int topk, int splits, const std::string& where)
    : tokens_(tokens),
      heads_(heads),
      splits_(splits),
      q_(static_cast<std::size_t>(tokens) * heads * 512 * 2, where + " q"),
      out_(q_.bytes(), where + " output"),
      lse_(static_cast<std::size_t>(tokens) * heads * 4, where + " out_lse") {
  if (splits > 1) {
    mid_out_.emplace(q_.bytes() * splits, where + " mid_out");
    mid_lse_.emplace(lse_.bytes() * splits, where + " mid_lse");
  }
  const Driver& d = Driver::get();
  bench_fill_bf16(q_.ptr(), q_.bytes(), static_cast<std::size_t>(tokens) * heads + topk, where + " q");
  bench_check(d.cuMemsetD8(out_.ptr(), 0xff, out_.bytes()), "cuMemsetD8", where + " poison output");  // bf16 NaN
  bench_check(d.cuMemsetD8(lse_.ptr(), 0xff, lse_.bytes()), "cuMemsetD8", where + " poison out_lse");
}

TensorView SparseCallBuffers::q() const { return TensorView::contiguous(q_.at(0), DType::kBf16, {tokens_, heads_, 512}); }
TensorView SparseCallBuffers::output() const { return TensorView::contiguous(out_.at(0), DType::kBf16, {tokens_, heads_, 512}); }
TensorView SparseCallBuffers::out_lse() const { return TensorView::contiguous(lse_.at(0), DType::kF32, {tokens_, heads_}); }
std::optional<TensorView> SparseCallBuffers::mid_out() const {
  if (!mid_out_) return std::nullopt;
  return TensorView::contiguous(mid_out_->at(0), DType::kBf16, {tokens_, heads_, splits_, 512});
}
std::optional<TensorView> SparseCallBuffers::mid_lse() const {
  if (!mid_lse_) return std::nullopt;
  return TensorView::contiguous(mid_lse_->at(0), DType::kF32, {tokens_, heads_, splits_});
}

std::size_t SparseCallBuffers::nonfinite(const std::string& where) const {
  const Driver& d = Driver::get();
  std::size_t bad = 0;
  std::vector<std::uint16_t> words(out_.bytes() / 2);
  bench_check(d.cuMemcpyDtoH(words.data(), out_.ptr(), out_.bytes()), "cuMemcpyDtoH", where + " output check");
  for (std::uint16_t w : words) bad += (w & 0x7f80) == 0x7f80;
  std::vector<float> l(lse_.bytes() / 4);
  bench_check(d.cuMemcpyDtoH(l.data(), lse_.ptr(), lse_.bytes()), "cuMemcpyDtoH", where + " out_lse check");
  for (float f : l) bad += !std::isfinite(f);
  return bad;
}

}  // namespace

std::string SparseShape::name() const { return fmt::format("T={} H={} topk={}", tokens, heads, sparse_candidates(topk, extra_topk)); }

std::string sparse_candidates(int topk, int extra_topk) {
  return extra_topk ? fmt::format("{}+{}", topk, extra_topk) : fmt::format("{}", topk);
}

std::vector<SparseShape> sparse_anchor_grid(bool quick, const std::vector<std::pair<int, int>>& sets) {
  std::vector<SparseShape> grid;
  if (quick) {
    for (int t : {1, 64})
      for (std::size_t s = 0; s < 2; ++s) grid.push_back({t, 128, sets[s].first, sets[s].second});
    return grid;
  }
  for (int t : {1, 8, 64, 128, 512})
    for (int h : {64, 128})
      for (const auto& [topk, extra_topk] : sets) grid.push_back({t, h, topk, extra_topk});
  return grid;
}

void fill_sparse_pool(const BenchDeviceMemory& pool, std::size_t page_bytes, BenchRng rng,
                      const std::function<void(std::uint8_t* page, BenchRng& rng)>& make_page, CUstream stream, const std::string& what) {
  const Driver& d = Driver::get();
  const std::size_t pattern_pages = kPatternBytes / page_bytes;
  std::vector<std::uint8_t> host(pattern_pages * page_bytes);
  for (std::size_t pg = 0; pg < pattern_pages; ++pg) make_page(&host[pg * page_bytes], rng);
  bench_check(d.cuMemcpyHtoD(pool.ptr(), host.data(), host.size()), "cuMemcpyHtoD", what + " pattern");
  for (std::size_t filled = host.size(); filled < pool.bytes();) {  // doubling device copies
    const std::size_t n = std::min(filled, pool.bytes() - filled);
    bench_check(d.cuMemcpyDtoDAsync(pool.ptr() + filled, pool.ptr(), n, stream), "cuMemcpyDtoDAsync", what + " replicate");
    filled += n;
  }
  bench_check(d.cuStreamSynchronize(stream), "cuStreamSynchronize", what + " fill");
}

int bench_scratch_splits(const SparseShape& c, int planned_splits) {
  return std::max(planned_splits, sparse::num_chunks(c.topk, c.extra_topk));
}

SparseGraphTimes time_sparse_graph(const SparseShape& c, double gathered_bytes, std::int64_t main_slots, std::int64_t extra_slots,
                                   int splits, sparse::SparseCallOptions& opt, const SparseBenchCall& launch, BenchRng& rng,
                                   CUstream stream, const std::string& where) {
  const Driver& d = Driver::get();
  SparseGraphTimes t;
  t.calls = static_cast<int>(std::clamp<double>(std::ceil(static_cast<double>(kRotateBytes) / gathered_bytes), kSparseMinCalls, kSparseMaxCalls));
  t.gathered_mib_per_replay = gathered_bytes * t.calls / kBenchMiB;

  // Per call, its main set, then its extra set.
  const std::size_t main_elems = static_cast<std::size_t>(c.tokens) * c.topk;
  const std::size_t extra_elems = static_cast<std::size_t>(c.tokens) * c.extra_topk;
  const std::size_t per_call = main_elems + extra_elems;
  std::vector<std::int32_t> idx(per_call * t.calls);
  for (int call = 0; call < t.calls; ++call) {
    std::int32_t* base = &idx[per_call * call];
    for (std::size_t i = 0; i < main_elems; ++i) base[i] = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(main_slots));
    for (std::size_t i = 0; i < extra_elems; ++i) {
      base[main_elems + i] = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(extra_slots));
    }
  }
  BenchDeviceMemory indices(idx.size() * 4, where + " indices");
  bench_check(d.cuMemcpyHtoD(indices.ptr(), idx.data(), idx.size() * 4), "cuMemcpyHtoD", where + " indices");

  const SparseCallBuffers buffers(c.tokens, c.heads, c.topk, splits, where);
  bench_check(d.cuCtxSynchronize(), "cuCtxSynchronize", where + " uploads");
  opt.mid_out = buffers.mid_out();
  opt.mid_lse = buffers.mid_lse();
  const TensorView q = buffers.q(), output = buffers.output(), out_lse = buffers.out_lse();

  const auto capture = [&] {
    for (int call = 0; call < t.calls; ++call) {
      const std::size_t base = per_call * call * 4;
      if (c.has_extra()) {
        opt.extra_indices = TensorView::contiguous(indices.at(base + main_elems * 4), DType::kI32, {c.tokens, c.extra_topk});
      }
      launch(q, TensorView::contiguous(indices.at(base), DType::kI32, {c.tokens, c.topk}), output, out_lse);
    }
  };
  // Every output and LSE written and finite (every index is valid: no empty rows).
  const auto check_warm_up = [&] { t.bad_outputs += buffers.nonfinite(where); };
  static_cast<BenchReplayTimes&>(t) = bench_graph_replays(stream, where, t.calls, kLongReplayMs, capture, check_warm_up);
  return t;
}

std::string sparse_timing_method(std::string_view pools) {
  return fmt::format("per config, N launcher calls captured in one CUDA graph, each with its own random indices over the "
                     "whole {:.2f} GB {}, N = clamp(ceil(1 GiB / gathered bytes per call), {}, {}); Q, outputs and split "
                     "scratch shared by the calls; one warm-up replay (outputs poisoned before, checked finite after), then "
                     "5-7 replays timed with cuEvents; us_per_call = median replay time / N",
                     static_cast<double>(kSparsePoolBytes) * 1e-9, pools, kSparseMinCalls, kSparseMaxCalls);
}

}  // namespace kiln::tools
