// kiln bench mla: paged MLA decode over the DeepSeek-V3 decode grid, L2-cold, against ceilings
// measured in the same run.
//
// Method: for each config, capture many launcher calls in ONE CUDA graph, each over its own query,
// output and block tables (pages drawn at random from a 1.5 GiB pool), so that one replay streams
// >= 768 MiB of KV and the 50 MB L2 never holds what the next call reads. Replay once to warm, then
// time >= 5 replays with driver events; per-call time = median replay / calls.
// Ceilings: a 1 GiB cuMemcpyDtoDAsync (bytes read + written), an NVRTC-compiled mma.sync bf16 peak
// kernel and, on sm_90a, an NVRTC-compiled wgmma bf16 peak kernel (tools/bench/ceilings.h), each
// measured at the start and the end of the run (the larger is used).
//
// "results" holds the 120-config uniform grid (bf16, page 64, fixed SQ, causal) in both precisions
// (each row says which), the rows tools/bench/compare.py matches with the FlashMLA and FA3 anchors.
// "extra_results" holds the rest (precision exact): mixed-length
// batches (lengths log-uniform in [64, 32k]), fp8 (each config also with the mma.sync kernel
// forced), packed query rows, page sizes 16 and 128, and the grid rows with H * SQ <= 64 again with
// each kernel forced (what the planner's choices rest on). --only keeps one group or one config.
#include "tools/bench/mla.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/mla_decode/launcher.h"
#include "kiln/runtime/mla_decode/planner.h"
#include "tools/bench/ceilings.h"
#include "tools/bench/report.h"

namespace kiln::tools {

namespace {

using nlohmann::json;

// DeepSeek-V3's context: the key a server warms (and the default manifest prebuilds), so the bench
// times the kernels a server runs. Only the block-table width depends on it.
constexpr long long kMaxSeqLen = 163840;
constexpr std::size_t kPoolBytes = 1536 * kBenchMiB;
constexpr std::size_t kRotateBytes = 768 * kBenchMiB;  // KV streamed per replay, at least
constexpr int kMinCalls = 2;
constexpr int kMaxCalls = 1024;
constexpr std::size_t kMaxQueryBytes = 1024 * kBenchMiB;  // distinct Q (+ O) sets per graph, at most
constexpr double kBmm1Scale = 0.07216878364870322;  // 1/sqrt(192), DeepSeek's softmax scale
// >= 5 replays timed always; long replays (compute-bound giants) stop there to fit the time budget.
constexpr double kLongReplayMs = 60;
constexpr double kMemoryBoundShareOfCopy = 0.92;  // the memory_bound bar: this share of the copy ceiling

struct BenchConfig {
  int batch, len, heads, sq;
  std::string group = "grid";  // grid | mixed | fp8 | packed | page | kernel
  int page_size = 64;
  bool fp8 = false;
  bool packed = false;     // q_lens drawn in 1..sq per request
  bool mixed = false;      // lengths log-uniform in [64, 32k] (len = their mean, for the name)
  mla::MlaKernel kernel = mla::MlaKernel::kAuto;
  mla::MlaPrecision precision = mla::MlaPrecision::kExact;
  std::vector<int> lens;   // per request
  std::vector<int> q_lens;  // per request

  std::string name() const {
    std::string s = fmt::format("B={} L={} H={} SQ={}", batch, len, heads, sq);
    if (precision == mla::MlaPrecision::kBf16) s += " precision=bf16";
    if (group == "grid") return s;
    if (mixed) s += " mixed";
    if (fp8) s += " fp8";
    if (packed) s += " packed";
    if (page_size != 64) s += fmt::format(" page={}", page_size);
    if (kernel == mla::MlaKernel::kMmaSync) s += " kernel=mma_sync";
    if (kernel == mla::MlaKernel::kWgmma) s += " kernel=wgmma";
    if (kernel == mla::MlaKernel::kWgmmaKv) s += " kernel=wgmma_kv";
    return s;
  }
  mla::MlaDecodePolicy policy() const {
    return {heads, page_size, kMaxSeqLen, sq, packed, fp8 ? DType::kE4m3 : DType::kBf16, DType::kBf16,
            mla::MaskType::kCausal, kernel, precision};
  }
  std::size_t row_bytes() const { return fp8 ? 576 : 576 * 2; }
  long long tokens() const {
    long long t = 0;
    for (int l : lens) t += l;
    return t;
  }
  int total_q() const {
    int t = 0;
    for (int q : q_lens) t += q;
    return t;
  }
  double kv_bytes() const { return static_cast<double>(tokens()) * row_bytes(); }
  std::size_t q_bytes() const { return static_cast<std::size_t>(total_q()) * heads * row_bytes(); }
  std::size_t o_bytes() const { return static_cast<std::size_t>(total_q()) * heads * 512 * 2; }
  double bytes() const { return kv_bytes() + static_cast<double>(q_bytes() + o_bytes()); }
  double flop() const {
    double f = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) f += static_cast<double>(lens[b]) * q_lens[b];
    return 2.0 * f * heads * 1088;
  }
};

BenchConfig uniform(int b, int l, int h, int sq) {
  BenchConfig c{b, l, h, sq};
  c.lens.assign(b, l);
  c.q_lens.assign(b, sq);
  return c;
}

std::vector<BenchConfig> bench_grid(bool quick) {
  std::vector<BenchConfig> grid;
  if (quick) {
    for (int b : {1, 64})
      for (int h : {16, 128}) grid.push_back(uniform(b, 4096, h, 1));
  } else {
    for (int b : {1, 8, 32, 64, 128})
      for (int l : {1024, 4096, 16384})
        for (int h : {16, 32, 64, 128})
          for (int sq : {1, 2}) grid.push_back(uniform(b, l, h, sq));
  }
  // Both precisions of every row (the exact rows first).
  const std::size_t exact = grid.size();
  for (std::size_t i = 0; i < exact; ++i) {
    grid.push_back(grid[i]);
    grid.back().precision = mla::MlaPrecision::kBf16;
  }
  return grid;
}

std::vector<BenchConfig> extra_configs(bool quick, const std::string& arch) {
  std::vector<BenchConfig> x;
  BenchRng rng(0x6d697865);
  const auto log_uniform = [&rng](int b) {
    std::vector<int> lens;
    for (int i = 0; i < b; ++i) {
      const double u = static_cast<double>(rng.next() >> 11) / 9007199254740992.0;
      lens.push_back(static_cast<int>(std::exp(std::log(64.0) + u * (std::log(32768.0) - std::log(64.0)))));
    }
    return lens;
  };
  const auto mixed = [&](int b, int h, int sq) {
    BenchConfig c = uniform(b, 0, h, sq);
    c.group = "mixed";
    c.mixed = true;
    c.lens = log_uniform(b);
    c.len = static_cast<int>(c.tokens() / b);
    return c;
  };
  if (quick) {
    x.push_back(mixed(32, 128, 1));
    return x;
  }
  for (int b : {4, 32, 128})
    for (int h : {16, 128}) x.push_back(mixed(b, h, 1));
  x.push_back(mixed(32, 64, 2));
  for (int b : {1, 8, 64, 128})
    for (int l : {4096, 16384})
      for (int h : {8, 16, 32, 64, 128}) {
        BenchConfig c = uniform(b, l, h, 1);
        c.group = "fp8";
        c.fp8 = true;
        x.push_back(c);
        if (mla::is_sm90a(arch)) {
          c.kernel = mla::MlaKernel::kMmaSync;  // auto takes the wgmma kernel for every fp8 key there
          x.push_back(c);
        }
      }
  for (int b : {8, 64})
    for (int h : {16, 128}) {
      BenchConfig c = uniform(b, 4096, h, 4);
      c.group = "packed";
      c.packed = true;
      for (int& q : c.q_lens) q = 1 + static_cast<int>(rng.next() % 4);
      x.push_back(c);
    }
  for (int page : {16, 128})
    for (int h : {16, 128}) {
      BenchConfig c = uniform(32, 4096, h, 1);
      c.group = "page";
      c.page_size = page;
      x.push_back(c);
    }
  // Small head counts (H * SQ <= 32): the grid's rows with each kernel forced; H * SQ = 64: the two
  // wgmma kernels (sm_90a only). The planner's choice rests on these.
  if (mla::is_sm90a(arch)) {
    for (int b : {1, 8, 32, 64, 128})
      for (int l : {1024, 4096, 16384})
        for (int h : {16, 32, 64})
          for (int sq : {1, 2}) {
            if (h * sq > 64) continue;
            for (const mla::MlaKernel k : {mla::MlaKernel::kMmaSync, mla::MlaKernel::kWgmma, mla::MlaKernel::kWgmmaKv}) {
              if (h * sq > 32 && k == mla::MlaKernel::kMmaSync) continue;
              BenchConfig c = uniform(b, l, h, sq);
              c.group = "kernel";
              c.kernel = k;
              x.push_back(c);
            }
          }
  }
  return x;
}

const char* kernel_name(const MlaVariant& v) { return v.kv_rows > 0 ? "wgmma_kv" : v.wgmma ? "wgmma" : "mma_sync"; }

struct Timing : BenchReplayTimes {
  int calls = 0;
  double rotated_mib = 0;
  int nan_outputs = 0;
};

// One config: distinct Q / O / block tables per captured call, pages at random from the pool.
Timing time_config(const BenchConfig& c, const BenchDeviceMemory& pool, CUstream stream, BenchRng& rng,
                   KernelService& service) {
  const Driver& d = Driver::get();
  const std::string where = c.name();
  const std::int64_t pool_pages = static_cast<std::int64_t>(pool.bytes() / (c.page_size * c.row_bytes()));
  const std::int64_t max_pages = (kMaxSeqLen + c.page_size - 1) / c.page_size;
  const DType dt = c.fp8 ? DType::kE4m3 : DType::kBf16;

  Timing t;
  t.calls = static_cast<int>(std::clamp<double>(std::ceil(static_cast<double>(kRotateBytes) / c.kv_bytes()), kMinCalls, kMaxCalls));
  const int q_sets = static_cast<int>(std::clamp<std::size_t>(kMaxQueryBytes / (c.q_bytes() + c.o_bytes()), 1, t.calls));
  t.rotated_mib = c.kv_bytes() * t.calls / kBenchMiB;

  BenchDeviceMemory q(c.q_bytes() * q_sets, where + " queries"), out(c.o_bytes() * q_sets, where + " outputs");
  if (c.fp8) {
    bench_fill_e4m3(q.ptr(), q.bytes(), static_cast<std::size_t>(c.batch) * c.heads + c.len, where + " queries");
  } else {
    bench_fill_bf16(q.ptr(), q.bytes(), static_cast<std::size_t>(c.batch) * c.heads + c.len, where + " queries");
  }
  const std::size_t table_elems = static_cast<std::size_t>(c.batch) * max_pages;
  std::vector<std::int32_t> tables(table_elems * t.calls, 0);  // entries past the live pages stay 0 (valid, unread)
  for (int call = 0; call < t.calls; ++call) {
    for (int b = 0; b < c.batch; ++b) {
      std::int32_t* row = &tables[call * table_elems + static_cast<std::size_t>(b) * max_pages];
      const std::int64_t live_pages = (c.lens[b] + c.page_size - 1) / c.page_size;
      for (std::int64_t j = 0; j < live_pages; ++j) row[j] = static_cast<std::int32_t>(rng.next() % pool_pages);
    }
  }
  BenchDeviceMemory bt(tables.size() * 4, where + " block tables");
  bench_check(d.cuMemcpyHtoD(bt.ptr(), tables.data(), tables.size() * 4), "cuMemcpyHtoD", where + " block tables");
  BenchDeviceMemory seq_lens(c.lens.size() * 4, where + " seq_lens");
  bench_check(d.cuMemcpyHtoD(seq_lens.ptr(), c.lens.data(), c.lens.size() * 4), "cuMemcpyHtoD", where + " seq_lens");
  std::vector<std::int32_t> indptr(c.batch + 1, 0);
  for (int b = 0; b < c.batch; ++b) indptr[b + 1] = indptr[b] + c.q_lens[b];
  BenchDeviceMemory qo_indptr(indptr.size() * 4, where + " qo_indptr");
  bench_check(d.cuMemcpyHtoD(qo_indptr.ptr(), indptr.data(), indptr.size() * 4), "cuMemcpyHtoD", where + " qo_indptr");
  const std::size_t ws_bytes = mla::mla_workspace_size(c.policy(), c.batch);
  BenchDeviceMemory ws(std::max<std::size_t>(ws_bytes, 256), where + " workspace");
  bench_check(d.cuMemsetD8(out.ptr(), 0xff, out.bytes()), "cuMemsetD8", where + " poison outputs");  // bf16 NaN
  bench_check(d.cuCtxSynchronize(), "cuCtxSynchronize", where + " uploads");  // pageable copies land before the stream runs

  const TensorView cache = TensorView::contiguous(pool.at(0), dt, {pool_pages, c.page_size, 576});
  const TensorView seq_view = TensorView::contiguous(seq_lens.at(0), DType::kI32, {c.batch});
  const TensorView ws_view = TensorView::contiguous(ws.at(0), DType::kU8, {static_cast<std::int64_t>(ws.bytes())});
  const std::int64_t total_q = c.total_q();
  const auto capture = [&] {
    for (int call = 0; call < t.calls; ++call) {
      const std::size_t set = static_cast<std::size_t>(call % q_sets);
      const TensorView qv = c.packed ? TensorView::contiguous(q.at(set * c.q_bytes()), dt, {total_q, c.heads, 576})
                                     : TensorView::contiguous(q.at(set * c.q_bytes()), dt, {c.batch, c.sq, c.heads, 576});
      const TensorView ov = c.packed
                                ? TensorView::contiguous(out.at(set * c.o_bytes()), DType::kBf16, {total_q, c.heads, 512})
                                : TensorView::contiguous(out.at(set * c.o_bytes()), DType::kBf16, {c.batch, c.sq, c.heads, 512});
      std::optional<TensorView> indptr_view;
      if (c.packed) indptr_view = TensorView::contiguous(qo_indptr.at(0), DType::kI32, {c.batch + 1});
      mla::prims_ts_batch_decode_with_kv_cache_mla(
          qv, cache, ws_view, 512, 64, TensorView::contiguous(bt.at(call * table_elems * 4), DType::kI32, {c.batch, max_pages}),
          seq_view, kMaxSeqLen, indptr_view, c.sq, ov, kBmm1Scale, 1.0, mla::MaskType::kCausal, DType::kBf16, stream, service,
          c.kernel, c.precision);
    }
  };
  // After the warm-up replay, a sanity check that the kernels wrote finite outputs (first and last set).
  const auto check_warm_up = [&] {
    const std::size_t probe = std::min<std::size_t>(c.o_bytes(), 4 * kBenchMiB) / 2;
    std::vector<std::uint16_t> words(probe);
    for (const int set : {0, q_sets - 1}) {
      bench_check(d.cuMemcpyDtoH(words.data(), out.ptr() + set * c.o_bytes(), probe * 2), "cuMemcpyDtoH", where + " output probe");
      for (std::uint16_t w : words) t.nan_outputs += (w & 0x7f80) == 0x7f80 && (w & 0x7f) != 0;
    }
  };
  static_cast<BenchReplayTimes&>(t) = bench_graph_replays(stream, where, t.calls, kLongReplayMs, capture, check_warm_up);
  return t;
}

}  // namespace

int run_bench_mla(const BenchOptions& options) {
  const auto t_start = BenchClock::now();
  const Driver& d = Driver::get();
  d.require("kiln bench mla");
  Config config = Config::from_environment();
  if (!options.cache_dir.empty()) config.cache_dir = options.cache_dir;
  KernelService service(config);
  const bool quick = options.quick;

  json report = bench_header("mla");
  ScopedDeviceContext context(0);
  const std::string arch = service.device_arch(0);
  const int sms = service.device_sm_count(0);
  const BenchStream bench_stream;
  const CUstream stream = bench_stream.get();

  std::vector<BenchConfig> grid = bench_grid(quick);
  std::vector<BenchConfig> extra = extra_configs(quick, arch);
  if (!options.only.empty()) {
    const auto other = [&](const BenchConfig& c) { return c.group != options.only && c.name() != options.only; };
    std::erase_if(grid, other);
    std::erase_if(extra, other);
    if (grid.empty() && extra.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--only \"{}\" names no group or config of the sweep; use grid, mixed, fp8, packed, page, "
                              "kernel or a name as the sweep prints it, e.g. \"B=64 L=4096 H=128 SQ=1\"",
                              options.only));
    }
  }
  // Warm every key first (in parallel): compiles stay out of the timings, and capture never compiles.
  {
    const auto t0 = BenchClock::now();
    std::vector<SemanticKey> keys;
    for (const auto* list : {&grid, &extra})
      for (const BenchConfig& c : *list) keys.push_back(c.policy().key(arch));
    service.warm(keys, {0});
    for (const auto* list : {&grid, &extra})
      for (const BenchConfig& c : *list) mla::warm_mla(c.policy(), {0}, service);  // primes the launch fast path
    std::fprintf(stderr, "warm: %.0f ms (%llu compiles)\n", bench_ms_since(t0),
                 static_cast<unsigned long long>(service.counters().compiles));
  }

  // Ceilings, first reading.
  BenchCeilings ceilings(arch, sms, stream);

  // The KV page pool every config draws from (bf16; fp8 configs use a second pool of valid e4m3).
  BenchDeviceMemory pool(kPoolBytes, "KV page pool");
  bench_fill_bf16(pool.ptr(), pool.bytes(), 1, "KV page pool");
  std::optional<BenchDeviceMemory> pool_fp8;
  if (std::any_of(extra.begin(), extra.end(), [](const BenchConfig& c) { return c.fp8; })) {
    pool_fp8.emplace(kPoolBytes / 2, "fp8 KV page pool");
    bench_fill_e4m3(pool_fp8->ptr(), pool_fp8->bytes(), 1, "fp8 KV page pool");
  }
  bench_check(d.cuCtxSynchronize(), "cuCtxSynchronize", "KV page pool upload");

  BenchRng rng(0x6d6c6121);
  std::vector<std::pair<BenchConfig, Timing>> rows;
  for (const auto* list : {&grid, &extra}) {
    for (const BenchConfig& c : *list) {
      const auto t0 = BenchClock::now();
      Timing t = time_config(c, c.fp8 ? *pool_fp8 : pool, stream, rng, service);
      if (t.nan_outputs > 0) {
        throw Error(ErrorCode::kInternal, fmt::format("mla bench {}: {} NaN values in the probed outputs after a replay: the "
                                                      "kernel is broken for this config, its timing would mean nothing",
                                                      c.name(), t.nan_outputs));
      }
      std::fprintf(stderr, "%-44s %5d calls %9.2f us  %5.2f TB/s  %6.1f TFLOP/s  (%.0f ms)\n", c.name().c_str(), t.calls, t.us,
                   c.bytes() / (t.us * 1e-6) * 1e-12, c.flop() / (t.us * 1e-6) * 1e-12, bench_ms_since(t0));
      rows.emplace_back(c, t);
    }
  }

  // Ceilings, second reading: the GPU may have warmed up (clocks, power) over the sweep.
  ceilings.read_end(stream);
  const double copy_ceiling = ceilings.copy_tb_s();
  const double mma_ceiling = ceilings.mma_tflop_s();
  const double wgmma_ceiling = ceilings.wgmma_tflop_s();

  json results = json::array(), extra_results = json::array();
  json bars = {{"memory_bound", json::array()}, {"h128_compute", json::array()}, {"b1_latency", json::array()}};
  for (const auto& [c, t] : rows) {
    const double tb_s = c.bytes() / (t.us * 1e-6) * 1e-12;
    const double tflop_s = c.flop() / (t.us * 1e-6) * 1e-12;
    const mla::MlaPlan plan = mla::plan(c.policy(), c.batch, service.device_limits(0), arch);
    json row = {{"B", c.batch},
                {"L", c.len},
                {"H", c.heads},
                {"SQ", c.sq},
                {"precision", c.precision == mla::MlaPrecision::kBf16 ? "bf16" : "exact"},
                {"us_per_call", t.us},
                {"us_min", t.us_min},
                {"us_max", t.us_max},
                {"tb_s", tb_s},
                {"pct_copy", 100 * tb_s / copy_ceiling},
                {"tflop_s", tflop_s},
                {"pct_mma_sync_peak", 100 * tflop_s / mma_ceiling},
                {"pct_wgmma_peak", wgmma_ceiling > 0 ? 100 * tflop_s / wgmma_ceiling : 0.0},
                {"bytes_per_call", c.bytes()},
                {"flop_per_call", c.flop()},
                {"calls_per_graph", t.calls},
                {"replays_timed", t.replays},
                {"kv_mib_per_replay", t.rotated_mib},
                {"kernel", kernel_name(plan.variant)},
                {"parts", plan.num_parts},
                {"decode_grid", {plan.decode.grid[0], plan.decode.grid[1], plan.decode.grid[2]}},
                {"decode_threads", plan.decode.block[0]},
                {"decode_smem_bytes", plan.decode.smem_bytes}};
    if (c.group != "grid") {
      row["group"] = c.group;
      row["page_size"] = c.page_size;
      row["dtype"] = c.fp8 ? "fp8_e4m3" : "bf16";
      row["packed"] = c.packed;
      row["lens"] = c.lens;
      if (c.packed) row["q_lens"] = c.q_lens;
      if (c.kernel != mla::MlaKernel::kAuto) row["forced"] = true;
      extra_results.push_back(row);
      continue;
    }
    results.push_back(row);
    const long long tokens = c.tokens();
    const json key = {{"B", c.batch}, {"L", c.len}, {"H", c.heads}, {"SQ", c.sq}, {"precision", row["precision"]}};
    if (c.heads * c.sq <= 32 && tokens >= 512 * 1024) {
      // Relative to this run's copy (3.9 TB/s on an H200), so the bar reads the same on any card.
      const double min_tb_s = kMemoryBoundShareOfCopy * copy_ceiling;
      bars["memory_bound"].push_back({{"config", key}, {"tb_s", tb_s}, {"min_tb_s", min_tb_s}, {"pass", tb_s >= min_tb_s}});
    }
    if (c.heads == 128 && tokens >= 256 * 1024) {
      bars["h128_compute"].push_back({{"config", key}, {"tflop_s", tflop_s}, {"pass", tflop_s >= 550}});
    }
    if (c.batch == 1 && c.len <= 4096) {
      bars["b1_latency"].push_back({{"config", key}, {"us", t.us}, {"pass", t.us <= 12}});
    }
  }
  const json bar_summary = bench_bar_summary(bars);

  report["power_state_after"] = bench_power_state();
  report["sm_count"] = sms;
  report["arch"] = arch;
  report["policy"] = {{"page_size", 64},
                      {"dtype", "bf16"},
                      {"out_dtype", "bf16"},
                      {"mask", "causal"},
                      {"packed", false},
                      {"max_seq_len", kMaxSeqLen},
                      {"max_seq_len_why", "DeepSeek-V3's context, the key a server warms and the default manifest prebuilds"},
                      {"extra_results", "page size, dtype, packing and forced kernel as each row says"}};
  report["method"] = {
      {"timing", "per config, N launcher calls captured in one CUDA graph (distinct Q, O and block tables per call; "
                 "pages drawn at random from a 1.5 GiB pool) so one replay streams >= 768 MiB of KV and L2 stays cold; "
                 "one warm-up replay, then 5-7 replays timed with cuEvents; us_per_call = median replay time / N"},
      {"bytes", "sum(L)*576*elem (KV) + total_q*H*576*elem (Q) + total_q*H*512*2 (O)"},
      {"flop", "2*sum(L*q_len)*H*1088"},
      {"bmm1_scale", kBmm1Scale},
      {"precision", "grid rows in both: exact (P as bf16 hi + lo) and bf16 (one bf16 P, FlashMLA's numerics)"},
      {"bars", "memory_bound: H*SQ <= 32 and B*L >= 512k at >= 92% of the run's copy ceiling; h128_compute: H 128, B*L >= 256k at >= 550 "
               "TFLOP/s; b1_latency: B 1, L <= 4096 at <= 12 us"},
      {"quick", quick}};
  report["bars"] = bars;
  report["bar_summary"] = bar_summary;
  report["results"] = results;
  report["extra_results"] = extra_results;
  // The compact table last, on stderr (stdout carries the JSON).
  bench_finish_report(report, ceilings, service.config().cache_dir.string(), t_start, options.out);
  std::fprintf(stderr, "%-44s %10s %7s %6s %8s %6s %6s %-8s %5s\n", "config", "us", "TB/s", "%copy", "TFLOP/s", "%mma",
               "%wgmma", "kernel", "parts");
  for (const auto& [c, t] : rows) {
    const double tb_s = c.bytes() / (t.us * 1e-6) * 1e-12;
    const double tflop_s = c.flop() / (t.us * 1e-6) * 1e-12;
    const mla::MlaPlan plan = mla::plan(c.policy(), c.batch, service.device_limits(0), arch);
    std::fprintf(stderr, "%-44s %10.2f %7.2f %6.1f %8.1f %6.1f %6.1f %-8s %5d\n", c.name().c_str(), t.us, tb_s,
                 100 * tb_s / copy_ceiling, tflop_s, 100 * tflop_s / mma_ceiling,
                 wgmma_ceiling > 0 ? 100 * tflop_s / wgmma_ceiling : 0.0, kernel_name(plan.variant),
                 plan.num_parts);
  }
  bench_print_footer(report, bar_summary);
  return 0;
}

}  // namespace kiln::tools
