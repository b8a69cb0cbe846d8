#pragma once
// Shared pieces of the device benchmarks (`kiln bench sparse`, and any other that wants them):
// checked driver calls that say what failed and where, device memory and event timing, and the two
// ceilings every kernel row is compared with, measured in the same run:
//   - device-to-device copy bandwidth (a large cuMemcpyDtoDAsync, bytes read + written);
//   - a bf16 tensor-core peak: an NVRTC-compiled kernel of independent mma.sync.m16n8k16 chains.
// The method and the peak kernel are those of tools/bench_mla.cpp (copied here so the sparse bench
// quotes the same ceilings; bench_mla.cpp could switch to this header and drop its private copy).
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/driver.h"

namespace kiln::tools {

inline constexpr std::size_t kBenchMiB = std::size_t{1} << 20;
// bf16 wgmma rate measured elsewhere on an H200 of this workplace (NOT in the run): a reference
// for kernels whose mma.sync ceiling understates Hopper's tensor cores.
inline constexpr double kWgmmaReferenceTflops = 790.0;

// Throws kiln::Error (driver) naming the call and `where` with the driver's error name and string.
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

// Device time in ms of the work `enqueue` puts on `stream`, between two events.
template <typename F>
double bench_time_ms(CUstream stream, const std::string& where, F&& enqueue);

// Median of `samples` copies of min(src, dst) bytes after one warm-up, in TB/s of bytes read + written.
double measure_copy_tb_s(const BenchDeviceMemory& src, const BenchDeviceMemory& dst, CUstream stream, int samples = 7);

// The mma.sync bf16 peak kernel, compiled with NVRTC for `arch` and loaded in the current context.
class BenchMmaPeak {
 public:
  BenchMmaPeak(const std::string& arch, int sm_count);
  ~BenchMmaPeak();
  BenchMmaPeak(const BenchMmaPeak&) = delete;
  BenchMmaPeak& operator=(const BenchMmaPeak&) = delete;
  // TFLOP/s, median of 7 launches after a warm-up; throws if the results are not finite and non-zero.
  double measure(CUstream stream) const;
  // One line for the report: what the kernel does.
  static std::string method();

 private:
  int blocks_;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::unique_ptr<BenchDeviceMemory> out_;
};

// pstate, power draw and limit, SM clock and max, temperature (nvidia-smi), or "" without it.
std::string bench_power_state();

// Host-side fill: `bytes` (even) of random bf16 in (-1, 1) at `dst`, from a 32 MiB pattern rotated
// by `rotation`, uploaded in pieces (random-looking, never zeros: zeros can run faster than real data).
void bench_fill_bf16(CUdeviceptr dst, std::size_t bytes, std::size_t rotation, const std::string& where);

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
