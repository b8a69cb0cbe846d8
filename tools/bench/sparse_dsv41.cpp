// kiln bench sparse_dsv41: sparse MLA decode over the DeepSeek-V4.1 caches, L2-cold, against ceilings
// measured in the same run, beside kiln's NVFP4 decode on the same configs. "results" is the
// 30-config grid of the FlashMLA FP8 sparse anchors (compare.py reads it: T, H, topk, extra_topk,
// us_per_call). On sm_90a every config is timed with each variant forced ("us_default", "us_sm90",
// and "us_default_compact": "default" with its compact body, the sm_120a one, bulk_gather false);
// "us_per_call" is the time of the variant the launcher picks ("variant"). "us_nvfp4" is kiln's
// NVFP4 decode on the same (T, H, topk, extra_topk), timed as `kiln bench sparse` times it.
//
// Method (that of `kiln bench sparse`, tools/bench/sparse_common.h): one 4.5 GiB pool of 528-byte
// main records and one of 288-byte extra records (page 64 both, the FOOTER layout), filled with
// random finite codes and scales of the writers' range; per config, N launcher calls in ONE CUDA
// graph, each with its own random index sets over the whole pools, so one replay gathers >= 1 GiB
// (at most 1024 calls) that the 50 MB L2 cannot hold from the call before; per-call time = median
// replay / N.
#include "tools/bench/sparse_dsv41.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
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
#include "tools/bench/sparse_common.h"

namespace kiln::tools {

namespace {

using nlohmann::json;
using dsv41::Dsv41Variant;

constexpr std::size_t kMainRecord = 528, kExtraRecord = 288;
constexpr int kPage = 64;  // both pools

// Gathered record bytes (index reads not counted) and MMA FLOP (QK and PV over 512 dims each).
double gathered_bytes(const SparseShape& c) {
  return static_cast<double>(c.tokens) * (static_cast<double>(c.topk) * kMainRecord + static_cast<double>(c.extra_topk) * kExtraRecord);
}
double flop(const SparseShape& c) { return 2.0 * c.tokens * c.heads * static_cast<double>(c.topk + c.extra_topk) * 1024; }

// A random page in the FOOTER layout: main codes any finite E4M3, scales 2^-13 .. 2^-8 (the writer's
// range for latents in [-1, 1]); extra codes any E2M1 pair, scales E4M3 2^-4 .. 0.171875.
void make_page(std::uint8_t* page, bool extra, BenchRng& rng) {
  const std::size_t data = extra ? 256 : 512, scale = extra ? 32 : 16;
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

struct Pool {
  std::unique_ptr<BenchDeviceMemory> mem;
  std::int64_t pages = 0;
  std::int64_t slots() const { return pages * kPage; }
};

Pool make_pool(bool extra, CUstream stream) {
  const std::size_t page_bytes = kPage * (extra ? kExtraRecord : kMainRecord);
  Pool p;
  p.pages = static_cast<std::int64_t>(kSparsePoolBytes / page_bytes);
  p.mem = std::make_unique<BenchDeviceMemory>(static_cast<std::size_t>(p.pages) * page_bytes, extra ? "dsv41 extra pool" : "dsv41 main pool");
  const auto t0 = BenchClock::now();
  fill_sparse_pool(*p.mem, page_bytes, BenchRng(extra ? 0x64737834 : 0x64736d34),
                   [&](std::uint8_t* page, BenchRng& rng) { make_page(page, extra, rng); }, stream, "dsv41 pool");
  std::fprintf(stderr, "%s pool: %.2f GB, filled in %.0f ms\n", extra ? "extra (288 B)" : "main (528 B)",
               static_cast<double>(p.mem->bytes()) * 1e-9, bench_ms_since(t0));
  return p;
}

using Timing = SparseTiming<dsv41::Dsv41Plan>;

dsv41::Dsv41Plan expected_plan(const SparseShape& c, const dsv41::Dsv41Device& device, Dsv41Variant variant) {
  return dsv41::resolve_dsv41_plan(c.tokens, c.heads, c.topk, c.extra_topk, device, variant);
}

// The plan the launch of `plan` runs with that scratch (dsv41_launch_plan).
dsv41::Dsv41Plan launch_runs(const SparseShape& c, const dsv41::Dsv41Device& device, const dsv41::Dsv41Plan& plan) {
  return dsv41::dsv41_launch_plan(device, c.tokens, c.heads, sparse::num_chunks(c.topk, c.extra_topk), plan, true, std::nullopt,
                                  bench_scratch_splits(c, plan.num_splits));
}

Timing time_config(const SparseShape& c, const Pool& main, const Pool& extra, const dsv41::Dsv41Device& device, Dsv41Variant variant,
                   std::optional<bool> bulk_gather, CUstream stream, BenchRng& rng, KernelService& service) {
  const std::string where =
      fmt::format("{} variant {}{}", c.name(), dsv41::dsv41_variant_name(variant), bulk_gather ? (*bulk_gather ? " bulk" : " compact") : "");
  Timing t;
  t.plan = expected_plan(c, device, variant);

  const TensorView main_view = TensorView::contiguous(main.mem->at(0), DType::kU8, {main.pages, kPage, static_cast<std::int64_t>(kMainRecord)});
  dsv41::Dsv41Options opt;
  opt.variant = dsv41::dsv41_variant_name(variant);
  opt.bulk_gather = bulk_gather;
  if (c.has_extra()) {
    opt.extra_kv_cache = TensorView::contiguous(extra.mem->at(0), DType::kU8, {extra.pages, kPage, static_cast<std::int64_t>(kExtraRecord)});
  }

  const auto launch = [&](const TensorView& q, const TensorView& indices, const TensorView& output, const TensorView& out_lse) {
    const dsv41::Dsv41Plan plan =
        dsv41::cake_sparse_mla_sm120_dsv41_mixed_decode(q, main_view, indices, output, out_lse, kSparseSmScale, opt, stream, service);
    if (!(plan == t.plan)) {
      throw Error(ErrorCode::kInternal, fmt::format("dsv41 bench {}: the launcher resolved plan {} {}/{}/{}, the bench expected {} {}/{}/{}",
                                                    where, dsv41::dsv41_variant_name(plan.variant), plan.head_tiles, plan.num_splits,
                                                    plan.chunks_per_block, dsv41::dsv41_variant_name(t.plan.variant), t.plan.head_tiles,
                                                    t.plan.num_splits, t.plan.chunks_per_block));
    }
  };
  static_cast<SparseGraphTimes&>(t) =
      time_sparse_graph(c, gathered_bytes(c), main.slots(), extra.slots(), bench_scratch_splits(c, t.plan.num_splits), opt, launch, rng,
                        stream, where);
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

  std::vector<SparseShape> grid = sparse_anchor_grid(options.quick, {{128, 512}, {512, 0}, {2048, 0}});
  sparse_keep_only(grid, options.only, "T=64 H=128 topk=128+512");
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
    for (const SparseShape& c : grid) {
      for (const Dsv41Variant v : variants) {
        const dsv41::Dsv41Plan plan = expected_plan(c, device, v);
        for (const dsv41::Dsv41Plan& p : {plan, launch_runs(c, device, plan)}) {
          const SemanticKey key = dsv41::dsv41_policy(c.heads, c.has_extra(), p).key(arch);
          if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
        }
      }
    }
    service.warm(keys, {0});
    nvfp4.warm(grid);
    std::fprintf(stderr, "warm: %zu dsv41 keys and the NVFP4 keys in %.0f ms (%llu compiles)\n", keys.size(), bench_ms_since(t0),
                 static_cast<unsigned long long>(service.counters().compiles));
  }

  BenchCeilings ceilings(arch, sms, stream);
  const Pool main_pool = make_pool(false, stream);
  const Pool extra_pool = make_pool(true, stream);
  BenchRng rng(0x64737634);

  struct Row {
    SparseShape c;
    Dsv41Variant variant;  // the launcher's pick
    std::vector<Timing> t;  // per entry of `variants`
    std::optional<Timing> compact;  // sm_90a: "default" with its compact body
    SparseNvfp4Time nvfp4;
    const Timing& picked(const std::vector<Dsv41Variant>& all) const { return t[std::find(all.begin(), all.end(), variant) - all.begin()]; }
  };
  std::vector<Row> rows;
  for (const SparseShape& c : grid) {
    const auto t0 = BenchClock::now();
    Row row{c, dsv41::resolve_dsv41_plan(c.tokens, c.heads, c.topk, c.extra_topk, device).variant, {}, {}};
    const auto timed = [&](Dsv41Variant v, std::optional<bool> bulk_gather) {
      Timing t = time_config(c, main_pool, extra_pool, device, v, bulk_gather, stream, rng, service);
      if (t.bad_outputs > 0) {
        throw Error(ErrorCode::kInternal, fmt::format("dsv41 bench {} variant {}: {} NaN/Inf values in the outputs after a replay: the "
                                                      "kernel is broken for this config, its timing would mean nothing",
                                                      c.name(), dsv41::dsv41_variant_name(v), t.bad_outputs));
      }
      return t;
    };
    for (const Dsv41Variant v : variants) row.t.push_back(timed(v, std::nullopt));
    if (arch == "sm_90a") row.compact = timed(Dsv41Variant::kDefault, false);
    row.nvfp4 = nvfp4.time(c);
    const Timing& t = row.picked(variants);
    std::fprintf(stderr, "%-28s %5d calls %9.2f us (%s)  %7.1f GB/s  %6.1f TFLOP/s  plan %d/%d/%d  nvfp4 %9.2f us (%s)  (%.0f ms)\n",
                 c.name().c_str(), t.calls, t.us, dsv41::dsv41_variant_name(row.variant), gathered_bytes(c) / (t.us * 1e-6) * 1e-9,
                 flop(c) / (t.us * 1e-6) * 1e-12, t.plan.head_tiles, t.plan.num_splits, t.plan.chunks_per_block, row.nvfp4.us,
                 row.nvfp4.kernel.c_str(), bench_ms_since(t0));
    rows.push_back(std::move(row));
  }

  ceilings.read_end(stream);

  json results = json::array();
  for (const Row& row : rows) {
    const SparseShape& c = row.c;
    const Timing& t = row.picked(variants);
    json r = sparse_row(c, gathered_bytes(c), flop(c), t, ceilings);
    r["page_size"] = kPage;
    r["extra_page_size"] = c.has_extra() ? kPage : 0;
    r["candidates"] = c.topk + c.extra_topk;
    r["variant"] = dsv41::dsv41_variant_name(row.variant);
    const dsv41::Dsv41Plan runs = launch_runs(c, device, t.plan);
    r["runs"] = fmt::format("{}/{}", runs.num_splits, runs.chunks_per_block);
    const int cluster = dsv41::dsv41_cluster_size(device, c.tokens, c.heads, runs);
    r["cluster"] = cluster;
    r["unpaired"] = dsv41::dsv41_unpaired(device, c.tokens, c.heads, runs, cluster);
    r["us_nvfp4"] = row.nvfp4.us;
    r["nvfp4_kernel"] = row.nvfp4.kernel;
    r["nvfp4_plan"] = fmt::format("{}/{}/{}", row.nvfp4.head_tiles, row.nvfp4.num_splits, row.nvfp4.chunks_per_block);
    r["nvfp4_speedup"] = row.nvfp4.us / t.us;
    for (std::size_t k = 0; k < variants.size(); ++k) r[fmt::format("us_{}", dsv41::dsv41_variant_name(variants[k]))] = row.t[k].us;
    if (row.compact) r["us_default_compact"] = row.compact->us;
    results.push_back(r);
  }

  report["power_state_after"] = bench_power_state();
  report["sm_count"] = sms;
  report["arch"] = arch;
  report["pool"] = {{"bytes", kSparsePoolBytes},
                    {"page_sizes", fmt::format("{} (main and extra)", kPage)},
                    {"layout", "FOOTER: [P, page, 528] main and [P, page, 288] extra (3-D views)"},
                    {"contents", "main: random finite E4M3 codes, UE8M0 scales 2^-13..2^-8; extra: random E2M1 pairs, E4M3 scales "
                                 "2^-4..0.171875"}};
  report["method"] = {
      {"timing", sparse_timing_method("pools")},
      {"plan", "the launcher's own (planners for this device's SM count; no overrides)"},
      {"scratch", "mid_out / mid_lse hold one split per chunk (S = num_chunks, at least the plan's splits), as upstream's "
                  "scratch_bytes sizes a workspace; runs: splits / chunks per split the launch runs with it (dsv41_launch_plan)"},
      {"unpaired", "whether an sm90 launch runs the head groups of H > 64 as CTAs of their own rather than cluster pairs "
                   "(sparse_sm90_unpaired)"},
      {"variant", "the launcher's choice for the call; us_<variant>: the same calls with each variant this device has forced; "
                  "us_default_compact: \"default\" with bulk_gather false (its compact body, sm_120a's, forced on sm_90a)"},
      {"nvfp4", "us_nvfp4: kiln's NVFP4 decode (384-byte records) on the same T, H, topk, extra_topk, timed as kiln bench sparse "
                "times it (its own pool and the launcher's own kernel and plan); nvfp4_speedup = us_nvfp4 / us_per_call"},
      {"gathered_bytes", "T * (topk * 528 + extra_topk * 288) (index reads, Q and outputs not counted)"},
      {"flop", "2 * T * H * (topk + extra_topk) * 1024"},
      {"sm_scale", kSparseSmScale},
      {"indices", "uniform random over each pool, all valid; no sink, no lengths"},
      {"quick", options.quick}};
  report["results"] = results;
  bench_finish_report(report, ceilings, service.config().cache_dir.string(), t_start, options.out);
  std::fprintf(stderr, "%-4s %-4s %-9s %10s %-8s %8s %6s %8s %6s %10s %10s %-19s %10s %-9s %7s\n", "T", "H", "cands", "us/call", "variant", "GB/s",
               "%copy", "TFLOP/s", "%wgmma", "us default", "us sm90", "tiles/splits/cpb/cl", "us nvfp4", "nvfp4", "speedup");
  for (const json& r : results) {
    const std::string cands = sparse_candidates(r["topk"].get<int>(), r["extra_topk"].get<int>());
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
