// kiln bench writer: NVFP4 cache pack and append, L2-cold, against the copy ceiling measured in the
// same run.
//
// Method: for each config, `calls` launcher calls are captured in ONE CUDA graph, each with its own
// source rows and its own cache region (append: its own slots), so a replay streams >= 1 GiB
// (at most 1024 calls) that the 50 MB L2 cannot hold from the call before. One warm-up replay
// (cache poisoned before it, every written scale record's padding checked zero after), then 7
// replays timed with driver events (>= 5 when replays are long); per-call time = median replay /
// calls. Pack covers whole pages: its N is rounded up to a multiple of the page size. Append slots
// are a random permutation of the call's region; "dup" maps every slot from two rows (N / 2
// distinct slots, the lowest row writes), so half the rows only read. Bytes moved per call are
// N x (1024 + 384) in both cases, the metric, against a 1 GiB cuMemcpyDtoDAsync (read +
// write) at the start and the end of the run (the larger is used).
#include "tools/bench/writer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/runtime/config.h"
#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "tools/bench/ceilings.h"
#include "tools/bench/report.h"

namespace kiln::tools {

namespace {

using nlohmann::json;

constexpr std::size_t kRowBytes = 1024, kTokenBytes = 384;
constexpr std::size_t kRotateBytes = 1024 * kBenchMiB;
constexpr int kMinCalls = 4, kMaxCalls = 1024;
constexpr double kLongReplayMs = 100;
constexpr std::uint8_t kPoison = 0xab;

struct WriterConfig {
  bool append;
  bool dup;  // append: every slot from two rows
  int page;
  std::int64_t rows;
  std::string op() const { return append ? (dup ? "append+dup" : "append") : "pack"; }
  std::string name() const { return fmt::format("{} N={} page={}", op(), rows, page); }
  double bytes() const { return static_cast<double>(rows) * (kRowBytes + kTokenBytes); }
};

std::vector<WriterConfig> bench_grid(bool quick) {
  std::vector<WriterConfig> grid;
  const std::vector<std::int64_t> ns = quick ? std::vector<std::int64_t>{1, 16384} : std::vector<std::int64_t>{1, 64, 1024, 16384, 65536};
  for (const int page : quick ? std::vector<int>{64} : std::vector<int>{64, 256}) {
    std::int64_t packed = 0;
    for (const std::int64_t n : ns) {
      const std::int64_t pack_rows = (n + page - 1) / page * page;  // whole pages
      if (pack_rows != packed) grid.push_back({false, false, page, packed = pack_rows});
      grid.push_back({true, false, page, n});
      if (n > 1) grid.push_back({true, true, page, n});
    }
  }
  return grid;
}

struct Timing : BenchReplayTimes {
  int calls = 0;
  double mib_per_replay = 0;
  std::size_t bad_records = 0;  // written records whose padding is not zero after the warm-up
};

Timing time_config(const WriterConfig& c, KernelService& service, CUstream stream, BenchRng& rng) {
  const Driver& d = Driver::get();
  const std::string where = c.name();
  Timing t;
  t.calls = static_cast<int>(std::clamp<double>(std::ceil(static_cast<double>(kRotateBytes) / c.bytes()), kMinCalls, kMaxCalls));
  t.mib_per_replay = c.bytes() * t.calls / kBenchMiB;
  const std::int64_t pages_per_call = (c.rows + c.page - 1) / c.page;
  const std::size_t region = static_cast<std::size_t>(pages_per_call * c.page) * kTokenBytes;
  BenchDeviceMemory src(static_cast<std::size_t>(c.rows) * kRowBytes * t.calls, where + " rows");
  BenchDeviceMemory cache(region * t.calls, where + " cache");
  // One call's rows from the host, replicated on the device (doubling copies).
  const std::size_t call_bytes = static_cast<std::size_t>(c.rows) * kRowBytes;
  bench_fill_bf16(src.ptr(), call_bytes, static_cast<std::size_t>(c.rows) + c.page, where + " rows");
  for (std::size_t filled = call_bytes; filled < src.bytes();) {
    const std::size_t n = std::min(filled, src.bytes() - filled);
    bench_check(d.cuMemcpyDtoDAsync(src.ptr() + filled, src.ptr(), n, stream), "cuMemcpyDtoDAsync", where + " rows");
    filled += n;
  }
  bench_check(d.cuMemsetD8(cache.ptr(), kPoison, cache.bytes()), "cuMemsetD8", where + " poison cache");

  // Append: call k's slots are a random permutation within its own region (dup: N / 2 slots, each
  // from two rows in random positions).
  std::vector<std::int32_t> slots;
  std::unique_ptr<BenchDeviceMemory> map;
  if (c.append) {
    slots.resize(static_cast<std::size_t>(c.rows) * t.calls);
    const std::int64_t region_slots = pages_per_call * c.page;
    for (int k = 0; k < t.calls; ++k) {
      std::int32_t* s = &slots[static_cast<std::size_t>(k) * c.rows];
      std::vector<std::int32_t> perm(static_cast<std::size_t>(region_slots));
      std::iota(perm.begin(), perm.end(), 0);
      for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.next() % i]);
      for (std::int64_t i = 0; i < c.rows; ++i) s[i] = perm[static_cast<std::size_t>(c.dup ? i / 2 : i)];
      if (c.dup) {
        for (std::int64_t i = c.rows; i > 1; --i) std::swap(s[i - 1], s[rng.next() % static_cast<std::uint64_t>(i)]);
      }
    }
    map = std::make_unique<BenchDeviceMemory>(slots.size() * 4, where + " slot_mapping");
    bench_check(d.cuMemcpyHtoD(map->ptr(), slots.data(), slots.size() * 4), "cuMemcpyHtoD", where + " slot_mapping");
  }
  bench_check(d.cuStreamSynchronize(stream), "cuStreamSynchronize", where + " fill");
  nvfp4::warm({c.append ? nvfp4::WriterOp::kAppend : nvfp4::WriterOp::kPack, c.page}, {0}, service);

  const auto capture = [&] {
    for (int k = 0; k < t.calls; ++k) {
      const TensorView cache_view =
          TensorView::contiguous(cache.at(region * k), DType::kU8, {pages_per_call, c.page, static_cast<std::int64_t>(kTokenBytes)});
      void* rows = src.at(static_cast<std::size_t>(c.rows) * kRowBytes * k);
      if (c.append) {
        nvfp4::append(TensorView::contiguous(rows, DType::kBf16, {c.rows, 512}),
                      TensorView::contiguous(map->at(static_cast<std::size_t>(c.rows) * 4 * k), DType::kI32, {c.rows}), cache_view, stream,
                      service);
      } else {
        nvfp4::pack(TensorView::contiguous(rows, DType::kBf16, {pages_per_call, c.page, 512}), cache_view, stream, service);
      }
    }
  };
  const auto check_warm_up = [&] {  // call 0: every target slot's padding is zero (poisoned before)
    std::vector<std::uint8_t> host(region);
    bench_check(d.cuMemcpyDtoH(host.data(), cache.ptr(), region), "cuMemcpyDtoH", where + " check");
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const std::int64_t slot = c.append ? slots[static_cast<std::size_t>(i)] : i;
      const std::uint8_t* pad = &host[static_cast<std::size_t>((slot / c.page) * c.page * kTokenBytes + c.page * 352 + (slot % c.page) * 32 + 28)];
      t.bad_records += (pad[0] | pad[1] | pad[2] | pad[3]) != 0;
    }
  };
  static_cast<BenchReplayTimes&>(t) = bench_graph_replays(stream, where, t.calls, kLongReplayMs, capture, check_warm_up);
  return t;
}

}  // namespace

int run_bench_writer(const BenchOptions& options) {
  const auto t_start = BenchClock::now();
  const Driver& d = Driver::get();
  d.require("kiln bench writer");
  Config config = Config::from_environment();
  if (!options.cache_dir.empty()) config.cache_dir = options.cache_dir;
  KernelService service(config);

  json report = bench_header("writer");
  ScopedDeviceContext context(0);
  const std::string arch = service.device_arch(0);
  const int sms = service.device_sm_count(0);
  const BenchStream bench_stream;
  const CUstream stream = bench_stream.get();
  BenchCeilings ceilings(arch, sms, stream);

  BenchRng rng(0x77726974);
  std::vector<std::pair<WriterConfig, Timing>> rows;
  for (const WriterConfig& c : bench_grid(options.quick)) {
    const auto t0 = BenchClock::now();
    const Timing t = time_config(c, service, stream, rng);
    if (t.bad_records > 0) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("writer bench {}: {} written records with non-zero padding after a replay: the writer is broken here, "
                              "its timing would mean nothing",
                              c.name(), t.bad_records));
    }
    std::fprintf(stderr, "%-28s %5d calls %9.2f us  %7.1f GB/s  (%.0f ms)\n", c.name().c_str(), t.calls, t.us, c.bytes() / (t.us * 1e-6) * 1e-9,
                 bench_ms_since(t0));
    rows.emplace_back(c, t);
  }
  ceilings.read_end(stream);
  const double copy_ceiling = ceilings.copy_tb_s();

  json results = json::array();
  json bars = {{"n16k_plus_pct_copy", json::array()}, {"n1_append_us", json::array()}};
  for (const auto& [c, t] : rows) {
    const double gb_s = c.bytes() / (t.us * 1e-6) * 1e-9;
    const double pct = 100 * gb_s * 1e-3 / copy_ceiling;
    results.push_back({{"op", c.op()}, {"rows", c.rows}, {"page_size", c.page}, {"us_per_call", t.us}, {"us_min", t.us_min},
                       {"us_max", t.us_max}, {"gb_s", gb_s}, {"pct_copy", pct}, {"bytes_per_call", c.bytes()},
                       {"calls_per_graph", t.calls}, {"replays_timed", t.replays}, {"mib_per_replay", t.mib_per_replay}});
    const json key = {{"op", c.op()}, {"rows", c.rows}, {"page_size", c.page}};
    if (c.rows >= 16384) bars["n16k_plus_pct_copy"].push_back({{"config", key}, {"pct_copy", pct}, {"pass", pct >= 70}});
    if (c.append && c.rows == 1) bars["n1_append_us"].push_back({{"config", key}, {"us", t.us}, {"pass", t.us <= 4}});
  }
  const json bar_summary = bench_bar_summary(bars);

  report["power_state_after"] = bench_power_state();
  report["sm_count"] = sms;
  report["arch"] = arch;
  report["method"] = {
      {"timing", fmt::format("per config, N launcher calls captured in one CUDA graph, each with its own rows and cache region "
                             "(append: its own slots), N = clamp(ceil(1 GiB / bytes per call), {}, {}); one warm-up replay (cache "
                             "poisoned before, padding of every written record checked zero after), then 5-7 replays timed with "
                             "cuEvents; us_per_call = median replay time / N",
                             kMinCalls, kMaxCalls)},
      {"bytes", "rows * (1024 read + 384 written), also for append+dup, where half the rows write nothing"},
      {"pack_rows", "whole pages: N rounded up to the page size"},
      {"slots", "append: a random permutation of the call's own pages; append+dup: N / 2 slots, each from two rows"},
      {"source", "random bf16 in (-1, 1)"},
      {"quick", options.quick}};
  report["bars"] = bars;
  report["bar_summary"] = bar_summary;
  report["results"] = results;
  bench_finish_report(report, ceilings, "", t_start, options.out);
  std::fprintf(stderr, "%-11s %6s %5s %10s %8s %6s\n", "op", "N", "page", "us/call", "GB/s", "%copy");
  for (const json& r : results) {
    std::fprintf(stderr, "%-11s %6lld %5d %10.2f %8.1f %6.1f\n", r["op"].get<std::string>().c_str(), r["rows"].get<long long>(),
                 r["page_size"].get<int>(), r["us_per_call"].get<double>(), r["gb_s"].get<double>(), r["pct_copy"].get<double>());
  }
  bench_print_footer(report, bar_summary);
  return 0;
}

}  // namespace kiln::tools
