#pragma once
// Shared pieces of the device benchmarks (`kiln bench mla`, `kiln bench sparse`): checked driver
// calls that say what failed and where, device memory, a stream, event timing, a CUDA-graph replay
// timer, and the ceilings every kernel row is compared with, measured in the same run:
//   - device-to-device copy bandwidth (a large cuMemcpyDtoDAsync, bytes read + written);
//   - bf16 tensor-core peaks: an NVRTC-compiled kernel of independent mma.sync.m16n8k16 chains, and
//     on sm_90a one of wgmma.m64n256k16 from shared memory.
#include <cuda.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/driver.h"

namespace kiln::tools {

inline constexpr std::size_t kBenchMiB = std::size_t{1} << 20;

using BenchClock = std::chrono::steady_clock;
double bench_ms_since(BenchClock::time_point t);

double bench_median(std::vector<double> v);

// splitmix64: fills hundreds of MB of host data in well under a second.
struct BenchRng {
  std::uint64_t state;
  explicit BenchRng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// fp32 -> bf16 bits, round to nearest even (finite inputs).
std::uint16_t bench_bf16_bits(float f);

// Every driver call goes through here: a failure throws kiln::Error (driver) naming the call and
// `where` with the driver's error name and string, e.g. "cuGraphLaunch (B=128 L=16384 H=128 SQ=2)".
void bench_check(CUresult r, const char* call, const std::string& where);

class BenchDeviceMemory {
 public:
  BenchDeviceMemory(std::size_t bytes, const std::string& what);
  ~BenchDeviceMemory();
  BenchDeviceMemory(const BenchDeviceMemory&) = delete;
  BenchDeviceMemory& operator=(const BenchDeviceMemory&) = delete;
  CUdeviceptr ptr() const { return ptr_; }
  void* at(std::size_t offset) const { return reinterpret_cast<void*>(ptr_ + offset); }
  std::size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_;
};

class BenchEvent {
 public:
  explicit BenchEvent(const std::string& where);
  ~BenchEvent();
  BenchEvent(const BenchEvent&) = delete;
  BenchEvent& operator=(const BenchEvent&) = delete;
  CUevent get() const { return e_; }

 private:
  CUevent e_ = nullptr;
};

// A non-blocking stream, destroyed with the object.
class BenchStream {
 public:
  BenchStream();
  ~BenchStream();
  BenchStream(const BenchStream&) = delete;
  BenchStream& operator=(const BenchStream&) = delete;
  CUstream get() const { return s_; }

 private:
  CUstream s_ = nullptr;
};

// Device time in ms of the work `enqueue` puts on `stream`, between two events.
template <typename F>
double bench_time_ms(CUstream stream, const std::string& where, F&& enqueue);

// Median of `samples` copies of min(src, dst) bytes after one warm-up, in TB/s of bytes read + written.
double measure_copy_tb_s(const BenchDeviceMemory& src, const BenchDeviceMemory& dst, CUstream stream, int samples = 7);

// A bf16 tensor-core peak kernel, compiled with NVRTC for `arch` and loaded in the current context:
// mma.sync (any arch) or wgmma (sm_90a only).
class BenchPeakKernel {
 public:
  enum class Kind { kMmaSync, kWgmma };
  BenchPeakKernel(Kind kind, const std::string& arch, int sm_count);
  ~BenchPeakKernel();
  BenchPeakKernel(const BenchPeakKernel&) = delete;
  BenchPeakKernel& operator=(const BenchPeakKernel&) = delete;
  // TFLOP/s, median of 7 launches after a warm-up; throws if the results are not finite and non-zero.
  double measure(CUstream stream) const;
  // One line for the report: what the kernel does.
  static std::string method(Kind kind);

 private:
  Kind kind_;
  int blocks_ = 0;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::unique_ptr<BenchDeviceMemory> out_;
};

// Both ceilings, read when constructed (1 GiB copies from a bench_fill_bf16 source, the peak
// kernel) and again by read_end(): clocks and power may move over a sweep, so the larger is used.
// The constructor prints the first reading on stderr.
class BenchCeilings {
 public:
  BenchCeilings(const std::string& arch, int sm_count, CUstream stream);
  BenchCeilings(const BenchCeilings&) = delete;
  BenchCeilings& operator=(const BenchCeilings&) = delete;
  void read_end(CUstream stream);
  double copy_tb_s() const { return std::max(copy_start_, copy_end_); }
  double mma_tflop_s() const { return std::max(mma_start_, mma_end_); }
  double wgmma_tflop_s() const { return std::max(wgmma_start_, wgmma_end_); }  // 0 off sm_90a
  // The report's "ceilings" object: both readings, the ones used and the methods.
  nlohmann::json report() const;
  // The "ceilings: ..." line above the compact table.
  void print() const;

 private:
  BenchDeviceMemory copy_src_, copy_dst_;
  std::optional<BenchPeakKernel> mma_;    // compiled once the copy source is filled
  std::optional<BenchPeakKernel> wgmma_;  // sm_90a only
  double copy_start_ = 0, mma_start_ = 0, copy_end_ = 0, mma_end_ = 0, wgmma_start_ = 0, wgmma_end_ = 0;
};

// Per-call times of a captured graph of `calls` launcher calls.
struct BenchReplayTimes {
  double us = 0, us_min = 0, us_max = 0;  // median, min and max over the timed replays, per call
  int replays = 0;                        // replays timed
  double replay_ms = 0;                   // the longest timed replay
};

// Captures what `capture` enqueues on `stream` into one CUDA graph (ending the capture if it
// throws), replays it once to warm up, synchronises (a kernel fault shows there) and runs
// `check_warm_up`, then times 7 replays with events; after 5, a replay longer than `long_replay_ms`
// stops the sampling (time budget). `where` names the config in driver errors.
BenchReplayTimes bench_graph_replays(CUstream stream, const std::string& where, int calls, double long_replay_ms,
                                     const std::function<void()>& capture, const std::function<void()>& check_warm_up);

// "N/M pass" for each list of bars (objects with a boolean "pass").
nlohmann::json bench_bar_summary(const nlohmann::json& bars);

// Ends a kernel bench's report: the ceilings, the cache directory (skipped when empty) and the wall
// time since `t_start`; writes it (write_report) and prints the ceilings line that heads the stderr table.
void bench_finish_report(nlohmann::json& report, const BenchCeilings& ceilings, const std::string& cache_dir, BenchClock::time_point t_start,
                         const std::string& out);

// The last lines of the stderr table: bar summary, power before and after, wall time (from `report`).
void bench_print_footer(const nlohmann::json& report, const nlohmann::json& bar_summary);

// pstate, power draw and limit, SM clock and max, temperature (nvidia-smi), or "" without it.
std::string bench_power_state();

// Host-side fill: `bytes` (even) of random bf16 in (-1, 1) at `dst`, from a 32 MiB pattern rotated
// by `rotation`, uploaded in pieces (random-looking, never zeros: zeros can run faster than real data).
void bench_fill_bf16(CUdeviceptr dst, std::size_t bytes, std::size_t rotation, const std::string& where);
// The same for e4m3 bytes: random signs and magnitudes 2^-4 .. 1.875 (finite, never NaN).
void bench_fill_e4m3(CUdeviceptr dst, std::size_t bytes, std::size_t rotation, const std::string& where);

// ---- template definition ----
template <typename F>
double bench_time_ms(CUstream stream, const std::string& where, F&& enqueue) {
  const Driver& d = Driver::get();
  BenchEvent e0(where), e1(where);
  bench_check(d.cuEventRecord(e0.get(), stream), "cuEventRecord", where);
  enqueue();
  bench_check(d.cuEventRecord(e1.get(), stream), "cuEventRecord", where);
  bench_check(d.cuEventSynchronize(e1.get()), "cuEventSynchronize", where);
  float ms = 0;
  bench_check(d.cuEventElapsedTime(&ms, e0.get(), e1.get()), "cuEventElapsedTime", where);
  return ms;
}

}  // namespace kiln::tools
