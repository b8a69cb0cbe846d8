// kiln bench jit: cold NVRTC compile, disk-hit warm, remote-hit warm and fleet start (with
// KILN_REMOTE_CACHE), in-memory lookup, launch overhead, prebuild -j.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "jit/compiler.h"
#include "jit/error.h"
#include "kernel_templates/nvfp4_writer/params.cuh"
#include "runtime/driver.h"
#include "runtime/kernel_service.h"
#include "runtime/nvfp4_writer/writer.h"
#include "tools/bench.h"
#include "tools/bench_remote.h"
#include "tools/bench_report.h"

namespace kiln::tools {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::filesystem::path fresh_dir(const std::string& base, const std::string& name) {
  const auto dir = std::filesystem::path(base) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

Config bench_config(const std::filesystem::path& dir) {
  Config c = Config::from_environment();
  c.cache_dir = dir;
  c.read_only_layers.clear();
  c.record_misses.reset();
  c.sealed = false;
  c.remote.reset();  // measured on its own, below
  return c;
}

std::vector<SemanticKey> writer_keys(const std::string& arch) {
  std::vector<SemanticKey> keys;
  for (const auto op : {nvfp4::WriterOp::kPack, nvfp4::WriterOp::kAppend}) {
    for (const int page : {2, 32, 64, 128}) keys.push_back(nvfp4::WriterPolicy{op, page}.key(arch));
  }
  return keys;
}

// Wall time of compiling `keys` into an empty cache with `jobs` threads.
double prebuild_wall_ms(const std::vector<SemanticKey>& keys, const std::filesystem::path& dir, int jobs) {
  KernelService service(bench_config(dir));
  std::atomic<std::size_t> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < jobs; ++t) {
    pool.emplace_back([&] {
      for (std::size_t i = next++; i < keys.size(); i = next++) service.build(keys[i]);
    });
  }
  for (auto& t : pool) t.join();
  return ms_since(start);
}

}  // namespace

int run_bench(const BenchOptions& options) {
  if (options.what != "jit") {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("unknown benchmark '{}'; available: jit, mla, sparse", options.what));
  }
  const std::string base = options.cache_dir.empty() ? (std::filesystem::temp_directory_path() / "kiln-bench").string() : options.cache_dir;
  const Driver& d = Driver::get();
  const bool gpu = d.available();
  std::string arch = "sm_90a";
  json report = bench_header("jit");
  json results = json::object();

  // Cold compiles: a fresh cache, one key at a time, so each number is one NVRTC run.
  const auto cold_dir = fresh_dir(base, "cold");
  {
    KernelService service(bench_config(cold_dir));
    if (gpu) arch = service.device_arch(0);
    json cold = json::array();
    std::vector<double> ms;
    for (const SemanticKey& key : writer_keys(arch)) {
      const auto t0 = Clock::now();
      service.build(key);
      ms.push_back(ms_since(t0));
      cold.push_back({{"key", key.str()}, {"ms", ms.back()}});
      std::fprintf(stderr, "cold compile %-60s %8.1f ms\n", key.str().c_str(), ms.back());
    }
    results["cold_compile"] = {{"per_key", cold}, {"median_ms", median(ms)}, {"target_ms", 1000}};
  }

  // Disk hits: a new service (empty memory) over the cache just filled. With a GPU this is the whole
  // warm-up (read + checksum + module load + attributes); without one, read + checksum only.
  {
    KernelService service(bench_config(cold_dir));
    json per_key = json::array();
    std::vector<double> ms;
    for (const SemanticKey& key : writer_keys(arch)) {
      const auto t0 = Clock::now();
      if (gpu) service.warm(key, 0);
      else service.build(key);
      ms.push_back(ms_since(t0));
      per_key.push_back({{"key", key.str()}, {"ms", ms.back()}});
    }
    results["disk_hit_warm"] = {{"per_key", per_key}, {"median_ms", median(ms)}, {"target_ms", 1.0},
                                {"includes", gpu ? "read, checksum, cuModuleLoadData, attributes" : "read, checksum (no GPU)"},
                                {"compiles", service.counters().compiles}};
    std::fprintf(stderr, "disk-hit warm: median %.3f ms per key (%s)\n", median(ms), gpu ? "with module load" : "no GPU: read+verify");
  }

  // The remote tier (loopback or wherever KILN_REMOTE_CACHE points): remote-hit warm and a fleet start.
  if (const auto remote = Config::from_environment().remote) {
    results["remote"] = bench_remote(*remote, base, cold_dir, writer_keys(arch), gpu, options.fleet, options.manifest);
  } else {
    results["remote"] = "skipped: set KILN_REMOTE_CACHE=redis://host:port to measure the remote tier";
    std::fprintf(stderr, "remote tier: skipped (KILN_REMOTE_CACHE is not set)\n");
  }

  if (gpu) {
    ScopedDeviceContext ctx(0);
    KernelService& service = KernelService::global();
    const nvfp4::WriterPolicy policy{nvfp4::WriterOp::kAppend, 64};
    nvfp4::warm(policy, {0});
    // In-memory lookup: what every launch pays to find its warm handle.
    const SemanticKey key = policy.key(arch);
    constexpr int kLookups = 2'000'000;
    std::uint64_t fp = 0x1234;
    service.acquire(fp, [&] { return key; }, nullptr);
    const auto t0 = Clock::now();
    const KernelHandle* sink = nullptr;
    for (int i = 0; i < kLookups; ++i) sink = service.find(fp, 0);
    const double lookup_ns = ms_since(t0) * 1e6 / kLookups;
    if (sink == nullptr) throw Error(ErrorCode::kInternal, "lookup benchmark lost its handle");
    results["lookup_ns"] = {{"value", lookup_ns}, {"target_ns", 100}};
    std::fprintf(stderr, "in-memory lookup: %.1f ns\n", lookup_ns);

    // Launch overhead: the full launcher (validation + lookup + cuLaunchKernel) against a bare
    // cuLaunchKernel of the same function and Params, host time per enqueue, median of 7 batches.
    CUdeviceptr cache = 0, rows = 0, slots = 0;
    d.check(d.cuMemAlloc(&cache, 64 * 384), "cuMemAlloc");
    d.check(d.cuMemAlloc(&rows, 512 * 2), "cuMemAlloc");
    d.check(d.cuMemAlloc(&slots, 4), "cuMemAlloc");
    d.check(d.cuMemsetD8(rows, 0, 1024), "cuMemsetD8");
    d.check(d.cuMemsetD8(slots, 0xff, 4), "cuMemsetD8");  // slot -1: the kernel returns at once
    CUstream stream = nullptr;
    d.check(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    const TensorView v_rows = TensorView::contiguous(reinterpret_cast<void*>(rows), DType::kBf16, {1, 512});
    const TensorView v_slots = TensorView::contiguous(reinterpret_cast<void*>(slots), DType::kI32, {1});
    const TensorView v_cache = TensorView::contiguous(reinterpret_cast<void*>(cache), DType::kU8, {1, 64, 384});
    Nvfp4WriterParams params{reinterpret_cast<void*>(rows), 512, reinterpret_cast<void*>(cache), 64 * 384,
                             reinterpret_cast<const int*>(slots), 64, 1};
    void* args[] = {&params};
    const CUfunction fn = service.warm(key, 0).entry(0).function;
    constexpr int kLaunches = 20000;
    std::vector<double> bare, full;
    for (int batch = 0; batch < 7; ++batch) {
      auto t = Clock::now();
      for (int i = 0; i < kLaunches; ++i) d.cuLaunchKernel(fn, 1, 1, 1, kNvfp4WriterThreads, 1, 1, 0, stream, args, nullptr);
      d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      bare.push_back(ms_since(t) * 1e3 / kLaunches);
      t = Clock::now();
      for (int i = 0; i < kLaunches; ++i) nvfp4::append(v_rows, v_slots, v_cache, stream);
      d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      full.push_back(ms_since(t) * 1e3 / kLaunches);
    }
    results["launch_us"] = {{"bare_cuLaunchKernel", median(bare)}, {"kiln_launcher", median(full)},
                            {"overhead", median(full) - median(bare)}, {"target_overhead_us", 1.0},
                            {"method", "host time per enqueue incl. stream sync amortised over 20000 launches, median of 7"}};
    std::fprintf(stderr, "launch: bare %.2f us, kiln %.2f us, overhead %.2f us\n", median(bare), median(full), median(full) - median(bare));
    d.cuStreamDestroy(stream);
    d.cuMemFree(cache);
    d.cuMemFree(rows);
    d.cuMemFree(slots);
  }

  // Prebuild throughput with 1 and 2 jobs over the writer keys of both archs.
  std::vector<SemanticKey> all = writer_keys("sm_90a");
  for (const auto& k : writer_keys("sm_120a")) all.push_back(k);
  json prebuild = json::object();
  // NVRTC loads per-arch state on its first compile; keep that out of the -j comparison.
  prebuild_wall_ms({writer_keys("sm_120a").front()}, fresh_dir(base, "prebuild-warmup"), 1);
  for (const int jobs : {1, 2}) {
    const double wall = prebuild_wall_ms(all, fresh_dir(base, fmt::format("prebuild-j{}", jobs)), jobs);
    prebuild[fmt::format("j{}", jobs)] = {{"keys", all.size()}, {"wall_ms", wall}};
    std::fprintf(stderr, "prebuild -j %d: %zu keys in %.0f ms\n", jobs, all.size(), wall);
  }
  results["prebuild"] = prebuild;
  report["results"] = results;
  write_report(report, options.out);
  return 0;
}

}  // namespace kiln::tools
