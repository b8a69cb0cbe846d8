// kiln bench sparse: sparse NVFP4 MLA decode over the DeepSeek-V4 decode grid, L2-cold, against ceilings
// measured in the same run.
//
// Method: one 4.5 GiB pool in the 384-byte format (page 64; the extra pool of the
// "main 128 + extra 512" candidates is a second view of it, as its gathers are as random). For each
// config, N launcher calls are captured in ONE CUDA graph, each with its own random index set over
// the whole pool, so one replay gathers >= 1 GiB (at most 1024 calls) that the 50 MB L2 cannot hold
// from the call before. Q, outputs and split scratch are shared by the calls (an engine's Q and
// outputs are L2-hot too). One warm-up replay (outputs poisoned before it, checked finite after),
// then 7 replays timed with driver events (>= 5 when replays are long); per-call time = median
// replay / N. Ceilings: a 1 GiB cuMemcpyDtoDAsync (read + write) and the mma.sync bf16 peak kernel
// (tools/bench_ceilings.h), each at the start and the end of the run; the larger is used.
#include "tools/bench_sparse.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "tools/bench_ceilings.h"
#include "tools/bench_report.h"

namespace kiln::tools {

namespace {

using nlohmann::json;

constexpr int kPageSize = 64;  // DeepSeek V4's main (and one of its extra) page sizes
constexpr std::size_t kTokenBytes = 384;
constexpr std::size_t kPageBytes = kPageSize * kTokenBytes;
constexpr std::size_t kPoolBytes = 4608 * kBenchMiB;  // 4.83 GB: >= 4 GB of candidates
constexpr std::size_t kPatternPages = 1024;           // 24 MiB of distinct host-made pages, replicated
constexpr std::size_t kRotateBytes = 1024 * kBenchMiB;  // gathered per replay, at least (L2: 50 MB)
constexpr int kMinCalls = 4;                          // distinct index sets per graph, at least
constexpr int kMaxCalls = 1024;
constexpr double kSmScale = 0.044194173824159216;     // 512^-0.5, DeepSeek V4's
constexpr double kLongReplayMs = 100;                 // stop at 5 samples past this (time budget)

struct BenchConfig {
  int tokens, heads, topk, extra_topk;
  int candidates() const { return topk + extra_topk; }
  bool has_extra() const { return extra_topk > 0; }
  std::string name() const {
    return extra_topk ? fmt::format("T={} H={} topk={}+{}", tokens, heads, topk, extra_topk)
                      : fmt::format("T={} H={} topk={}", tokens, heads, topk);
  }
  // The reported metrics: gathered cache bytes (the index reads are not counted) and MMA FLOP.
  double gathered_bytes() const { return static_cast<double>(tokens) * candidates() * kTokenBytes; }
  double flop() const { return 2.0 * tokens * heads * static_cast<double>(candidates()) * 1024; }
};

std::vector<BenchConfig> bench_grid(bool quick) {
  std::vector<BenchConfig> grid;
  const int candidate_sets[3][2] = {{512, 0}, {2048, 0}, {128, 512}};
  if (quick) {
    for (int t : {1, 64})
      for (int c = 0; c < 2; ++c) grid.push_back({t, 128, candidate_sets[c][0], candidate_sets[c][1]});
    return grid;
  }
  for (int t : {1, 8, 64, 128, 512})
    for (int h : {64, 128})
      for (const auto& c : candidate_sets) grid.push_back({t, h, c[0], c[1]});
  return grid;
}

// The pool: random pages in the exact 384-byte format (any code byte is a valid E2M1 pair; scales
// are finite e4m3 0.25 .. 0.94, padding bytes zero; RoPE bf16 in (-1, 1)), so the decode does real
// work on finite values. kPatternPages pages are made on the host, then replicated on the device.
void fill_pool(const BenchDeviceMemory& pool, CUstream stream) {
  const Driver& d = Driver::get();
  std::vector<std::uint8_t> host(kPatternPages * kPageBytes);
  BenchRng rng(0x5b4b5e);
  for (std::size_t pg = 0; pg < kPatternPages; ++pg) {
    std::uint8_t* page = &host[pg * kPageBytes];
    for (int r = 0; r < kPageSize; ++r) {
      std::uint8_t* data = page + r * 352;
      for (int i = 0; i < 224; i += 8) {
        const std::uint64_t v = rng.next();
        std::memcpy(data + i, &v, 8);
      }
      for (int j = 0; j < 64; j += 4) {
        const std::uint64_t v = rng.next();
        for (int k = 0; k < 4; ++k) {
          const std::uint16_t b = bench_bf16_bits(static_cast<float>((v >> (16 * k)) & 0xffff) / 32768.f - 1.f);
          std::memcpy(data + 224 + 2 * (j + k), &b, 2);
        }
      }
      std::uint8_t* scales = page + kPageSize * 352 + r * 32;
      for (int g = 0; g < 28; ++g) scales[g] = static_cast<std::uint8_t>(0x28 + rng.next() % 16);
      std::memset(scales + 28, 0, 4);
    }
  }
  const std::size_t pattern_bytes = host.size();
  bench_check(d.cuMemcpyHtoD(pool.ptr(), host.data(), pattern_bytes), "cuMemcpyHtoD", "sparse pool pattern");
  for (std::size_t filled = pattern_bytes; filled < pool.bytes();) {  // doubling device copies
    const std::size_t n = std::min(filled, pool.bytes() - filled);
    bench_check(d.cuMemcpyDtoDAsync(pool.ptr() + filled, pool.ptr(), n, stream), "cuMemcpyDtoDAsync", "sparse pool replicate");
    filled += n;
  }
  bench_check(d.cuStreamSynchronize(stream), "cuStreamSynchronize", "sparse pool fill");
}

struct Timing : BenchReplayTimes {
  int calls = 0;
  double gathered_mib_per_replay = 0;
  sparse::SplitPlanResult plan;
  std::size_t bad_outputs = 0;  // NaN/Inf outputs or LSE after the warm-up replay
};

Timing time_config(const BenchConfig& c, const BenchDeviceMemory& pool, std::int64_t pool_pages, int sms, CUstream stream,
                   BenchRng& rng, KernelService& service) {
  const Driver& d = Driver::get();
  const std::string where = c.name();
  const std::int64_t pool_tokens = pool_pages * kPageSize;
  Timing t;
  t.plan = sparse::resolve_plan(c.tokens, c.heads, c.topk, c.extra_topk, sms);
  t.calls = static_cast<int>(std::clamp<double>(std::ceil(static_cast<double>(kRotateBytes) / c.gathered_bytes()), kMinCalls, kMaxCalls));
  t.gathered_mib_per_replay = c.gathered_bytes() * t.calls / kBenchMiB;

  // Distinct index sets per call over the whole pool (main, then extra, per call).
  const std::size_t main_elems = static_cast<std::size_t>(c.tokens) * c.topk;
  const std::size_t extra_elems = static_cast<std::size_t>(c.tokens) * c.extra_topk;
  const std::size_t per_call = main_elems + extra_elems;
  std::vector<std::int32_t> idx(per_call * t.calls);
  for (auto& v : idx) v = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(pool_tokens));
  BenchDeviceMemory indices(idx.size() * 4, where + " indices");
  bench_check(d.cuMemcpyHtoD(indices.ptr(), idx.data(), idx.size() * 4), "cuMemcpyHtoD", where + " indices");

  const std::size_t q_bytes = static_cast<std::size_t>(c.tokens) * c.heads * 512 * 2;
  BenchDeviceMemory q(q_bytes, where + " q"), out(q_bytes, where + " output");
  BenchDeviceMemory lse(static_cast<std::size_t>(c.tokens) * c.heads * 4, where + " out_lse");
  const int splits = t.plan.num_splits;
  std::optional<BenchDeviceMemory> mid_out, mid_lse;
  if (splits > 1) {
    mid_out.emplace(q_bytes * splits, where + " mid_out");
    mid_lse.emplace(static_cast<std::size_t>(c.tokens) * c.heads * splits * 4, where + " mid_lse");
  }
  bench_fill_bf16(q.ptr(), q_bytes, static_cast<std::size_t>(c.tokens) * c.heads + c.topk, where + " q");
  bench_check(d.cuMemsetD8(out.ptr(), 0xff, out.bytes()), "cuMemsetD8", where + " poison output");  // bf16 NaN
  bench_check(d.cuMemsetD8(lse.ptr(), 0xff, lse.bytes()), "cuMemsetD8", where + " poison out_lse");
  bench_check(d.cuCtxSynchronize(), "cuCtxSynchronize", where + " uploads");

  const TensorView cache = TensorView::contiguous(pool.at(0), DType::kU8, {pool_pages, kPageSize, 384});
  sparse::SparseOptions opt;
  if (c.has_extra()) opt.extra_kv_cache = cache;
  if (splits > 1) {
    opt.mid_out = TensorView::contiguous(mid_out->at(0), DType::kBf16, {c.tokens, c.heads, splits, 512});
    opt.mid_lse = TensorView::contiguous(mid_lse->at(0), DType::kF32, {c.tokens, c.heads, splits});
  }
  const TensorView q_view = TensorView::contiguous(q.at(0), DType::kBf16, {c.tokens, c.heads, 512});
  const TensorView out_view = TensorView::contiguous(out.at(0), DType::kBf16, {c.tokens, c.heads, 512});
  const TensorView lse_view = TensorView::contiguous(lse.at(0), DType::kF32, {c.tokens, c.heads});

  const auto capture = [&] {
    for (int call = 0; call < t.calls; ++call) {
      const std::size_t base = per_call * call * 4;
      if (c.has_extra()) {
        opt.extra_indices = TensorView::contiguous(indices.at(base + main_elems * 4), DType::kI32, {c.tokens, c.extra_topk});
      }
      const sparse::SplitPlanResult plan = sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(
          q_view, cache, TensorView::contiguous(indices.at(base), DType::kI32, {c.tokens, c.topk}), out_view, lse_view, kSmScale, opt,
          stream, service);
      if (!(plan == t.plan)) {
        throw Error(ErrorCode::kInternal, fmt::format("sparse bench {}: the launcher resolved plan {}/{}/{}, the bench expected {}/{}/{}",
                                                      where, plan.head_tiles, plan.num_splits, plan.chunks_per_block, t.plan.head_tiles,
                                                      t.plan.num_splits, t.plan.chunks_per_block));
      }
    }
  };
  const auto check_warm_up = [&] {  // every output and LSE written and finite (every index is valid: no empty rows)
    std::vector<std::uint16_t> words(q_bytes / 2);
    bench_check(d.cuMemcpyDtoH(words.data(), out.ptr(), q_bytes), "cuMemcpyDtoH", where + " output check");
    for (std::uint16_t w : words) t.bad_outputs += (w & 0x7f80) == 0x7f80;
    std::vector<float> l(lse.bytes() / 4);
    bench_check(d.cuMemcpyDtoH(l.data(), lse.ptr(), lse.bytes()), "cuMemcpyDtoH", where + " out_lse check");
    for (float f : l) t.bad_outputs += !std::isfinite(f);
  };
  static_cast<BenchReplayTimes&>(t) = bench_graph_replays(stream, where, t.calls, kLongReplayMs, capture, check_warm_up);
  return t;
}

}  // namespace

int run_bench_sparse(const BenchOptions& options) {
  const auto t_start = BenchClock::now();
  const Driver& d = Driver::get();
  d.require("kiln bench sparse");
  Config config = Config::from_environment();
  if (!options.cache_dir.empty()) config.cache_dir = options.cache_dir;
  KernelService service(config);
  const bool quick = options.quick;

  json report = bench_header("sparse");
  ScopedDeviceContext context(0);
  const std::string arch = service.device_arch(0);
  const int sms = service.device_sm_count(0);
  const BenchStream bench_stream;
  const CUstream stream = bench_stream.get();

  const std::vector<BenchConfig> grid = bench_grid(quick);
  // Warm every key the grid's planned calls use, in parallel: compiles stay out of the timings,
  // and capture never compiles.
  {
    const auto t0 = BenchClock::now();
    std::vector<SemanticKey> keys;
    for (const BenchConfig& c : grid) {
      const SemanticKey key =
          sparse::sparse_policy(c.heads, c.has_extra(), sparse::resolve_plan(c.tokens, c.heads, c.topk, c.extra_topk, sms)).key(arch);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
    service.warm(keys, {0});
    std::fprintf(stderr, "warm: %zu keys in %.0f ms (%llu compiles)\n", keys.size(), bench_ms_since(t0),
                 static_cast<unsigned long long>(service.counters().compiles));
  }

  BenchCeilings ceilings(arch, sms, stream);

  const std::int64_t pool_pages = static_cast<std::int64_t>(kPoolBytes / kPageBytes);
  BenchDeviceMemory pool(static_cast<std::size_t>(pool_pages) * kPageBytes, "sparse NVFP4 pool");
  {
    const auto t0 = BenchClock::now();
    fill_pool(pool, stream);
    std::fprintf(stderr, "pool: %.2f GB, %lld tokens, filled in %.0f ms\n", static_cast<double>(pool.bytes()) * 1e-9,
                 static_cast<long long>(pool_pages) * kPageSize, bench_ms_since(t0));
  }

  BenchRng rng(0x73706172);
  std::vector<std::pair<BenchConfig, Timing>> rows;
  for (const BenchConfig& c : grid) {
    const auto t0 = BenchClock::now();
    const Timing t = time_config(c, pool, pool_pages, sms, stream, rng, service);
    if (t.bad_outputs > 0) {
      throw Error(ErrorCode::kInternal, fmt::format("sparse bench {}: {} NaN/Inf values in the outputs after a replay: the kernel is "
                                                    "broken for this config, its timing would mean nothing",
                                                    c.name(), t.bad_outputs));
    }
    std::fprintf(stderr, "%-26s %5d calls %9.2f us  %7.1f GB/s  %6.1f TFLOP/s  plan %d/%d/%d  (%.0f ms)\n", c.name().c_str(), t.calls, t.us,
                 c.gathered_bytes() / (t.us * 1e-6) * 1e-9, c.flop() / (t.us * 1e-6) * 1e-12, t.plan.head_tiles, t.plan.num_splits,
                 t.plan.chunks_per_block, bench_ms_since(t0));
    rows.emplace_back(c, t);
  }

  // Ceilings, second reading: clocks and power may have moved over the sweep.
  ceilings.read_end(stream);
  const double copy_ceiling = ceilings.copy_tb_s();
  const double mma_ceiling = ceilings.mma_tflop_s();

  json results = json::array();
  json bars = {{"h128_2048_t64plus_compute", json::array()}, {"t1_latency", json::array()}};
  for (const auto& [c, t] : rows) {
    const double gb_s = c.gathered_bytes() / (t.us * 1e-6) * 1e-9;
    const double tflop_s = c.flop() / (t.us * 1e-6) * 1e-12;
    results.push_back({{"T", c.tokens},
                       {"H", c.heads},
                       {"topk", c.topk},
                       {"extra_topk", c.extra_topk},
                       {"candidates", c.candidates()},
                       {"us_per_call", t.us},
                       {"us_min", t.us_min},
                       {"us_max", t.us_max},
                       {"gathered_gb_s", gb_s},
                       {"pct_copy", 100 * gb_s * 1e-3 / copy_ceiling},
                       {"tflop_s", tflop_s},
                       {"pct_mma_sync_peak", 100 * tflop_s / mma_ceiling},
                       {"pct_wgmma_790", 100 * tflop_s / kWgmmaReferenceTflops},
                       {"gathered_bytes_per_call", c.gathered_bytes()},
                       {"flop_per_call", c.flop()},
                       {"head_tiles", t.plan.head_tiles},
                       {"num_splits", t.plan.num_splits},
                       {"chunks_per_block", t.plan.chunks_per_block},
                       {"calls_per_graph", t.calls},
                       {"replays_timed", t.replays},
                       {"gathered_mib_per_replay", t.gathered_mib_per_replay}});
    const json key = {{"T", c.tokens}, {"H", c.heads}, {"topk", c.topk}, {"extra_topk", c.extra_topk}};
    if (c.heads == 128 && c.topk == 2048 && c.extra_topk == 0 && c.tokens >= 64) {
      const double pct = 100 * tflop_s / mma_ceiling;
      bars["h128_2048_t64plus_compute"].push_back(
          {{"config", key}, {"pct_mma_sync_peak", pct}, {"pct_wgmma_790", 100 * tflop_s / kWgmmaReferenceTflops}, {"pass", pct >= 35}});
    }
    if (c.tokens == 1) bars["t1_latency"].push_back({{"config", key}, {"us", t.us}, {"pass", t.us <= 20}});
  }
  const json bar_summary = bench_bar_summary(bars);

  report["power_state_after"] = bench_power_state();
  report["sm_count"] = sms;
  report["arch"] = arch;
  report["pool"] = {{"bytes", pool.bytes()}, {"page_size", kPageSize}, {"page_stride", kPageBytes},
                    {"tokens", static_cast<long long>(pool_pages) * kPageSize}, {"layout", "[P, 64, 384] (compact)"},
                    {"extra_pool", "a second view of the same pool (page 64), indices drawn independently"}};
  report["method"] = {
      {"timing", fmt::format("per config, N launcher calls captured in one CUDA graph, each with its own random indices over the "
                             "whole {:.2f} GB pool, N = clamp(ceil(1 GiB / gathered bytes per call), {}, {}); Q, outputs and split "
                             "scratch shared by the calls; one warm-up replay (outputs poisoned before, checked finite after), then "
                             "5-7 replays timed with cuEvents; us_per_call = median replay time / N",
                             static_cast<double>(pool.bytes()) * 1e-9, kMinCalls, kMaxCalls)},
      {"plan", "the launcher's own (planners for this device's SM count; no overrides)"},
      {"gathered_bytes", "T * candidates * 384 (index reads, Q and outputs not counted)"},
      {"flop", "2 * T * H * candidates * 1024"},
      {"sm_scale", kSmScale},
      {"indices", "uniform random over the pool, all valid; no topk_length, no sink"},
      {"quick", quick}};
  report["ceilings"] = ceilings.report();
  report["bars"] = bars;
  report["bar_summary"] = bar_summary;
  report["results"] = results;
  report["cache_dir"] = service.config().cache_dir.string();
  report["wall_s"] = bench_ms_since(t_start) / 1000;
  write_report(report, options.out);

  // The compact table last, on stderr (stdout carries the JSON).
  ceilings.print();
  std::fprintf(stderr, "%-4s %-4s %-9s %10s %8s %6s %8s %6s %6s %s\n", "T", "H", "cands", "us/call", "GB/s", "%copy", "TFLOP/s", "%mma",
               "%790", "tiles/splits/cpb");
  for (const json& r : results) {
    const std::string cands = r["extra_topk"].get<int>() ? fmt::format("{}+{}", r["topk"].get<int>(), r["extra_topk"].get<int>())
                                                         : fmt::format("{}", r["topk"].get<int>());
    std::fprintf(stderr, "%-4d %-4d %-9s %10.2f %8.1f %6.1f %8.1f %6.1f %6.1f %d/%d/%d\n", r["T"].get<int>(), r["H"].get<int>(),
                 cands.c_str(), r["us_per_call"].get<double>(), r["gathered_gb_s"].get<double>(), r["pct_copy"].get<double>(),
                 r["tflop_s"].get<double>(), r["pct_mma_sync_peak"].get<double>(), r["pct_wgmma_790"].get<double>(),
                 r["head_tiles"].get<int>(), r["num_splits"].get<int>(), r["chunks_per_block"].get<int>());
  }
  bench_print_footer(report, bar_summary);
  return 0;
}

}  // namespace kiln::tools
