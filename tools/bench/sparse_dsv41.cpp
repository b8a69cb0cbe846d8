// kiln bench sparse_dsv41: sparse MLA decode over the DeepSeek-V4.1 caches, L2-cold, against ceilings
// measured in the same run, beside kiln's NVFP4 decode on the same configs. "results" is the
// 30-config grid of the FlashMLA FP8 sparse anchors (compare.py reads it: T, H, topk, extra_topk,
// us_per_call). On sm_90a every config is timed with each variant forced ("us_default", "us_sm90");
// "us_per_call" is the time of the variant the launcher picks ("variant"). "us_nvfp4" is kiln's
// NVFP4 decode on the same (T, H, topk, extra_topk), timed as `kiln bench sparse` times it.
//
// Method (that of `kiln bench sparse`): one 4.5 GiB pool of 528-byte main records and one of 288-byte
// extra records (page 64 both, the FOOTER layout), filled with random finite codes and scales of the
// writers' range. For each config, N launcher calls are captured in ONE CUDA graph, each with its own
// random index sets over the whole pools, so one replay gathers >= 1 GiB (at most 1024 calls) that
// the 50 MB L2 cannot hold from the call before. Q, outputs and split scratch are shared by the
// calls. One warm-up replay (outputs poisoned before it, checked finite after), then 7 replays timed
// with driver events (>= 5 when replays are long); per-call time = median replay / N.
#include "tools/bench/sparse_dsv41.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "kiln/runtime/sparse_dsv41/planner.h"
#include "tools/bench/ceilings.h"
#include "tools/bench/report.h"
#include "tools/bench/sparse.h"

namespace kiln::tools {

namespace {

using nlohmann::json;
using dsv41::Dsv41Variant;

constexpr std::size_t kMainRecord = 528, kExtraRecord = 288;
constexpr std::size_t kPoolBytes = 4608 * kBenchMiB;     // per pool: >= 4 GB of candidates
constexpr std::size_t kPatternBytes = 24 * kBenchMiB;    // distinct host-made pages, replicated
constexpr std::size_t kRotateBytes = 1024 * kBenchMiB;   // gathered per replay, at least (L2: 50 MB)
constexpr int kMinCalls = 4;
constexpr int kMaxCalls = 1024;
constexpr int kPage = 64;                                // both pools
constexpr double kSmScale = 0.044194173824159216;        // 512^-0.5
constexpr double kLongReplayMs = 100;

struct Dsv41Config {
  int tokens, heads, topk, extra_topk;
  bool has_extra() const { return extra_topk > 0; }
  std::string name() const {
    return extra_topk ? fmt::format("T={} H={} topk={}+{}", tokens, heads, topk, extra_topk)
                      : fmt::format("T={} H={} topk={}", tokens, heads, topk);
  }
  // Gathered record bytes (index reads not counted) and MMA FLOP (QK and PV over 512 dims each).
  double gathered_bytes() const {
    return static_cast<double>(tokens) * (static_cast<double>(topk) * kMainRecord + static_cast<double>(extra_topk) * kExtraRecord);
  }
  double flop() const { return 2.0 * tokens * heads * static_cast<double>(topk + extra_topk) * 1024; }
};

std::vector<Dsv41Config> bench_grid(bool quick) {
  std::vector<Dsv41Config> grid;
  const int candidate_sets[3][2] = {{128, 512}, {512, 0}, {2048, 0}};
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

// Random records in the FOOTER layout: main codes any finite E4M3, scales 2^-13 .. 2^-8 (the writer's
// range for latents in [-1, 1]); extra codes any E2M1 pair, scales E4M3 2^-4 .. 0.171875. Made on the
// host for kPatternBytes of pages, then replicated on the device.
void fill_pool(const BenchDeviceMemory& pool, bool extra, CUstream stream) {
  const Driver& d = Driver::get();
  const std::size_t data = extra ? 256 : 512, scale = extra ? 32 : 16;
  const std::size_t page_bytes = kPage * (data + scale);
  const std::size_t pattern_pages = kPatternBytes / page_bytes;
  std::vector<std::uint8_t> host(pattern_pages * page_bytes);
  BenchRng rng(extra ? 0x64737834 : 0x64736d34);
  for (std::size_t pg = 0; pg < pattern_pages; ++pg) {
    std::uint8_t* page = &host[pg * page_bytes];
    for (std::size_t i = 0; i < kPage * data; i += 8) {
      std::uint64_t v = rng.next();
      for (int k = 0; k < 8; ++k, v >>= 8) {
        const auto b = static_cast<std::uint8_t>(v);
        page[i + k] = extra || (b & 0x7f) != 0x7f ? b : static_cast<std::uint8_t>(b & 0xfe);  // E4M3: no NaN
      }
    }
    for (std::size_t i = 0; i < kPage * scale; ++i) {
      const std::uint64_t r = rng.next();
      page[kPage * data + i] = static_cast<std::uint8_t>(extra ? 0x18 + r % (0x23 - 0x18 + 1) : 114 + r % 6);
    }
  }
  bench_check(d.cuMemcpyHtoD(pool.ptr(), host.data(), host.size()), "cuMemcpyHtoD", "dsv41 pool pattern");
  for (std::size_t filled = host.size(); filled < pool.bytes();) {  // doubling device copies
    const std::size_t n = std::min(filled, pool.bytes() - filled);
    bench_check(d.cuMemcpyDtoDAsync(pool.ptr() + filled, pool.ptr(), n, stream), "cuMemcpyDtoDAsync", "dsv41 pool replicate");
    filled += n;
  }
  bench_check(d.cuStreamSynchronize(stream), "cuStreamSynchronize", "dsv41 pool fill");
}

struct Pool {
  std::unique_ptr<BenchDeviceMemory> mem;
  std::int64_t pages = 0;
  std::int64_t slots() const { return pages * kPage; }
};

Pool make_pool(bool extra, CUstream stream) {
  const std::size_t page_bytes = kPage * (extra ? kExtraRecord : kMainRecord);
  Pool p;
  p.pages = static_cast<std::int64_t>(kPoolBytes / page_bytes);
  p.mem = std::make_unique<BenchDeviceMemory>(static_cast<std::size_t>(p.pages) * page_bytes, extra ? "dsv41 extra pool" : "dsv41 main pool");
  const auto t0 = BenchClock::now();
  fill_pool(*p.mem, extra, stream);
  std::fprintf(stderr, "%s pool: %.2f GB, filled in %.0f ms\n", extra ? "extra (288 B)" : "main (528 B)",
               static_cast<double>(p.mem->bytes()) * 1e-9, bench_ms_since(t0));
  return p;
}

struct Timing : BenchReplayTimes {
  int calls = 0;
  double gathered_mib_per_replay = 0;
  dsv41::Dsv41Plan plan;
  std::size_t bad_outputs = 0;
};

dsv41::Dsv41Plan expected_plan(const Dsv41Config& c, const dsv41::Dsv41Device& device, Dsv41Variant variant) {
  return dsv41::resolve_dsv41_plan(c.tokens, c.heads, c.topk, c.extra_topk, device, variant);
}

Timing time_config(const Dsv41Config& c, const Pool& main, const Pool& extra, const dsv41::Dsv41Device& device, Dsv41Variant variant,
                   CUstream stream, BenchRng& rng, KernelService& service) {
  const Driver& d = Driver::get();
  const std::string where = fmt::format("{} variant {}", c.name(), dsv41::dsv41_variant_name(variant));
  Timing t;
  t.plan = expected_plan(c, device, variant);
  t.calls = static_cast<int>(std::clamp<double>(std::ceil(static_cast<double>(kRotateBytes) / c.gathered_bytes()), kMinCalls, kMaxCalls));
  t.gathered_mib_per_replay = c.gathered_bytes() * t.calls / kBenchMiB;

  const std::size_t main_elems = static_cast<std::size_t>(c.tokens) * c.topk;
  const std::size_t extra_elems = static_cast<std::size_t>(c.tokens) * c.extra_topk;
  const std::size_t per_call = main_elems + extra_elems;
  std::vector<std::int32_t> idx(per_call * t.calls);
  for (int call = 0; call < t.calls; ++call) {
    std::int32_t* base = &idx[per_call * call];
    for (std::size_t i = 0; i < main_elems; ++i) base[i] = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(main.slots()));
    for (std::size_t i = 0; i < extra_elems; ++i) {
      base[main_elems + i] = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(extra.slots()));
    }
  }
  BenchDeviceMemory indices(idx.size() * 4, where + " indices");
  bench_check(d.cuMemcpyHtoD(indices.ptr(), idx.data(), idx.size() * 4), "cuMemcpyHtoD", where + " indices");

  const SparseCallBuffers buffers(c.tokens, c.heads, c.topk, t.plan.num_splits, where);
  bench_check(d.cuCtxSynchronize(), "cuCtxSynchronize", where + " uploads");

  const TensorView main_view = TensorView::contiguous(main.mem->at(0), DType::kU8, {main.pages, kPage, static_cast<std::int64_t>(kMainRecord)});
  dsv41::Dsv41Options opt;
  opt.variant = dsv41::dsv41_variant_name(variant);
  if (c.has_extra()) {
    opt.extra_kv_cache = TensorView::contiguous(extra.mem->at(0), DType::kU8, {extra.pages, kPage, static_cast<std::int64_t>(kExtraRecord)});
  }
  opt.mid_out = buffers.mid_out();
  opt.mid_lse = buffers.mid_lse();
  const TensorView q_view = buffers.q(), out_view = buffers.output(), lse_view = buffers.out_lse();

  const auto capture = [&] {
    for (int call = 0; call < t.calls; ++call) {
      const std::size_t base = per_call * call * 4;
      if (c.has_extra()) {
        opt.extra_indices = TensorView::contiguous(indices.at(base + main_elems * 4), DType::kI32, {c.tokens, c.extra_topk});
      }
      const dsv41::Dsv41Plan plan = dsv41::cake_sparse_mla_sm120_dsv41_mixed_decode(
          q_view, main_view, TensorView::contiguous(indices.at(base), DType::kI32, {c.tokens, c.topk}), out_view, lse_view, kSmScale, opt,
          stream, service);
      if (!(plan == t.plan)) {
        throw Error(ErrorCode::kInternal, fmt::format("dsv41 bench {}: the launcher resolved plan {} {}/{}/{}, the bench expected {} {}/{}/{}",
                                                      where, dsv41::dsv41_variant_name(plan.variant), plan.head_tiles, plan.num_splits,
                                                      plan.chunks_per_block, dsv41::dsv41_variant_name(t.plan.variant), t.plan.head_tiles,
                                                      t.plan.num_splits, t.plan.chunks_per_block));
      }
    }
  };
  // Every output and LSE written and finite (every index is valid).
  const auto check_warm_up = [&] { t.bad_outputs += buffers.nonfinite(where); };
  static_cast<BenchReplayTimes&>(t) = bench_graph_replays(stream, where, t.calls, kLongReplayMs, capture, check_warm_up);
  return t;
}

}  // namespace

int run_bench_sparse_dsv41(const BenchOptions& options) {
  const auto t_start = BenchClock::now();
  const Driver& d = Driver::get();
  d.require("kiln bench sparse_dsv41");
  Config config = Config::from_environment();
  if (!options.cache_dir.empty()) config.cache_dir = options.cache_dir;
  KernelService service(config);

  json report = bench_header("sparse_dsv41");
  ScopedDeviceContext context(0);
  const std::string arch = service.device_arch(0);
  const int sms = service.device_sm_count(0);
  const sparse::SparseDevice gpu = sparse::sparse_device(service, 0);
  const dsv41::Dsv41Device device{gpu.arch, gpu.sms, false, gpu.residency};
  const BenchStream bench_stream;
  const CUstream stream = bench_stream.get();

  std::vector<Dsv41Config> grid = bench_grid(options.quick);
  if (!options.only.empty()) {
    std::erase_if(grid, [&](const Dsv41Config& c) { return c.name() != options.only; });
    if (grid.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--only \"{}\" names no config of the grid; use a name as the sweep prints it, e.g. \"T=64 H=128 topk=128+512\"",
                              options.only));
    }
  }
  if (options.splits != 0) {
    throw Error(ErrorCode::kInvalidArgument, "--splits: kiln bench sparse_dsv41 times the planner's splits only");
  }
  // The variants timed per config: every one the device has (both on sm_90a).
  std::vector<Dsv41Variant> variants = {Dsv41Variant::kDefault};
  if (arch == "sm_90a") variants.push_back(Dsv41Variant::kSm90);

  SparseNvfp4Timer nvfp4(service, stream);
  {  // Every key of the grid warmed in parallel: compiles stay out of the timings, capture never compiles.
    const auto t0 = BenchClock::now();
    std::vector<SemanticKey> keys;
    for (const Dsv41Config& c : grid) {
      for (const Dsv41Variant v : variants) {
        const SemanticKey key = dsv41::dsv41_policy(c.heads, c.has_extra(), expected_plan(c, device, v)).key(arch);
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      }
    }
    service.warm(keys, {0});
    std::vector<SparseNvfp4Config> nvfp4_configs;
    for (const Dsv41Config& c : grid) nvfp4_configs.push_back({c.tokens, c.heads, c.topk, c.extra_topk});
    nvfp4.warm(nvfp4_configs);
    std::fprintf(stderr, "warm: %zu dsv41 keys and the NVFP4 keys in %.0f ms (%llu compiles)\n", keys.size(), bench_ms_since(t0),
                 static_cast<unsigned long long>(service.counters().compiles));
  }

  BenchCeilings ceilings(arch, sms, stream);
  const Pool main_pool = make_pool(false, stream);
  const Pool extra_pool = make_pool(true, stream);
  BenchRng rng(0x64737634);

  struct Row {
    Dsv41Config c;
    Dsv41Variant variant;  // the launcher's pick
    std::vector<Timing> t;  // per entry of `variants`
    SparseNvfp4Time nvfp4;
    const Timing& picked(const std::vector<Dsv41Variant>& all) const { return t[std::find(all.begin(), all.end(), variant) - all.begin()]; }
  };
  std::vector<Row> rows;
  for (const Dsv41Config& c : grid) {
    const auto t0 = BenchClock::now();
    Row row{c, dsv41::resolve_dsv41_plan(c.tokens, c.heads, c.topk, c.extra_topk, device).variant, {}, {}};
    for (const Dsv41Variant v : variants) {
      row.t.push_back(time_config(c, main_pool, extra_pool, device, v, stream, rng, service));
      if (row.t.back().bad_outputs > 0) {
        throw Error(ErrorCode::kInternal, fmt::format("dsv41 bench {} variant {}: {} NaN/Inf values in the outputs after a replay: the "
                                                      "kernel is broken for this config, its timing would mean nothing",
                                                      c.name(), dsv41::dsv41_variant_name(v), row.t.back().bad_outputs));
      }
    }
    row.nvfp4 = nvfp4.time({c.tokens, c.heads, c.topk, c.extra_topk});
    const Timing& t = row.picked(variants);
    std::fprintf(stderr, "%-28s %5d calls %9.2f us (%s)  %7.1f GB/s  %6.1f TFLOP/s  plan %d/%d/%d  nvfp4 %9.2f us (%s)  (%.0f ms)\n",
                 c.name().c_str(), t.calls, t.us, dsv41::dsv41_variant_name(row.variant), c.gathered_bytes() / (t.us * 1e-6) * 1e-9,
                 c.flop() / (t.us * 1e-6) * 1e-12, t.plan.head_tiles, t.plan.num_splits, t.plan.chunks_per_block, row.nvfp4.us,
                 row.nvfp4.kernel.c_str(), bench_ms_since(t0));
    rows.push_back(std::move(row));
  }

  ceilings.read_end(stream);
  const double copy_ceiling = ceilings.copy_tb_s();
  const double mma_ceiling = ceilings.mma_tflop_s();
  const double wgmma_ceiling = ceilings.wgmma_tflop_s();

  json results = json::array();
  for (const Row& row : rows) {
    const Dsv41Config& c = row.c;
    const Timing& t = row.picked(variants);
    const double gb_s = c.gathered_bytes() / (t.us * 1e-6) * 1e-9;
    const double tflop_s = c.flop() / (t.us * 1e-6) * 1e-12;
    json r = {{"T", c.tokens},
              {"H", c.heads},
              {"topk", c.topk},
              {"extra_topk", c.extra_topk},
              {"page_size", kPage},
              {"extra_page_size", c.has_extra() ? kPage : 0},
              {"candidates", c.topk + c.extra_topk},
              {"variant", dsv41::dsv41_variant_name(row.variant)},
              {"us_per_call", t.us},
              {"us_min", t.us_min},
              {"us_max", t.us_max},
              {"gathered_gb_s", gb_s},
              {"pct_copy", 100 * gb_s * 1e-3 / copy_ceiling},
              {"tflop_s", tflop_s},
              {"pct_mma_sync_peak", 100 * tflop_s / mma_ceiling},
              {"gathered_bytes_per_call", c.gathered_bytes()},
              {"flop_per_call", c.flop()},
              {"head_tiles", t.plan.head_tiles},
              {"num_splits", t.plan.num_splits},
              {"chunks_per_block", t.plan.chunks_per_block},
              {"cluster", dsv41::dsv41_cluster_size(device, c.tokens, c.heads, t.plan)},
              {"calls_per_graph", t.calls},
              {"replays_timed", t.replays},
              {"gathered_mib_per_replay", t.gathered_mib_per_replay},
              {"us_nvfp4", row.nvfp4.us},
              {"nvfp4_kernel", row.nvfp4.kernel},
              {"nvfp4_plan", fmt::format("{}/{}/{}", row.nvfp4.head_tiles, row.nvfp4.num_splits, row.nvfp4.chunks_per_block)},
              {"nvfp4_speedup", row.nvfp4.us / t.us}};
    if (wgmma_ceiling > 0) r["pct_wgmma_peak"] = 100 * tflop_s / wgmma_ceiling;
    for (std::size_t k = 0; k < variants.size(); ++k) r[fmt::format("us_{}", dsv41::dsv41_variant_name(variants[k]))] = row.t[k].us;
    results.push_back(r);
  }

  report["power_state_after"] = bench_power_state();
  report["sm_count"] = sms;
  report["arch"] = arch;
  report["pool"] = {{"bytes", kPoolBytes},
                    {"page_sizes", fmt::format("{} (main and extra)", kPage)},
                    {"layout", "FOOTER: [P, page, 528] main and [P, page, 288] extra (3-D views)"},
                    {"contents", "main: random finite E4M3 codes, UE8M0 scales 2^-13..2^-8; extra: random E2M1 pairs, E4M3 scales "
                                 "2^-4..0.171875"}};
  report["method"] = {
      {"timing", fmt::format("per config, N launcher calls captured in one CUDA graph, each with its own random indices over the "
                             "whole {:.2f} GB pools, N = clamp(ceil(1 GiB / gathered bytes per call), {}, {}); Q, outputs and split "
                             "scratch shared by the calls; one warm-up replay (outputs poisoned before, checked finite after), then "
                             "5-7 replays timed with cuEvents; us_per_call = median replay time / N",
                             static_cast<double>(kPoolBytes) * 1e-9, kMinCalls, kMaxCalls)},
      {"plan", "the launcher's own (planners for this device's SM count; no overrides)"},
      {"variant", "the launcher's choice for the call; us_<variant>: the same calls with each variant this device has forced"},
      {"nvfp4", "us_nvfp4: kiln's NVFP4 decode (384-byte records) on the same T, H, topk, extra_topk, timed as kiln bench sparse "
                "times it (its own pool and the launcher's own kernel and plan); nvfp4_speedup = us_nvfp4 / us_per_call"},
      {"gathered_bytes", "T * (topk * 528 + extra_topk * 288) (index reads, Q and outputs not counted)"},
      {"flop", "2 * T * H * (topk + extra_topk) * 1024"},
      {"sm_scale", kSmScale},
      {"indices", "uniform random over each pool, all valid; no sink, no lengths"},
      {"quick", options.quick}};
  report["ceilings"] = ceilings.report();
  report["results"] = results;
  report["cache_dir"] = service.config().cache_dir.string();
  report["wall_s"] = bench_ms_since(t_start) / 1000;
  write_report(report, options.out);

  ceilings.print();
  std::fprintf(stderr, "%-4s %-4s %-9s %10s %-8s %8s %6s %8s %6s %10s %10s %-19s %10s %-9s %7s\n", "T", "H", "cands", "us/call", "variant", "GB/s",
               "%copy", "TFLOP/s", "%wgmma", "us default", "us sm90", "tiles/splits/cpb/cl", "us nvfp4", "nvfp4", "speedup");
  for (const json& r : results) {
    const std::string cands = r["extra_topk"].get<int>() ? fmt::format("{}+{}", r["topk"].get<int>(), r["extra_topk"].get<int>())
                                                         : fmt::format("{}", r["topk"].get<int>());
    std::fprintf(stderr, "%-4d %-4d %-9s %10.2f %-8s %8.1f %6.1f %8.1f %6.1f %10.2f %10.2f %-19s %10.2f %-9s %7.2f\n", r["T"].get<int>(),
                 r["H"].get<int>(), cands.c_str(), r["us_per_call"].get<double>(), r["variant"].get<std::string>().c_str(),
                 r["gathered_gb_s"].get<double>(), r["pct_copy"].get<double>(), r["tflop_s"].get<double>(), r.value("pct_wgmma_peak", 0.0),
                 r.value("us_default", 0.0), r.value("us_sm90", 0.0),
                 fmt::format("{}/{}/{}/{}", r["head_tiles"].get<int>(), r["num_splits"].get<int>(), r["chunks_per_block"].get<int>(),
                             r["cluster"].get<int>()).c_str(),
                 r["us_nvfp4"].get<double>(), r["nvfp4_kernel"].get<std::string>().c_str(), r["nvfp4_speedup"].get<double>());
  }
  bench_print_footer(report, json::object());
  return 0;
}

}  // namespace kiln::tools
