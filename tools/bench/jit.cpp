// kiln bench jit: cold NVRTC compile (writer, MLA and sparse keys; every manifest key of the arch with
// where its time went: front end, NVVM, ptxas, the rest of NVRTC, the cache store, and module load
// with a GPU; medians per family), disk-hit warm (first and median), remote-hit warm and a fleet start
// (with KILN_REMOTE_CACHE), in-memory lookup, host time per launch of each launcher beside a bare
// cuLaunchKernelEx, prebuild -j (writer keys; the whole manifest on every hardware thread). The
// manifest is --manifest's, or the embedded default.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <time.h>

#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/kernel_templates/common/writer_geometry.cuh"
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

// Where one cold compile's wall time went. The phases are NVRTC's own table (--time: wall time,
// whole milliseconds); `other` is the rest of Compiler::compile (program set-up with the embedded
// headers, name lowering, copying the cubin out, and the table's rounding); `store` is the rest of
// KernelService::build (cache lookup, the entry's lock, publish: write, fsync, rename). `cpu` is the
// process's CPU time over the build: the bench builds one key at a time, so that is the compile's,
// ptxas's threads included, and on a loaded host it is the figure that does not count waiting for a core.
struct CompileTimes {
  double total = 0, cpu = 0, front_end = 0, nvvm = 0, ptxas = 0, other = 0, store = 0;
};

double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// Builds `key` and times it (nothing else may run in the process meanwhile: `cpu` is the process's).
CompileTimes timed_build(KernelService& service, const SemanticKey& key, Artifact* artifact = nullptr) {
  const double cpu0 = process_cpu_ms();
  const auto t0 = BenchClock::now();
  Artifact a = service.build(key);
  CompileTimes t;
  t.total = bench_ms_since(t0);
  t.cpu = process_cpu_ms() - cpu0;
  const json& m = a.entry->metadata;
  if (a.source == ArtifactSource::kCompiled && m.contains("compile_phases_ms")) {
    const json& p = m["compile_phases_ms"];
    t.front_end = p.value("front_end", 0.0);
    t.nvvm = p.value("nvvm", 0.0);
    t.ptxas = p.value("ptxas", 0.0);
    const double compile = m.value("compile_ms", 0.0);
    t.other = std::max(0.0, compile - t.front_end - t.nvvm - t.ptxas);
    t.store = std::max(0.0, t.total - compile);
  }
  if (artifact != nullptr) *artifact = std::move(a);
  return t;
}

// Medians (and totals) of a list of CompileTimes, field by field.
struct TimesColumn {
  std::vector<CompileTimes> items;
  double median(double CompileTimes::*f) const {
    std::vector<double> v;
    for (const CompileTimes& t : items) v.push_back(t.*f);
    return v.empty() ? 0.0 : bench_median(v);
  }
  double total(double CompileTimes::*f) const {
    double s = 0;
    for (const CompileTimes& t : items) s += t.*f;
    return s;
  }
  json medians() const {
    return {{"total_ms", median(&CompileTimes::total)},         {"cpu_ms", median(&CompileTimes::cpu)},
            {"front_end_ms", median(&CompileTimes::front_end)}, {"nvvm_ms", median(&CompileTimes::nvvm)},
            {"ptxas_ms", median(&CompileTimes::ptxas)},         {"nvrtc_other_ms", median(&CompileTimes::other)},
            {"store_ms", median(&CompileTimes::store)}};
  }
  json totals() const {
    return {{"total_ms", total(&CompileTimes::total)},         {"cpu_ms", total(&CompileTimes::cpu)},
            {"front_end_ms", total(&CompileTimes::front_end)}, {"nvvm_ms", total(&CompileTimes::nvvm)},
            {"ptxas_ms", total(&CompileTimes::ptxas)},         {"nvrtc_other_ms", total(&CompileTimes::other)},
            {"store_ms", total(&CompileTimes::store)}};
  }
};

json times_json(const CompileTimes& t) {
  return {{"ms", t.total},       {"cpu_ms", t.cpu},           {"front_end_ms", t.front_end}, {"nvvm_ms", t.nvvm},
          {"ptxas_ms", t.ptxas}, {"nvrtc_other_ms", t.other}, {"store_ms", t.store}};
}

constexpr const char* kLoadNotMeasured = "not measured (no GPU)";

// Cold compiles of one key, each into a fresh cache (so each is one NVRTC run plus publish).
json cold_compile(const SemanticKey& key, const std::string& base, int runs) {
  TimesColumn runs_times;
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    KernelService service(bench_config(fresh_dir(base, fmt::format("cold-{}-{}", key.family(), i))));
    runs_times.items.push_back(timed_build(service, key));
    ms.push_back(runs_times.items.back().total);
  }
  std::fprintf(stderr, "cold compile %-60s median %8.1f ms of %d (cpu %.0f; front end %.0f, NVVM %.0f, ptxas %.0f, other %.0f, store %.0f ms)\n",
               key.str().c_str(), bench_median(ms), runs, runs_times.median(&CompileTimes::cpu),
               runs_times.median(&CompileTimes::front_end), runs_times.median(&CompileTimes::nvvm),
               runs_times.median(&CompileTimes::ptxas), runs_times.median(&CompileTimes::other),
               runs_times.median(&CompileTimes::store));
  const json med = runs_times.medians();
  return {{"key", key.str()},
          {"runs_ms", ms},
          {"median_ms", bench_median(ms)},
          {"median_phases",
           {{"front_end_ms", med["front_end_ms"]}, {"nvvm_ms", med["nvvm_ms"]}, {"ptxas_ms", med["ptxas_ms"]},
            {"nvrtc_other_ms", med["nvrtc_other_ms"]}, {"store_ms", med["store_ms"]}, {"cpu_ms", med["cpu_ms"]}}}};
}

// The medians a family's compile times are held to on the H200 (ms per key).
double family_target_ms(const std::string& family) {
  return family == "nvfp4_writer" || family == "dsv41_writer" ? 250 : 500;
}

// Every key of the manifest (empty: the embedded default) for `arch`, compiled one at a time into one fresh cache, with
// NVRTC's phases and (with a GPU) the module load; medians per family over the keys compiled (a key
// that renders another key's kernel is a disk hit and counts as shared).
json cold_compile_manifest(const std::string& manifest, const std::string& arch, const std::string& base, bool gpu) {
  const ManifestSelection selection = manifest_selection(manifest, arch);
  // Companions first, so that a decode key's load time is its own module's (warm loads its companions).
  std::vector<SemanticKey> keys(selection.keys.end() - static_cast<std::ptrdiff_t>(selection.companions), selection.keys.end());
  keys.insert(keys.end(), selection.keys.begin(), selection.keys.end() - static_cast<std::ptrdiff_t>(selection.companions));
  std::optional<ScopedDeviceContext> context;
  if (gpu) context.emplace(0);
  KernelService service(bench_config(fresh_dir(base, "cold-manifest")));
  struct Family {
    TimesColumn compiled;
    std::vector<double> load;
    std::size_t shared = 0;
  };
  std::map<std::string, Family> families;
  json per_key = json::array();
  for (const SemanticKey& key : keys) {
    Artifact a;
    const CompileTimes t = timed_build(service, key, &a);
    Family& f = families[key.family()];
    json item = {{"key", key.str()}};
    if (a.source != ArtifactSource::kCompiled) {
      ++f.shared;
      item["ms"] = t.total;
      item["source"] = std::string(artifact_source_name(a.source));
    } else {
      f.compiled.items.push_back(t);
      item.update(times_json(t));
    }
    if (gpu) {
      const auto t1 = BenchClock::now();
      service.warm(key, 0);
      f.load.push_back(bench_ms_since(t1));
      item["load_ms"] = f.load.back();
    } else {
      item["load_ms"] = kLoadNotMeasured;
    }
    std::fprintf(stderr, "cold compile %-100s %8.1f ms%s\n", key.str().c_str(), t.total,
                 a.source == ArtifactSource::kCompiled ? "" : " (shares another key's cubin)");
    per_key.push_back(std::move(item));
  }
  json summary = json::object();
  std::string table = fmt::format(
      "cold compile of the manifest's {} keys for {}, medians per compiled key in ms\n"
      "{:<14} {:>5} {:>6} {:>8} {:>8} {:>9} {:>7} {:>7} {:>6} {:>6} {:>6} {:>7}\n",
      keys.size(), arch, "family", "keys", "shared", "total", "cpu", "front end", "NVVM", "ptxas", "other", "store", "load",
      "target");
  for (const auto& [name, f] : families) {
    const TimesColumn& c = f.compiled;
    json fam = {{"keys_compiled", c.items.size()},
                {"keys_sharing_a_cubin", f.shared},
                {"median_ms", c.median(&CompileTimes::total)},
                {"median_cpu_ms", c.median(&CompileTimes::cpu)},
                {"max_ms", 0.0},
                {"total_ms", c.total(&CompileTimes::total)},
                {"target_median_ms", family_target_ms(name)}};
    for (const CompileTimes& t : c.items) fam["max_ms"] = std::max(fam["max_ms"].get<double>(), t.total);
    if (!c.items.empty()) {
      fam["median_phases"] = c.medians();
      fam["total_phases"] = c.totals();
    }
    if (!f.load.empty()) fam["median_load_ms"] = bench_median(f.load);
    else fam["median_load_ms"] = kLoadNotMeasured;
    table += fmt::format("{:<14} {:>5} {:>6} {:>8.0f} {:>8.0f} {:>9.0f} {:>7.0f} {:>7.0f} {:>6.0f} {:>6.0f} {:>6} {:>7.0f}\n", name,
                         c.items.size(), f.shared, c.median(&CompileTimes::total), c.median(&CompileTimes::cpu),
                         c.median(&CompileTimes::front_end), c.median(&CompileTimes::nvvm), c.median(&CompileTimes::ptxas),
                         c.median(&CompileTimes::other), c.median(&CompileTimes::store),
                         f.load.empty() ? std::string("-") : fmt::format("{:.2f}", bench_median(f.load)),
                         family_target_ms(name));
    summary[name] = std::move(fam);
  }
  if (!gpu) table += "load: not measured (no GPU)\n";
  std::fprintf(stderr, "%s", table.c_str());
  return {{"arch", arch},
          {"per_family", summary},
          {"per_key", per_key},
          {"method", "the manifest's keys for the arch, one at a time into one fresh cache. total: wall time of "
                     "KernelService::build; cpu: the process's CPU time over the build (one build at a time); front end, NVVM "
                     "(optimizer + code generation), ptxas: NVRTC's own --time table (wall, whole ms); nvrtc_other: the "
                     "rest of the compile call (program set-up, name lowering, cubin copy, rounding); store: the rest of "
                     "the build (lookup, lock, publish with fsync); load: cuModuleLoadData and attributes after the "
                     "compile, with a GPU only"}};
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
    lc.block[0] = kWriterThreads;
    CUlaunchConfig bc = driver_launch_config(lc, stream);
    void* args[] = {&params};
    const CUfunction fn = acquire(service, policy, stream, 0).entry(kWriterAppendScanEntry).function;
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
    mla::set_policy_params(policy, params);
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
    params.heads = policy.heads;
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
    TimesColumn times;
    for (const SemanticKey& key : writer_keys(arch)) {
      const CompileTimes t = timed_build(service, key);
      times.items.push_back(t);
      cold.push_back(times_json(t));
      cold.back()["key"] = key.str();
      std::fprintf(stderr, "cold compile %-60s %8.1f ms (cpu %.0f; front end %.0f, NVVM %.0f, ptxas %.0f ms)\n", key.str().c_str(),
                   t.total, t.cpu, t.front_end, t.nvvm, t.ptxas);
    }
    results["cold_compile"] = {{"per_key", cold}, {"median_ms", times.median(&CompileTimes::total)},
                               {"median_phases", times.medians()}, {"target_ms", 1000}};
  }
  results["cold_compile_mla"] = cold_compile(mla_bench_policy().key(arch), base, 3);
  results["cold_compile_sparse"] = cold_compile(sparse_bench_policy().key(arch), base, 3);
  results["cold_compile_manifest"] = cold_compile_manifest(options.manifest, arch, base, gpu);

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
    const std::vector<SemanticKey> manifest = manifest_keys(options.manifest, std::nullopt);
    const int jobs = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    KernelService service(bench_config(fresh_dir(base, "prebuild-manifest")));
    const auto start = BenchClock::now();
    const std::vector<PrebuildOutcome> outcomes = tools::prebuild(service, manifest, jobs);
    const double wall = bench_ms_since(start);
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].status == "failed") throw Error(ErrorCode::kCompileFailed, fmt::format("bench jit: {}: {}", manifest[i].str(), outcomes[i].detail));
    }
    // The key keeps its name when --manifest names another manifest, so reports stay comparable; "manifest" says which.
    prebuild["default_manifest"] = {{"keys", manifest.size()}, {"jobs", jobs}, {"wall_ms", wall},
                                    {"manifest", options.manifest.empty() ? "(embedded default)" : options.manifest}};
    std::fprintf(stderr, "prebuild -j %d: the manifest's %zu keys in %.1f s\n", jobs, manifest.size(), wall / 1000);
  }
  results["prebuild"] = prebuild;
  report["results"] = results;
  write_report(report, options.out);
  return 0;
}

}  // namespace kiln::tools
