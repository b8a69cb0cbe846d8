// kiln bench jit: cold NVRTC compile (writer, MLA and sparse keys; every default-manifest key of the
// arch with its phases: front end, NVVM, ptxas, and module load with a GPU; medians per family),
// disk-hit warm (first and median), remote-hit warm and a fleet start (with KILN_REMOTE_CACHE),
// in-memory lookup, host time per launch of each launcher beside a bare cuLaunchKernelEx, prebuild -j
// (writer keys; the whole default manifest on every hardware thread).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/kernel_templates/mla_decode/params.cuh"
#include "kiln/kernel_templates/nvfp4_writer/params.cuh"
#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/mla_decode/launcher.h"
#include "kiln/runtime/mla_decode/planner.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "tools/bench/options.h"
#include "tools/bench/ceilings.h"
#include "tools/bench/remote.h"
#include "tools/bench/report.h"
#include "tools/cache_ops.h"

namespace kiln::tools {

namespace {

using nlohmann::json;
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

// The production MLA key (DeepSeek: 128 heads, page 64) and a sparse key with the extra pool.
mla::MlaDecodePolicy mla_bench_policy() { return mla::MlaDecodePolicy{128, 64, 163840, 1, false, DType::kBf16, DType::kBf16, mla::MaskType::kCausal}; }
sparse::SparsePolicy sparse_bench_policy() { return sparse::SparsePolicy{64, 1, true, false}; }

// The phases NVRTC reported for a compiled artifact (KernelService records them in the metadata).
struct Phases {
  double front_end = 0, nvvm = 0, ptxas = 0;
};

Phases phases_of(const Artifact& a) {
  const json& m = a.entry->metadata;
  if (!m.contains("compile_phases_ms")) return {};
  const json& p = m["compile_phases_ms"];
  return {p.value("front_end", 0.0), p.value("nvvm", 0.0), p.value("ptxas", 0.0)};
}

json phases_json(const Phases& p) { return {{"front_end_ms", p.front_end}, {"nvvm_ms", p.nvvm}, {"ptxas_ms", p.ptxas}}; }

// Cold compiles of one key, each into a fresh cache (so each is one NVRTC run plus publish).
json cold_compile(const SemanticKey& key, const std::string& base, int runs) {
  std::vector<double> ms, fe, nvvm, ptxas;
  for (int i = 0; i < runs; ++i) {
    KernelService service(bench_config(fresh_dir(base, fmt::format("cold-{}-{}", key.family(), i))));
    const auto t0 = BenchClock::now();
    const Artifact a = service.build(key);
    ms.push_back(bench_ms_since(t0));
    const Phases p = phases_of(a);
    fe.push_back(p.front_end);
    nvvm.push_back(p.nvvm);
    ptxas.push_back(p.ptxas);
  }
  std::fprintf(stderr, "cold compile %-60s median %8.1f ms of %d (front end %.0f, NVVM %.0f, ptxas %.0f ms)\n", key.str().c_str(),
               bench_median(ms), runs, bench_median(fe), bench_median(nvvm), bench_median(ptxas));
  return {{"key", key.str()},
          {"runs_ms", ms},
          {"median_ms", bench_median(ms)},
          {"median_phases", {{"front_end_ms", bench_median(fe)}, {"nvvm_ms", bench_median(nvvm)}, {"ptxas_ms", bench_median(ptxas)}}}};
}

// The medians a family's compile times are held to on the H200 (ms per key).
double family_target_ms(const std::string& family) { return family == "nvfp4_writer" ? 250 : 500; }

// Every key of the default manifest for `arch`, compiled one at a time into one fresh cache, with
// NVRTC's phases and (with a GPU) the module load; medians per family over the keys compiled (a key
// that renders another key's kernel is a disk hit and counts as shared).
json cold_compile_manifest(const std::string& arch, const std::string& base, bool gpu) {
  const std::vector<SemanticKey> keys = manifest_keys("", arch);
  std::optional<ScopedDeviceContext> context;
  if (gpu) context.emplace(0);
  KernelService service(bench_config(fresh_dir(base, "cold-manifest")));
  struct Family {
    std::vector<double> ms, fe, nvvm, ptxas, load;
    std::size_t shared = 0;
  };
  std::map<std::string, Family> families;
  json per_key = json::array();
  for (const SemanticKey& key : keys) {
    const auto t0 = BenchClock::now();
    const Artifact a = service.build(key);
    const double ms = bench_ms_since(t0);
    Family& f = families[key.family()];
    json item = {{"key", key.str()}, {"ms", ms}};
    if (a.source != ArtifactSource::kCompiled) {
      ++f.shared;
      item["source"] = std::string(artifact_source_name(a.source));
    } else {
      const Phases p = phases_of(a);
      f.ms.push_back(ms);
      f.fe.push_back(p.front_end);
      f.nvvm.push_back(p.nvvm);
      f.ptxas.push_back(p.ptxas);
      item.update(phases_json(p));
    }
    if (gpu) {
      const auto t1 = BenchClock::now();
      service.warm(key, 0);
      f.load.push_back(bench_ms_since(t1));
      item["load_ms"] = f.load.back();
    }
    std::fprintf(stderr, "cold compile %-100s %8.1f ms%s\n", key.str().c_str(), ms,
                 a.source == ArtifactSource::kCompiled ? "" : " (shares another key's cubin)");
    per_key.push_back(std::move(item));
  }
  json summary = json::object();
  for (const auto& [name, f] : families) {
    const auto sum = [](const std::vector<double>& v) { double s = 0; for (double x : v) s += x; return s; };
    json fam = {{"keys_compiled", f.ms.size()},
                {"keys_sharing_a_cubin", f.shared},
                {"median_ms", f.ms.empty() ? 0.0 : bench_median(f.ms)},
                {"max_ms", f.ms.empty() ? 0.0 : *std::max_element(f.ms.begin(), f.ms.end())},
                {"total_ms", sum(f.ms)},
                {"target_median_ms", family_target_ms(name)}};
    if (!f.ms.empty()) {
      fam["median_phases"] = {{"front_end_ms", bench_median(f.fe)}, {"nvvm_ms", bench_median(f.nvvm)}, {"ptxas_ms", bench_median(f.ptxas)}};
      fam["total_phases"] = {{"front_end_ms", sum(f.fe)}, {"nvvm_ms", sum(f.nvvm)}, {"ptxas_ms", sum(f.ptxas)}};
    }
    if (!f.load.empty()) fam["median_load_ms"] = bench_median(f.load);
    std::fprintf(stderr, "cold compile %s on %s: %zu keys, median %.0f ms (front end %.0f, NVVM %.0f, ptxas %.0f ms)%s\n",
                 name.c_str(), arch.c_str(), f.ms.size(), fam["median_ms"].get<double>(),
                 f.ms.empty() ? 0.0 : bench_median(f.fe), f.ms.empty() ? 0.0 : bench_median(f.nvvm),
                 f.ms.empty() ? 0.0 : bench_median(f.ptxas),
                 f.load.empty() ? "" : fmt::format(", load {:.2f} ms", bench_median(f.load)).c_str());
    summary[name] = std::move(fam);
  }
  return {{"arch", arch},
          {"per_family", summary},
          {"per_key", per_key},
          {"method", "the default manifest's keys for the arch, one at a time into one fresh cache; phases as NVRTC reports "
                     "them (--time, whole ms): front end, NVVM optimizer + code generation, ptxas; load = cuModuleLoadData "
                     "and attributes after the compile"}};
}

CUdeviceptr device_zeros(std::size_t bytes) {
  const Driver& d = Driver::get();
  CUdeviceptr p = 0;
  d.check(d.cuMemAlloc(&p, bytes), "cuMemAlloc");
  d.check(d.cuMemsetD8(p, 0, bytes), "cuMemsetD8");
  return p;
}

void* ptr(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

// Host time per call of `bare` and of `full`, in us: each timed over kBatch back-to-back calls with
// the stream drained before and after (outside the timing), so the loop measures the enqueue and
// never waits on a full queue; batches alternate between the two, median of kBatches each.
template <class Bare, class Full>
json launch_overhead(CUstream stream, Bare&& bare, Full&& full, const char* name) {
  constexpr int kBatch = 200;
  constexpr int kBatches = 51;
  const Driver& d = Driver::get();
  std::vector<double> b, f;
  const auto timed = [&](auto&& call) {
    d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    const auto t = BenchClock::now();
    for (int i = 0; i < kBatch; ++i) call();
    const double us = bench_ms_since(t) * 1e3 / kBatch;
    d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    return us;
  };
  for (int i = 0; i < kBatches; ++i) {
    b.push_back(timed(bare));
    f.push_back(timed(full));
  }
  std::fprintf(stderr, "launch %-8s bare cuLaunchKernelEx %.2f us, launcher %.2f us, overhead %.2f us\n", name, bench_median(b),
               bench_median(f), bench_median(f) - bench_median(b));
  return {{"bare_cuLaunchKernelEx_us", bench_median(b)}, {"launcher_us", bench_median(f)}, {"overhead_us", bench_median(f) - bench_median(b)},
          {"target_overhead_us", 1.0}};
}

// Host time per launch of the three launchers with a warm key, each beside a bare cuLaunchKernelEx
// of the same function, geometry and Params. The problems are tiny (one block) so that the GPU
// keeps up with the enqueues.
json launch_overheads(const std::string& base) {
  const Driver& d = Driver::get();
  KernelService service(bench_config(fresh_dir(base, "launch")));
  CUstream stream = nullptr;
  d.check(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  json out = json::object();

  {  // writer: one append row to slot -1, so the kernel returns at once
    const CUdeviceptr cache = device_zeros(64 * 384), rows = device_zeros(512 * 2), slots = device_zeros(4);
    d.check(d.cuMemsetD8(slots, 0xff, 4), "cuMemsetD8");
    const nvfp4::WriterPolicy policy{nvfp4::WriterOp::kAppend, 64};
    nvfp4::warm(policy, {0}, service);
    const TensorView v_rows = TensorView::contiguous(ptr(rows), DType::kBf16, {1, 512});
    const TensorView v_slots = TensorView::contiguous(ptr(slots), DType::kI32, {1});
    const TensorView v_cache = TensorView::contiguous(ptr(cache), DType::kU8, {1, 64, 384});
    Nvfp4WriterParams params{ptr(rows), 512, ptr(cache), 64 * 384, reinterpret_cast<const int*>(ptr(slots)), 64, 1};
    LaunchConfig lc;
    lc.block[0] = kNvfp4WriterThreads;
    CUlaunchConfig bc = driver_launch_config(lc, stream);
    void* args[] = {&params};
    const CUfunction fn = acquire(service, policy, stream, 0).entry(kNvfp4AppendScanEntry).function;
    out["writer_append"] = launch_overhead(
        stream, [&] { d.cuLaunchKernelEx(&bc, fn, args, nullptr); },
        [&] { nvfp4::append(v_rows, v_slots, v_cache, stream, service); }, "writer");
    d.cuMemFree(cache);
    d.cuMemFree(rows);
    d.cuMemFree(slots);
  }

  {  // MLA decode: B 1, SQ 1, H 16, 32 tokens (one split: no combine launch)
    const mla::MlaDecodePolicy policy{16, 64, 32, 1, false, DType::kBf16, DType::kBf16, mla::MaskType::kCausal};
    mla::warm_mla(policy, {0}, service);
    const CUdeviceptr q = device_zeros(16 * 576 * 2), kv = device_zeros(64 * 576 * 2), tables = device_zeros(4),
                      lens = device_zeros(4), o = device_zeros(16 * 512 * 2), ws = device_zeros(256);
    const std::int32_t len = 32;
    d.check(d.cuMemcpyHtoD(lens, &len, 4), "cuMemcpyHtoD");
    const TensorView v_q = TensorView::contiguous(ptr(q), DType::kBf16, {1, 1, 16, 576});
    const TensorView v_kv = TensorView::contiguous(ptr(kv), DType::kBf16, {1, 64, 576});
    const TensorView v_tables = TensorView::contiguous(ptr(tables), DType::kI32, {1, 1});
    const TensorView v_lens = TensorView::contiguous(ptr(lens), DType::kI32, {1});
    const TensorView v_out = TensorView::contiguous(ptr(o), DType::kBf16, {1, 1, 16, 512});
    const TensorView v_ws = TensorView::contiguous(ptr(ws), DType::kU8, {256});
    const mla::MlaPlan plan = mla::plan(policy, 1, service.device_limits(0), service.device_arch(0));
    if (plan.needs_combine) throw Error(ErrorCode::kInternal, "bench jit: the MLA launch-overhead problem should not split");
    MlaDecodeParams params{};
    params.q = ptr(q);
    params.kv = ptr(kv);
    params.block_tables = ptr(tables);
    params.seq_lens = ptr(lens);
    params.out = ptr(o);
    params.block_table_stride = 1;
    params.batch = 1;
    params.num_parts = plan.num_parts;
    params.piece_cost = plan.piece_cost;
    params.scale_log2 = 1.0f;
    params.out_scale = 1.0f;
    CUlaunchConfig bc = driver_launch_config(plan.decode, stream);
    void* args[] = {&params};
    const CUfunction fn = acquire(service, policy, stream, 0).entry(kMlaDecodeEntry).function;
    out["mla_decode"] = launch_overhead(
        stream, [&] { d.cuLaunchKernelEx(&bc, fn, args, nullptr); },
        [&] {
          mla::prims_ts_batch_decode_with_kv_cache_mla(v_q, v_kv, v_ws, 512, 64, v_tables, v_lens, 32, std::nullopt, 1, v_out,
                                                       1.0, 1.0, mla::MaskType::kCausal, DType::kBf16, stream, service);
        },
        "mla");
    for (CUdeviceptr p : {q, kv, tables, lens, o, ws}) d.cuMemFree(p);
  }

  {  // sparse decode: T 1, H 16, topk 64 (one chunk: no split), every index slot 0 of a zero page
    const CUdeviceptr q = device_zeros(16 * 512 * 2), kv = device_zeros(64 * 384), idx = device_zeros(64 * 4),
                      o = device_zeros(16 * 512 * 2), lse = device_zeros(16 * 4);
    const TensorView v_q = TensorView::contiguous(ptr(q), DType::kBf16, {1, 16, 512});
    const TensorView v_kv = TensorView::contiguous(ptr(kv), DType::kU8, {1, 64, 384});
    const TensorView v_idx = TensorView::contiguous(ptr(idx), DType::kI32, {1, 64});
    const TensorView v_out = TensorView::contiguous(ptr(o), DType::kBf16, {1, 16, 512});
    const TensorView v_lse = TensorView::contiguous(ptr(lse), DType::kF32, {1, 16});
    const sparse::SparseOptions opt;
    const sparse::SplitPlanResult plan =
        sparse::plan_sparse_decode(v_q, v_kv, v_idx, v_out, v_lse, 0.1, opt, service.device_sm_count(0));
    const sparse::SparsePolicy policy = sparse::sparse_policy(16, false, plan);
    if (policy.split) throw Error(ErrorCode::kInternal, "bench jit: the sparse launch-overhead problem should not split");
    sparse::warm_sparse(policy, {0}, service);
    SparseNvfp4Params params{};
    params.q = ptr(q);
    params.kv = ptr(kv);
    params.kv_page_stride = 64 * 384;
    params.kv_page_size = 64;
    params.topk = 64;
    params.indices = ptr(idx);
    params.indices_row_stride = 64;
    params.output = ptr(o);
    params.out_lse = ptr(lse);
    params.sm_scale_log2 = 0.1f * 1.4426950408889634f;
    params.lse_scale = 1.0f;
    params.num_tokens = 1;
    params.num_splits = plan.num_splits;
    params.chunks_per_block = plan.chunks_per_block;
    LaunchConfig lc;
    lc.grid[0] = static_cast<unsigned>(sparse_decode_grid(1, 16, plan.head_tiles, plan.num_splits));
    lc.block[0] = static_cast<unsigned>(sparse_block_threads(plan.head_tiles));
    lc.smem_bytes = sparse_decode_smem_bytes(plan.head_tiles);
    CUlaunchConfig bc = driver_launch_config(lc, stream);
    void* args[] = {&params};
    const CUfunction fn = acquire(service, policy, stream, 0).entry(0).function;
    out["sparse_nvfp4"] = launch_overhead(
        stream, [&] { d.cuLaunchKernelEx(&bc, fn, args, nullptr); },
        [&] { sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(v_q, v_kv, v_idx, v_out, v_lse, 0.1, opt, stream, service); },
        "sparse");
    for (CUdeviceptr p : {q, kv, idx, o, lse}) d.cuMemFree(p);
  }
  d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  d.cuStreamDestroy(stream);
  out["method"] = "host time per call over 200 back-to-back enqueues (stream drained outside the timing), bare and "
                  "launcher batches alternating, median of 51 batches each; one-block problems";
  return out;
}

// Wall time of compiling `keys` into an empty cache with `jobs` threads.
double prebuild_wall_ms(const std::vector<SemanticKey>& keys, const std::filesystem::path& dir, int jobs) {
  KernelService service(bench_config(dir));
  std::atomic<std::size_t> next{0};
  const auto start = BenchClock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < jobs; ++t) {
    pool.emplace_back([&] {
      for (std::size_t i = next++; i < keys.size(); i = next++) service.build(keys[i]);
    });
  }
  for (auto& t : pool) t.join();
  return bench_ms_since(start);
}

}  // namespace

int run_bench(const BenchOptions& options) {
  if (options.what != "jit") {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("unknown benchmark '{}'; available: jit, mla, sparse, sparse_dsv41, writer", options.what));
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
      const auto t0 = BenchClock::now();
      service.build(key);
      ms.push_back(bench_ms_since(t0));
      cold.push_back({{"key", key.str()}, {"ms", ms.back()}});
      std::fprintf(stderr, "cold compile %-60s %8.1f ms\n", key.str().c_str(), ms.back());
    }
    results["cold_compile"] = {{"per_key", cold}, {"median_ms", bench_median(ms)}, {"target_ms", 1000}};
  }
  results["cold_compile_mla"] = cold_compile(mla_bench_policy().key(arch), base, 3);
  results["cold_compile_sparse"] = cold_compile(sparse_bench_policy().key(arch), base, 3);
  results["cold_compile_manifest"] = cold_compile_manifest(arch, base, gpu);

  // Disk hits: a new service (empty memory) over the cache just filled. With a GPU this is the whole
  // warm-up (read + checksum + module load + attributes); without one, read + checksum only. The
  // primary context exists before the first one (an engine has one), so the first load is a module
  // load, not context creation.
  {
    std::optional<ScopedDeviceContext> context;
    if (gpu) context.emplace(0);
    KernelService service(bench_config(cold_dir));
    json per_key = json::array();
    std::vector<double> ms;
    for (const SemanticKey& key : writer_keys(arch)) {
      const auto t0 = BenchClock::now();
      if (gpu) service.warm(key, 0);
      else service.build(key);
      ms.push_back(bench_ms_since(t0));
      per_key.push_back({{"key", key.str()}, {"ms", ms.back()}});
    }
    results["disk_hit_warm"] = {{"per_key", per_key}, {"first_ms", ms.front()}, {"median_ms", bench_median(ms)}, {"target_ms", 1.0},
                                {"includes", gpu ? "read, checksum, cuModuleLoadData, attributes" : "read, checksum (no GPU)"},
                                {"compiles", service.counters().compiles}};
    std::fprintf(stderr, "disk-hit warm: first %.3f ms, median %.3f ms per key (%s)\n", ms.front(), bench_median(ms),
                 gpu ? "with module load" : "no GPU: read+verify");
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
    KernelService service(bench_config(cold_dir));
    const nvfp4::WriterPolicy policy{nvfp4::WriterOp::kAppend, 64};
    nvfp4::warm(policy, {0}, service);
    // In-memory lookup: what every launch pays to find its warm handle.
    constexpr int kLookups = 2'000'000;
    const std::uint64_t fp = policy.fingerprint();
    const auto t0 = BenchClock::now();
    const KernelHandle* sink = nullptr;
    for (int i = 0; i < kLookups; ++i) sink = service.find(fp, 0);
    const double lookup_ns = bench_ms_since(t0) * 1e6 / kLookups;
    if (sink == nullptr) throw Error(ErrorCode::kInternal, "lookup benchmark lost its handle");
    results["lookup_ns"] = {{"value", lookup_ns}, {"target_ns", 100}};
    std::fprintf(stderr, "in-memory lookup: %.1f ns\n", lookup_ns);

    results["launch_us"] = launch_overheads(base);
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
  // The whole default manifest (every arch) into an empty cache on every hardware thread, the way
  // `kiln prebuild -j N` runs it.
  {
    const std::vector<SemanticKey> manifest = manifest_keys("", std::nullopt);
    const int jobs = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    KernelService service(bench_config(fresh_dir(base, "prebuild-manifest")));
    const auto start = BenchClock::now();
    const std::vector<PrebuildOutcome> outcomes = tools::prebuild(service, manifest, jobs);
    const double wall = bench_ms_since(start);
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].status == "failed") throw Error(ErrorCode::kCompileFailed, fmt::format("bench jit: {}: {}", manifest[i].str(), outcomes[i].detail));
    }
    prebuild["default_manifest"] = {{"keys", manifest.size()}, {"jobs", jobs}, {"wall_ms", wall}};
    std::fprintf(stderr, "prebuild -j %d: the default manifest's %zu keys in %.1f s\n", jobs, manifest.size(), wall / 1000);
  }
  results["prebuild"] = prebuild;
  report["results"] = results;
  write_report(report, options.out);
  return 0;
}

}  // namespace kiln::tools
