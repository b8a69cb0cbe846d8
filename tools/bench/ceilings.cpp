#include "tools/bench/ceilings.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "tools/bench/report.h"

namespace kiln::tools {

namespace {

// The bf16 tensor-core ceiling without cuBLAS: every warp runs kChains
// independent chains of mma.sync m16n8k16 (bf16 in, fp32 accumulate) on register operands, 32 warps
// per SM. No memory traffic, so its rate is the mma.sync issue limit; Hopper's wgmma peaks higher.
constexpr const char* kMmaPeakSource = R"(
namespace kiln_bench {
constexpr int kChains = 8;
__global__ void __launch_bounds__(256, 4) mma_peak(float* out, int iters) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  // Thread-dependent, non-zero bf16 pairs near 2^-7 (no overflow over any iteration count used).
  unsigned a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u ^ ((t * 2654435761u + i * 40503u) & 0x007f007fu);
  for (int i = 0; i < 2; ++i) b[i] = 0x3c003c00u ^ ((t * 2246822519u + i * 3266489917u) & 0x007f007fu);
  float c[kChains][4];
  for (int k = 0; k < kChains; ++k) c[k][0] = c[k][1] = c[k][2] = c[k][3] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < kChains; ++k) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  float s = 0.f;
  for (int k = 0; k < kChains; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  out[t] = s;  // keeps every chain live
}
}  // namespace kiln_bench
)";
constexpr int kMmaChains = 8;
constexpr int kMmaThreads = 256;
constexpr int kMmaBlocksPerSm = 4;
constexpr int kMmaIters = 32768;

// Hopper's bf16 tensor-core ceiling (sm_90a): two warpgroups per SM each stream m64n256k16 wgmmas
// with both operands in shared memory (128-byte swizzle, the layout the MLA kernel uses), 4 per
// commit group, keeping one group in flight behind the one being issued.
constexpr const char* kWgmmaPeakSource = R"(
#include "common/wgmma.cuh"
namespace kiln_bench {
using namespace kiln;
__global__ void __launch_bounds__(256, 1) wgmma_peak(float* out, int iters) {
  __shared__ __align__(1024) unsigned char smem[8192 + 32768];
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(smem));
  // Non-zero bf16 near 2^-7, different per word (no overflow over any iteration count used).
  for (int i = threadIdx.x; i < (8192 + 32768) / 4; i += blockDim.x) {
    reinterpret_cast<u32*>(smem)[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x007f007fu);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[128];
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  wgmma_fence();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      WgmmaBf16<256>::ss<0>(d, wgmma_desc_sw128(base + ks * 32, 16, 1024),
                            wgmma_desc_sw128(base + 8192 + ks * 32, 16, 1024), true);
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  float s = 0.f;
  for (int i = 0; i < 128; ++i) s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
}  // namespace kiln_bench
)";
constexpr int kWgmmaThreads = 256;
constexpr int kWgmmaIters = 4096;

}  // namespace

double bench_ms_since(BenchClock::time_point t) {
  return std::chrono::duration<double, std::milli>(BenchClock::now() - t).count();
}

double bench_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::uint16_t bench_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

void bench_check(CUresult r, const char* call, const std::string& where) {
  if (r == CUDA_SUCCESS) return;
  Driver::get().check(r, fmt::format("{} ({})", call, where).c_str());
}

BenchDeviceMemory::BenchDeviceMemory(std::size_t bytes, const std::string& what) : bytes_(bytes) {
  bench_check(Driver::get().cuMemAlloc(&ptr_, std::max<std::size_t>(bytes, 256)), "cuMemAlloc",
              fmt::format("{}: {:.1f} MiB", what, static_cast<double>(bytes) / kBenchMiB));
}

BenchDeviceMemory::~BenchDeviceMemory() {
  if (ptr_) Driver::get().cuMemFree(ptr_);
}

BenchStream::BenchStream() {
  bench_check(Driver::get().cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), "cuStreamCreate", "bench stream");
}

BenchStream::~BenchStream() { Driver::get().cuStreamDestroy(s_); }

BenchEvent::BenchEvent(const std::string& where) {
  bench_check(Driver::get().cuEventCreate(&e_, CU_EVENT_DEFAULT), "cuEventCreate", where);
}

BenchEvent::~BenchEvent() {
  if (e_) Driver::get().cuEventDestroy(e_);
}

double measure_copy_tb_s(const BenchDeviceMemory& src, const BenchDeviceMemory& dst, CUstream stream, int samples) {
  const Driver& d = Driver::get();
  const std::size_t n = std::min(src.bytes(), dst.bytes());
  const std::string where = fmt::format("copy ceiling: {} MiB", n / kBenchMiB);
  std::vector<double> ms;
  for (int i = 0; i <= samples; ++i) {
    const double t = bench_time_ms(stream, where, [&] {
      bench_check(d.cuMemcpyDtoDAsync(dst.ptr(), src.ptr(), n, stream), "cuMemcpyDtoDAsync", where);
    });
    if (i > 0) ms.push_back(t);  // the first copy is the warm-up
  }
  return 2.0 * static_cast<double>(n) / (bench_median(ms) * 1e-3) * 1e-12;
}

namespace {

struct PeakKernelSpec {
  const char* label;        // "<label> kernel" / "<label> output" in messages
  const char* source;
  const char* entry;        // name expression
  const char* compile_name;
  int blocks_per_sm, threads, iters;
  double flop_per_block_iter;
};

const PeakKernelSpec& peak_spec(BenchPeakKernel::Kind kind) {
  // mma.sync: 16x8x16 per instruction, kMmaChains per warp per iteration; wgmma: 64x256x16, 4 per
  // warpgroup per iteration.
  static const PeakKernelSpec kMma{"mma.sync peak",  kMmaPeakSource, "kiln_bench::mma_peak", "bench:mma_peak",
                                   kMmaBlocksPerSm,  kMmaThreads,    kMmaIters,
                                   2.0 * 16 * 8 * 16 * kMmaChains * (kMmaThreads / 32)};
  static const PeakKernelSpec kWgmma{"wgmma peak", kWgmmaPeakSource, "kiln_bench::wgmma_peak", "bench:wgmma_peak",
                                     1,            kWgmmaThreads,    kWgmmaIters,
                                     2.0 * 64 * 256 * 16 * 4 * (kWgmmaThreads / 128)};
  return kind == BenchPeakKernel::Kind::kMmaSync ? kMma : kWgmma;
}

}  // namespace

BenchPeakKernel::BenchPeakKernel(Kind kind, const std::string& arch, int sm_count) : kind_(kind) {
  const PeakKernelSpec& spec = peak_spec(kind);
  blocks_ = sm_count * spec.blocks_per_sm;
  const Driver& d = Driver::get();
  const std::string what = fmt::format("{} kernel", spec.label);
  const CompileResult r = Compiler().compile(KernelSource{spec.source, {spec.entry}}, arch, spec.compile_name);
  bench_check(d.cuModuleLoadData(&module_, r.cubin.data()), "cuModuleLoadData", what);
  bench_check(d.cuModuleGetFunction(&function_, module_, r.lowered_names.at(0).c_str()), "cuModuleGetFunction", what);
  out_ = std::make_unique<BenchDeviceMemory>(static_cast<std::size_t>(blocks_) * spec.threads * 4,
                                             fmt::format("{} output", spec.label));
}

BenchPeakKernel::~BenchPeakKernel() {
  if (module_) Driver::get().cuModuleUnload(module_);
}

double BenchPeakKernel::measure(CUstream stream) const {
  const PeakKernelSpec& spec = peak_spec(kind_);
  const Driver& d = Driver::get();
  const std::string what = fmt::format("{} kernel", spec.label);
  CUdeviceptr out = out_->ptr();
  int iters = spec.iters;
  void* args[] = {&out, &iters};
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    const double t = bench_time_ms(stream, spec.label, [&] {
      bench_check(d.cuLaunchKernel(function_, blocks_, 1, 1, spec.threads, 1, 1, 0, stream, args, nullptr), "cuLaunchKernel",
                  what);
    });
    if (i > 0) ms.push_back(t);
  }
  float probe[4] = {};
  bench_check(d.cuMemcpyDtoH(probe, out, sizeof probe), "cuMemcpyDtoH", fmt::format("{} output", spec.label));
  for (float f : probe) {
    if (!std::isfinite(f) || f == 0.f) {
      throw Error(ErrorCode::kInternal, fmt::format("{} produced {} (expected finite, non-zero)", what, f));
    }
  }
  const double flop = spec.flop_per_block_iter * static_cast<double>(iters) * blocks_;
  return flop / (bench_median(ms) * 1e-3) * 1e-12;
}

std::string BenchPeakKernel::method(Kind kind) {
  if (kind == Kind::kMmaSync) {
    return fmt::format("NVRTC-compiled kernel: {} independent mma.sync.m16n8k16 bf16->fp32 chains per warp on register operands, "
                       "{} warps per SM, {} iterations; median of 7 after a warm-up",
                       kMmaChains, kMmaThreads / 32 * kMmaBlocksPerSm, kMmaIters);
  }
  return fmt::format("NVRTC-compiled kernel (sm_90a): {} warpgroups per SM each issue wgmma.m64n256k16 bf16->fp32 with both "
                     "operands in shared memory (128-byte swizzle), 4 per commit group, one group in flight; {} iterations; "
                     "median of 7 after a warm-up",
                     kWgmmaThreads / 128, kWgmmaIters);
}

BenchCeilings::BenchCeilings(const std::string& arch, int sm_count, CUstream stream)
    : copy_src_(1024 * kBenchMiB, "copy ceiling source"),
      copy_dst_(1024 * kBenchMiB, "copy ceiling destination") {
  bench_fill_bf16(copy_src_.ptr(), copy_src_.bytes(), 7, "copy ceiling source");
  bench_check(Driver::get().cuCtxSynchronize(), "cuCtxSynchronize", "copy ceiling upload");
  mma_.emplace(BenchPeakKernel::Kind::kMmaSync, arch, sm_count);
  if (arch == "sm_90a") wgmma_.emplace(BenchPeakKernel::Kind::kWgmma, arch, sm_count);
  copy_start_ = measure_copy_tb_s(copy_src_, copy_dst_, stream);
  mma_start_ = mma_->measure(stream);
  if (wgmma_) wgmma_start_ = wgmma_->measure(stream);
  std::fprintf(stderr, "ceilings (start): copy %.2f TB/s (read+write), mma.sync bf16 peak %.0f TFLOP/s, wgmma bf16 peak %.0f TFLOP/s\n",
               copy_start_, mma_start_, wgmma_start_);
}

void BenchCeilings::read_end(CUstream stream) {
  copy_end_ = measure_copy_tb_s(copy_src_, copy_dst_, stream);
  mma_end_ = mma_->measure(stream);
  if (wgmma_) wgmma_end_ = wgmma_->measure(stream);
}

nlohmann::json BenchCeilings::report() const {
  return {{"copy_tb_s", {{"start", copy_start_}, {"end", copy_end_}, {"used", copy_tb_s()},
                         {"method", "1 GiB cuMemcpyDtoDAsync, (read + write) bytes / time, median of 7 after a warm-up"}}},
          {"mma_sync_peak_tflop_s", {{"start", mma_start_}, {"end", mma_end_}, {"used", mma_tflop_s()}, {"method", BenchPeakKernel::method(BenchPeakKernel::Kind::kMmaSync)}}},
          {"wgmma_peak_tflop_s",
           {{"start", wgmma_start_}, {"end", wgmma_end_}, {"used", wgmma_tflop_s()},
            {"method", wgmma_ ? BenchPeakKernel::method(BenchPeakKernel::Kind::kWgmma) : std::string("not measured: wgmma needs sm_90a")}}}};
}

void BenchCeilings::print() const {
  std::fprintf(stderr,
               "\nceilings: copy %.2f TB/s (start %.2f, end %.2f); mma.sync peak %.0f TFLOP/s (start %.0f, end %.0f); wgmma "
               "peak %.0f TFLOP/s (start %.0f, end %.0f)\n",
               copy_tb_s(), copy_start_, copy_end_, mma_tflop_s(), mma_start_, mma_end_, wgmma_tflop_s(), wgmma_start_,
               wgmma_end_);
}

BenchReplayTimes bench_graph_replays(CUstream stream, const std::string& where, int calls, double long_replay_ms,
                                     const std::function<void()>& capture, const std::function<void()>& check_warm_up) {
  const Driver& d = Driver::get();
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  bench_check(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture", where);
  try {
    capture();
  } catch (...) {
    d.cuStreamEndCapture(stream, &graph);  // leave the stream usable; the error names the cause
    if (graph) d.cuGraphDestroy(graph);
    throw;
  }
  bench_check(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture", where);
  const CUresult inst = d.cuGraphInstantiateWithFlags(&exec, graph, 0);
  d.cuGraphDestroy(graph);
  bench_check(inst, "cuGraphInstantiateWithFlags", where);

  BenchReplayTimes t;
  try {
    bench_check(d.cuGraphLaunch(exec, stream), "cuGraphLaunch", where + " warm-up");
    bench_check(d.cuStreamSynchronize(stream), "cuStreamSynchronize", where + " warm-up (a kernel fault shows here)");
    check_warm_up();
    std::vector<double> per_call_us;
    for (int s = 0; s < 7; ++s) {
      const double ms = bench_time_ms(stream, where, [&] { bench_check(d.cuGraphLaunch(exec, stream), "cuGraphLaunch", where); });
      per_call_us.push_back(ms * 1e3 / calls);
      t.replay_ms = std::max(t.replay_ms, ms);
      if (s + 1 >= 5 && ms > long_replay_ms) break;
    }
    t.replays = static_cast<int>(per_call_us.size());
    t.us = bench_median(per_call_us);
    t.us_min = *std::min_element(per_call_us.begin(), per_call_us.end());
    t.us_max = *std::max_element(per_call_us.begin(), per_call_us.end());
  } catch (...) {
    d.cuGraphExecDestroy(exec);
    throw;
  }
  d.cuGraphExecDestroy(exec);
  return t;
}

nlohmann::json bench_bar_summary(const nlohmann::json& bars) {
  nlohmann::json summary = nlohmann::json::object();
  for (const auto& [name, list] : bars.items()) {
    int pass = 0;
    for (const nlohmann::json& b : list) pass += b["pass"].get<bool>() ? 1 : 0;
    summary[name] = fmt::format("{}/{} pass", pass, list.size());
  }
  return summary;
}

void bench_finish_report(nlohmann::json& report, const BenchCeilings& ceilings, const std::string& cache_dir, BenchClock::time_point t_start,
                         const std::string& out) {
  report["ceilings"] = ceilings.report();
  if (!cache_dir.empty()) report["cache_dir"] = cache_dir;
  report["wall_s"] = bench_ms_since(t_start) / 1000;
  write_report(report, out);
  ceilings.print();
}

void bench_print_footer(const nlohmann::json& report, const nlohmann::json& bar_summary) {
  std::fprintf(stderr, "bars: %s\npower before: %s\npower after:  %s\nwall %.1f s\n", bar_summary.dump().c_str(),
               report.value("power_state", std::string()).c_str(), report["power_state_after"].get<std::string>().c_str(),
               report["wall_s"].get<double>());
}

std::string bench_power_state() {
  std::string out;
  if (FILE* p = popen("nvidia-smi --query-gpu=pstate,power.draw,power.limit,clocks.sm,clocks.max.sm,temperature.gpu "
                      "--format=csv,noheader 2>/dev/null | head -1",
                      "r")) {
    std::array<char, 256> buf{};
    while (fgets(buf.data(), buf.size(), p)) out += buf.data();
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

void bench_fill_bf16(CUdeviceptr dst, std::size_t bytes, std::size_t rotation, const std::string& where) {
  static const std::vector<std::uint16_t> pattern = [] {
    std::vector<std::uint16_t> w(16 * kBenchMiB);
    BenchRng rng(0x6b696c6e);
    for (std::size_t i = 0; i < w.size(); i += 4) {
      const std::uint64_t r = rng.next();
      for (std::size_t k = 0; k < 4; ++k) w[i + k] = bench_bf16_bits(static_cast<float>((r >> (16 * k)) & 0xffff) / 32768.f - 1.f);
    }
    return w;
  }();
  const Driver& d = Driver::get();
  const std::size_t pattern_bytes = pattern.size() * 2;
  std::size_t start = (rotation * 4099 * 2) % pattern_bytes;  // odd word stride: rotations differ
  for (std::size_t off = 0; off < bytes;) {
    const std::size_t n = std::min(bytes - off, pattern_bytes - start);
    bench_check(d.cuMemcpyHtoD(dst + off, reinterpret_cast<const char*>(pattern.data()) + start, n), "cuMemcpyHtoD", where);
    off += n;
    start = 0;
  }
}

void bench_fill_e4m3(CUdeviceptr dst, std::size_t bytes, std::size_t rotation, const std::string& where) {
  static const std::vector<std::uint8_t> pattern = [] {
    std::vector<std::uint8_t> w(32 * kBenchMiB);
    BenchRng rng(0x65346d33);
    for (std::size_t i = 0; i < w.size(); i += 8) {
      const std::uint64_t r = rng.next();
      for (std::size_t k = 0; k < 8; ++k) {
        const unsigned byte = static_cast<unsigned>(r >> (8 * k));
        // Either sign, exponent 3..7 (2^-4 .. 1.875), any mantissa: finite, never NaN.
        w[i + k] = static_cast<std::uint8_t>((byte & 0x80) | ((3 + (byte >> 3) % 5) << 3) | (byte & 7));
      }
    }
    return w;
  }();
  const Driver& d = Driver::get();
  std::size_t start = (rotation * 4099) % pattern.size();
  for (std::size_t off = 0; off < bytes;) {
    const std::size_t n = std::min(bytes - off, pattern.size() - start);
    bench_check(d.cuMemcpyHtoD(dst + off, pattern.data() + start, n), "cuMemcpyHtoD", where);
    off += n;
    start = 0;
  }
}

}  // namespace kiln::tools
