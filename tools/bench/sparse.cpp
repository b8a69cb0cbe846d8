// kiln bench sparse: sparse NVFP4 MLA decode, L2-cold, against ceilings measured in the same run.
// "results" is the 30-config grid of the FlashMLA anchors (compare.py reads it); "extended" adds
// head counts 16 and 32, T = 2 and 4, page sizes 32 and 128, and topk_length shorter than topk.
// On sm_90a every config is timed with both decode kernels forced ("us_sm90", "us_mma");
// "us_per_call" is the time of the one the launcher picks for the call ("kernel"), so the choice
// rule can be checked against the same run.
//
// Method (tools/bench/sparse_common.h, shared with kiln bench sparse_dsv41): one 4.5 GiB pool per
// page size in the 384-byte format (the extra pool of the "main 128 + extra 512" candidates is a
// second view of it, as its gathers are as random); per config, N launcher calls in ONE CUDA graph,
// each with its own random index set over the whole pool, so one replay gathers >= 1 GiB (at most
// 1024 calls) that the 50 MB L2 cannot hold from the call before. One warm-up replay, then 7 replays
// timed with driver events (>= 5 when replays are long); per-call time = median replay / N.
// Ceilings: a 1 GiB cuMemcpyDtoDAsync (read + write) and the mma.sync bf16 peak kernel
// (tools/bench/ceilings.h), each at the start and the end of the run, the larger used; on sm_90a
// also the wgmma bf16 peak, read with them.
#include "tools/bench/sparse.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
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
#include "tools/bench/ceilings.h"
#include "tools/bench/report.h"

namespace kiln::tools {

namespace {

using nlohmann::json;

constexpr std::size_t kTokenBytes = 384;

struct BenchConfig : SparseShape {
  int page = 64;          // page size of both pools (DeepSeek V4's main page is 64)
  int length = 0;         // > 0: every token's topk_length (active main prefix), shorter than topk
  bool extended = false;  // not in the anchor grid
  std::optional<int> splits;  // forced split count (--splits), else the planner's
  int candidates() const { return (length > 0 ? length : topk) + extra_topk; }
  std::string name() const {
    std::string n = SparseShape::name();
    if (page != 64) n += fmt::format(" page={}", page);
    if (length > 0) n += fmt::format(" len={}", length);
    return n;
  }
  // Gathered cache bytes of the active candidates (the index reads are not counted) and MMA FLOP.
  double gathered_bytes() const { return static_cast<double>(tokens) * candidates() * kTokenBytes; }
  double flop() const { return 2.0 * tokens * heads * static_cast<double>(candidates()) * 1024; }
};

std::vector<BenchConfig> bench_grid(bool quick) {
  std::vector<BenchConfig> grid;
  for (const SparseShape& s : sparse_anchor_grid(quick, {{512, 0}, {2048, 0}, {128, 512}})) grid.push_back({s});
  if (quick) return grid;
  // Extended: TP 8 of smaller models (H 16, 32), T between 1 and 8, other page sizes, short lengths.
  for (int h : {16, 32})
    for (int t : {1, 8, 64, 512}) grid.push_back({{t, h, 2048, 0}, 64, 0, true});
  for (int t : {2, 4})
    for (int h : {64, 128}) grid.push_back({{t, h, 2048, 0}, 64, 0, true});
  // Where the planner's mma.sync launch gives each CTA three chunks (mma_runs_first's bound).
  for (const SparseShape& s : {SparseShape{3, 64, 2048, 0}, SparseShape{4, 128, 128, 512}, SparseShape{5, 128, 512, 0}})
    grid.push_back({s, 64, 0, true});
  for (int page : {32, 128}) {
    grid.push_back({{1, 128, 2048, 0}, page, 0, true});
    grid.push_back({{64, 128, 2048, 0}, page, 0, true});
  }
  grid.push_back({{64, 128, 2048, 0}, 64, 1000, true});
  grid.push_back({{8, 64, 2048, 0}, 64, 700, true});
  grid.push_back({{1, 128, 2048, 0}, 64, 300, true});
  return grid;
}

// A random page in the exact 384-byte format (any code byte is a valid E2M1 pair; scales are finite
// e4m3 0.25 .. 0.94, padding bytes zero; RoPE bf16 in (-1, 1)), so the decode does real work on
// finite values.
void make_page(std::uint8_t* page, int page_size, BenchRng& rng) {
  for (int r = 0; r < page_size; ++r) {
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
    std::uint8_t* scales = page + page_size * 352 + r * 32;
    for (int g = 0; g < 28; ++g) scales[g] = static_cast<std::uint8_t>(0x28 + rng.next() % 16);
    std::memset(scales + 28, 0, 4);
  }
}

using Timing = SparseTiming<sparse::SplitPlanResult>;

// One pool per page size, made on first use.
class Pools {
 public:
  explicit Pools(CUstream stream) : stream_(stream) {}
  const BenchDeviceMemory& get(int page_size) {
    for (const auto& [size, mem] : pools_)
      if (size == page_size) return *mem;
    const std::size_t page_bytes = page_size * kTokenBytes;
    auto mem = std::make_unique<BenchDeviceMemory>(kSparsePoolBytes / page_bytes * page_bytes, fmt::format("sparse NVFP4 pool (page {})", page_size));
    const auto t0 = BenchClock::now();
    fill_sparse_pool(*mem, page_bytes, BenchRng(0x5b4b5e + page_size),
                     [&](std::uint8_t* page, BenchRng& rng) { make_page(page, page_size, rng); }, stream_, "sparse pool");
    std::fprintf(stderr, "pool (page %d): %.2f GB, filled in %.0f ms\n", page_size, static_cast<double>(mem->bytes()) * 1e-9,
                 bench_ms_since(t0));
    pools_.emplace_back(page_size, std::move(mem));
    return *pools_.back().second;
  }

 private:
  CUstream stream_;
  std::vector<std::pair<int, std::unique_ptr<BenchDeviceMemory>>> pools_;
};

// The launch of an unforced call of `c` (the launcher's plan_sparse_launch, without overrides but
// --splits and `kernel`), with the bench's scratch.
sparse::SparseLaunch bench_launch(const BenchConfig& c, const sparse::SplitPlanResult& plan, const sparse::SparseDevice& dev,
                                  std::optional<sparse::SparseKernel> kernel = std::nullopt) {
  return sparse::plan_sparse_launch(dev, c.tokens, c.heads, sparse::num_chunks(c.topk, c.extra_topk), plan, !c.splits, kernel,
                                    std::nullopt, bench_scratch_splits(c, plan.num_splits));
}

Timing time_config(const BenchConfig& c, const BenchDeviceMemory& pool, int sms, std::optional<sparse::SparseKernel> kernel,
                   std::optional<bool> cluster, CUstream stream, BenchRng& rng, KernelService& service,
                   std::optional<bool> bulk_gather = std::nullopt) {
  const Driver& d = Driver::get();
  const std::string where = c.name() + (kernel ? fmt::format(" kernel {}", sparse::sparse_kernel_name(*kernel)) : std::string()) +
                            (cluster ? fmt::format(" cluster {}", *cluster ? "on" : "off") : std::string()) +
                            (bulk_gather ? fmt::format(" gather {}", *bulk_gather ? "bulk" : "cp.async") : std::string());
  const std::int64_t pool_pages = static_cast<std::int64_t>(pool.bytes() / (c.page * kTokenBytes));
  const std::int64_t pool_tokens = pool_pages * c.page;
  Timing t;
  t.plan = sparse::resolve_plan(c.tokens, c.heads, c.topk, c.extra_topk, sms, c.splits);

  std::optional<BenchDeviceMemory> lengths;
  if (c.length > 0) {
    const std::vector<std::int32_t> len(c.tokens, c.length);
    lengths.emplace(len.size() * 4, where + " topk_length");
    bench_check(d.cuMemcpyHtoD(lengths->ptr(), len.data(), len.size() * 4), "cuMemcpyHtoD", where + " topk_length");
  }
  const TensorView cache = TensorView::contiguous(pool.at(0), DType::kU8, {pool_pages, c.page, 384});
  sparse::SparseOptions opt;
  opt.kernel = kernel;
  opt.cluster = cluster;
  opt.bulk_gather = bulk_gather;
  opt.num_splits = c.splits;
  if (lengths) opt.topk_length = TensorView::contiguous(lengths->at(0), DType::kI32, {c.tokens});
  if (c.has_extra()) opt.extra_kv_cache = cache;

  const auto launch = [&](const TensorView& q, const TensorView& indices, const TensorView& output, const TensorView& out_lse) {
    const sparse::SplitPlanResult plan =
        sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(q, cache, indices, output, out_lse, kSparseSmScale, opt, stream, service);
    if (!(plan == t.plan)) {
      throw Error(ErrorCode::kInternal, fmt::format("sparse bench {}: the launcher resolved plan {}/{}/{}, the bench expected {}/{}/{}",
                                                    where, plan.head_tiles, plan.num_splits, plan.chunks_per_block, t.plan.head_tiles,
                                                    t.plan.num_splits, t.plan.chunks_per_block));
    }
  };
  static_cast<SparseGraphTimes&>(t) =
      time_sparse_graph(c, c.gathered_bytes(), pool_tokens, pool_tokens, bench_scratch_splits(c, t.plan.num_splits), opt, launch, rng,
                        stream, where);
  return t;
}

}  // namespace

struct SparseNvfp4Timer::State {
  KernelService& service;
  CUstream stream;
  std::string arch;
  int sms;
  Pools pools;
  BenchRng rng{0x6e766670};
  sparse::SparseDevice dev;
  State(KernelService& s, CUstream st)
      : service(s), stream(st), arch(s.device_arch(0)), sms(s.device_sm_count(0)), pools(st), dev(sparse::sparse_device(s, 0)) {}
};

SparseNvfp4Timer::SparseNvfp4Timer(KernelService& service, CUstream stream) : state_(std::make_unique<State>(service, stream)) {}

SparseNvfp4Timer::~SparseNvfp4Timer() = default;

void SparseNvfp4Timer::warm(const std::vector<SparseShape>& configs) {
  State& s = *state_;
  std::vector<SemanticKey> keys;
  for (const SparseShape& shape : configs) {
    const BenchConfig c{shape};
    const sparse::SplitPlanResult plan = sparse::resolve_plan(c.tokens, c.heads, c.topk, c.extra_topk, s.sms);
    const sparse::SparseLaunch l = bench_launch(c, plan, s.dev);
    for (const sparse::SplitPlanResult& p : {plan, l.runs}) {
      const SemanticKey key = sparse::sparse_policy(c.heads, c.has_extra(), p, l.kernel).key(s.arch);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  s.service.warm(keys, {0});
}

SparseNvfp4Time SparseNvfp4Timer::time(const SparseShape& shape) {
  State& s = *state_;
  const BenchConfig c{shape};
  const Timing t = time_config(c, s.pools.get(c.page), s.sms, std::nullopt, std::nullopt, s.stream, s.rng, s.service);
  if (t.bad_outputs > 0) {
    throw Error(ErrorCode::kInternal, fmt::format("sparse NVFP4 timing {}: {} NaN/Inf values in the outputs after a replay", c.name(),
                                                  t.bad_outputs));
  }
  SparseNvfp4Time r;
  r.us = t.us;
  r.us_min = t.us_min;
  r.us_max = t.us_max;
  r.calls = t.calls;
  r.kernel = sparse::sparse_kernel_name(bench_launch(c, t.plan, s.dev).kernel);
  r.head_tiles = t.plan.head_tiles;
  r.num_splits = t.plan.num_splits;
  r.chunks_per_block = t.plan.chunks_per_block;
  return r;
}

int run_bench_sparse(const BenchOptions& options) {
  const auto t_start = BenchClock::now();
  const Driver& d = Driver::get();
  d.require("kiln bench sparse");
  Config config = Config::from_environment();
  if (!options.cache_dir.empty()) config.cache_dir = options.cache_dir;
  KernelService service(config);
  const bool quick = options.quick;

  json report = bench_header("sparse");
  const sparse::SparseDevice dev = sparse::sparse_device(service, 0);
  ScopedDeviceContext context(0);
  const std::string arch = service.device_arch(0);
  const int sms = service.device_sm_count(0);
  const BenchStream bench_stream;
  const CUstream stream = bench_stream.get();

  std::vector<BenchConfig> grid = bench_grid(quick);
  sparse_keep_only(grid, options.only, "T=64 H=128 topk=2048");
  if (options.splits != 0) {
    if (options.only.empty() || options.splits < 1) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("--splits {}: give a count >= 1 together with --only (one config)", options.splits));
    }
    grid.front().splits = options.splits;
    sparse::resolve_splits(grid.front().topk, grid.front().extra_topk, options.splits);  // refuses a count the kernels cannot take
  }
  const bool hopper = arch == "sm_90a";
  // The kernels timed per config: on sm_90a both the launcher may pick, else its one choice.
  const std::vector<sparse::SparseKernel> kernels =
      hopper ? std::vector<sparse::SparseKernel>{sparse::SparseKernel::kSm90, sparse::SparseKernel::kMma}
             : std::vector<sparse::SparseKernel>{sparse::SparseKernel::kMmaSmall};
  // Warm every key the grid's calls use, in parallel: compiles stay out of the timings, and
  // capture never compiles.
  {
    const auto t0 = BenchClock::now();
    std::vector<SemanticKey> keys;
    for (const BenchConfig& c : grid) {
      const sparse::SplitPlanResult plan = sparse::resolve_plan(c.tokens, c.heads, c.topk, c.extra_topk, sms, c.splits);
      for (const sparse::SparseKernel kernel : kernels) {
        // The planned split and, where the launch runs it as one dealt split, that one too (timed
        // with dealing forced off, it runs as planned).
        for (const sparse::SplitPlanResult& p : {plan, bench_launch(c, plan, dev, kernel).runs}) {
          const SemanticKey key = sparse::sparse_policy(c.heads, c.has_extra(), p, kernel).key(arch);
          if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
        }
      }
    }
    service.warm(keys, {0});
    std::fprintf(stderr, "warm: %zu keys in %.0f ms (%llu compiles)\n", keys.size(), bench_ms_since(t0),
                 static_cast<unsigned long long>(service.counters().compiles));
  }

  BenchCeilings ceilings(arch, sms, stream);

  Pools pools(stream);
  BenchRng rng(0x73706172);
  struct Row {
    BenchConfig c;
    sparse::SparseKernel kernel;  // the launcher's pick
    std::vector<Timing> t;        // per entry of `kernels`
    int cluster = 1;              // CTAs per cluster of the mma.sync launch
    std::optional<Timing> mma_no_cluster;  // the mma.sync kernel without a cluster, where it has one
    bool mma_bulk = false;                 // the mma.sync launch's gather (sparse_bulk_gather)
    std::optional<Timing> mma_other_gather;  // the mma.sync kernel with the other gather forced
    sparse::SparseLaunch sm90;    // the sm90 launch (plan_sparse_launch): the plan it runs, the CTAs sharing a split, unpaired
    std::optional<Timing> sm90_no_deal;    // the sm90 kernel without dealing, where it deals
    int deal_forced = 1;          // the same with dealing forced on
    std::optional<Timing> sm90_deal_forced;  // where that differs from the launcher's
    const Timing& picked(const std::vector<sparse::SparseKernel>& all) const {
      return t[std::find(all.begin(), all.end(), kernel) - all.begin()];
    }
  };
  std::vector<Row> rows;
  for (const BenchConfig& c : grid) {
    const auto t0 = BenchClock::now();
    const BenchDeviceMemory& pool = pools.get(c.page);
    const sparse::SplitPlanResult plan = sparse::resolve_plan(c.tokens, c.heads, c.topk, c.extra_topk, sms, c.splits);
    Row row{c, bench_launch(c, plan, dev).kernel, {}};
    for (const sparse::SparseKernel kernel : kernels) {
      row.t.push_back(time_config(c, pool, sms, kernel, std::nullopt, stream, rng, service));
      if (row.t.back().bad_outputs > 0) {
        throw Error(ErrorCode::kInternal, fmt::format("sparse bench {} kernel {}: {} NaN/Inf values in the outputs after a replay: the "
                                                      "kernel is broken for this config, its timing would mean nothing",
                                                      c.name(), sparse::sparse_kernel_name(kernel), row.t.back().bad_outputs));
      }
    }
    if (hopper) {
      const sparse::SparseLaunch mma = bench_launch(c, plan, dev, sparse::SparseKernel::kMma);
      row.cluster = mma.cluster;
      row.mma_bulk = mma.bulk_gather;
      row.mma_other_gather = time_config(c, pool, sms, sparse::SparseKernel::kMma, std::nullopt, stream, rng, service, !mma.bulk_gather);
    }
    if (row.cluster > 1) row.mma_no_cluster = time_config(c, pool, sms, sparse::SparseKernel::kMma, false, stream, rng, service);
    if (hopper && std::find(kernels.begin(), kernels.end(), sparse::SparseKernel::kSm90) != kernels.end()) {
      row.sm90 = bench_launch(c, plan, dev, sparse::SparseKernel::kSm90);
      row.deal_forced = sparse::sparse_cluster_size(dev, c.tokens, c.heads, plan, true, sparse::SparseKernel::kSm90);
      if (row.sm90.cluster > 1) row.sm90_no_deal = time_config(c, pool, sms, sparse::SparseKernel::kSm90, false, stream, rng, service);
      if (row.deal_forced != row.sm90.cluster) row.sm90_deal_forced = time_config(c, pool, sms, sparse::SparseKernel::kSm90, true, stream, rng, service);
    }
    const Timing& t = row.picked(kernels);
    std::fprintf(stderr, "%-34s %5d calls %9.2f us (%s)  %7.1f GB/s  %6.1f TFLOP/s  plan %d/%d/%d  (%.0f ms)\n", c.name().c_str(), t.calls,
                 t.us, sparse::sparse_kernel_name(row.kernel), c.gathered_bytes() / (t.us * 1e-6) * 1e-9,
                 c.flop() / (t.us * 1e-6) * 1e-12, t.plan.head_tiles, t.plan.num_splits, t.plan.chunks_per_block, bench_ms_since(t0));
    rows.push_back(std::move(row));
  }

  // Ceilings, second reading: clocks and power may have moved over the sweep.
  ceilings.read_end(stream);

  json results = json::array(), extended = json::array();
  json bars = {{"h128_2048_t64plus_vs_flashmla", json::array()}, {"t1_latency_12us", json::array()}};
  for (const Row& row : rows) {
    const BenchConfig& c = row.c;
    const Timing& t = row.picked(kernels);
    json r = sparse_row(c, c.gathered_bytes(), c.flop(), t, ceilings);
    r["page_size"] = c.page;
    r["candidates"] = c.candidates();
    r["kernel"] = sparse::sparse_kernel_name(row.kernel);
    if (c.length > 0) r["topk_length"] = c.length;
    for (std::size_t k = 0; k < kernels.size(); ++k) r[fmt::format("us_{}", sparse::sparse_kernel_name(kernels[k]))] = row.t[k].us;
    if (hopper) r["mma_cluster"] = row.cluster;
    if (c.splits) r["num_splits_forced"] = true;
    if (row.mma_no_cluster) r["us_mma_no_cluster"] = row.mma_no_cluster->us;
    if (hopper) r["mma_gather"] = row.mma_bulk ? "bulk" : "cp.async";
    if (row.mma_other_gather) r["us_mma_other_gather"] = row.mma_other_gather->us;
    if (hopper) {
      r["sm90_deal"] = row.sm90.cluster;
      r["sm90_runs"] = fmt::format("{}/{}", row.sm90.runs.num_splits, row.sm90.runs.chunks_per_block);
      r["sm90_unpaired"] = row.sm90.unpaired;
    }
    if (row.sm90_no_deal) r["us_sm90_no_deal"] = row.sm90_no_deal->us;
    if (row.sm90_deal_forced) {
      r["sm90_deal_forced"] = row.deal_forced;
      r["us_sm90_deal_forced"] = row.sm90_deal_forced->us;
    }
    (c.extended ? extended : results).push_back(r);
    if (c.extended) continue;
    const json key = {{"T", c.tokens}, {"H", c.heads}, {"topk", c.topk}, {"extra_topk", c.extra_topk}};
    // FlashMLA's FP8 sparse decode on an H200 reaches 412-416 TFLOP/s here
    // (tools/bench/results/flashmla_h200_sparse.csv).
    if (c.heads == 128 && c.topk == 2048 && c.extra_topk == 0 && c.tokens >= 64) {
      const double tflop_s = r["tflop_s"].get<double>();
      bars["h128_2048_t64plus_vs_flashmla"].push_back({{"config", key}, {"tflop_s", tflop_s}, {"pass", tflop_s >= 412}});
    }
    if (c.tokens == 1) bars["t1_latency_12us"].push_back({{"config", key}, {"us", t.us}, {"pass", t.us <= 12}});
  }
  const json bar_summary = bench_bar_summary(bars);

  report["power_state_after"] = bench_power_state();
  report["sm_count"] = sms;
  report["cluster_residency"] = std::vector<int>(dev.residency.clusters.begin() + 1, dev.residency.clusters.end());
  report["arch"] = arch;
  report["pool"] = {{"bytes", kSparsePoolBytes}, {"page_sizes", "64 (32 and 128 in extended rows), one pool each"},
                    {"layout", "[P, page, 384] (compact)"},
                    {"extra_pool", "a second view of the same pool, indices drawn independently"}};
  report["method"] = {
      {"timing", sparse_timing_method("pool")},
      {"plan", "the launcher's own (planners for this device's SM count; no overrides)"},
      {"kernel", "the launcher's choice for the call; us_<kernel>: the same calls forced onto each kernel it may pick here"},
      {"mma_cluster", "CTAs per cluster sharing a split's chunks in the mma.sync launch (sparse_cluster_size of the plan it runs, "
                      "sparse_launch_plan: a planned split small enough runs as one split dealt over one cluster); us_mma_no_cluster: "
                      "the same calls on mma.sync with the cluster forced off (so also run as planned), where it has one"},
      {"mma_gather", "how the mma.sync launch gathers records (sparse_bulk_gather: one bulk copy per record's data, or 16-byte "
                     "cp.asyncs); us_mma_other_gather: the same calls on mma.sync with the other gather forced"},
      {"scratch", "mid_out / mid_lse hold one split per chunk (S = num_chunks, at least the plan's splits), as upstream's "
                  "scratch_bytes sizes a workspace"},
      {"sm90_runs", "splits / chunks per split the sm90 launch runs (sparse_launch_plan: where the scratch holds more splits "
                    "than planned and the 64-head CTAs fit one wave, the most that do)"},
      {"sm90_unpaired", "whether that launch runs the head groups of H > 64 as CTAs of their own rather than cluster pairs "
                        "(sparse_sm90_unpaired)"},
      {"sm90_deal", "CTAs per head group sharing a split's chunks in the sm90 launch (sparse_cluster_size for kSm90); "
                    "us_sm90_no_deal: forced off where it deals; sm90_deal_forced / us_sm90_deal_forced: forced on, where that "
                    "gives another size"},
      {"gathered_bytes", "T * active candidates * 384 (index reads, Q and outputs not counted)"},
      {"flop", "2 * T * H * candidates * 1024"},
      {"sm_scale", kSparseSmScale},
      {"indices", "uniform random over the pool, all valid; no sink; topk_length only where a row has one"},
      {"quick", quick}};
  report["bars"] = bars;
  report["bar_summary"] = bar_summary;
  report["results"] = results;
  report["extended"] = extended;
  // The compact table last, on stderr (stdout carries the JSON).
  bench_finish_report(report, ceilings, service.config().cache_dir.string(), t_start, options.out);
  std::fprintf(stderr, "%-4s %-4s %-9s %-5s %-5s %10s %-9s %8s %6s %8s %6s %9s %9s %-8s %11s %-16s %2s %12s %2s %12s %2s %12s\n", "T", "H", "cands",
               "page", "len", "us/call", "kernel", "GB/s", "%copy", "TFLOP/s", "%wgmma", "us sm90", "us mma", "gather", "mma other g",
               "tiles/splits/cpb", "cl", "us mma 1 CTA", "dl", "sm90 no deal", "df", "sm90 deal df");
  for (const json* list : {&results, &extended}) {
    for (const json& r : *list) {
      const std::string cands = sparse_candidates(r["topk"].get<int>(), r["extra_topk"].get<int>());
      std::fprintf(stderr, "%-4d %-4d %-9s %-5d %-5d %10.2f %-9s %8.1f %6.1f %8.1f %6.1f %9.2f %9.2f %-8s %11.2f %-16s %2d %12.2f %2d %12.2f %2d %12.2f\n",
                   r["T"].get<int>(),
                   r["H"].get<int>(), cands.c_str(), r["page_size"].get<int>(), r.value("topk_length", 0), r["us_per_call"].get<double>(),
                   r["kernel"].get<std::string>().c_str(), r["gathered_gb_s"].get<double>(), r["pct_copy"].get<double>(),
                   r["tflop_s"].get<double>(), r.value("pct_wgmma_peak", 0.0), r.value("us_sm90", 0.0), r.value("us_mma", 0.0),
                   r.value("mma_gather", std::string("-")).c_str(), r.value("us_mma_other_gather", 0.0),
                   fmt::format("{}/{}/{}", r["head_tiles"].get<int>(), r["num_splits"].get<int>(), r["chunks_per_block"].get<int>()).c_str(),
                   r.value("mma_cluster", 1), r.value("us_mma_no_cluster", 0.0), r.value("sm90_deal", 1), r.value("us_sm90_no_deal", 0.0),
                   r.value("sm90_deal_forced", 0), r.value("us_sm90_deal_forced", 0.0));
    }
  }
  bench_print_footer(report, bar_summary);
  return 0;
}

}  // namespace kiln::tools
