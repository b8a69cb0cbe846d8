#pragma once
// Test-only RAII device memory through kiln's dlopen'ed driver.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/runtime/driver.h"

namespace kiln::testing {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    const Driver& d = Driver::get();
    d.check(d.cuMemAlloc(&ptr_, bytes ? bytes : 1), "cuMemAlloc");
  }
  ~DeviceBuffer() { Driver::get().cuMemFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* host, std::size_t n) const {
    const Driver& d = Driver::get();
    d.check(d.cuMemcpyHtoD(ptr_, host, n), "cuMemcpyHtoD");
  }
  template <typename T>
  void upload(const std::vector<T>& v) const { upload(v.data(), v.size() * sizeof(T)); }

  template <typename T>
  std::vector<T> download(std::size_t count) const {
    std::vector<T> out(count);
    const Driver& d = Driver::get();
    d.check(d.cuCtxSynchronize(), "cuCtxSynchronize");
    d.check(d.cuMemcpyDtoH(out.data(), ptr_, count * sizeof(T)), "cuMemcpyDtoH");
    return out;
  }
  void fill(std::uint8_t byte) const {
    const Driver& d = Driver::get();
    d.check(d.cuMemsetD8(ptr_, byte, bytes_), "cuMemsetD8");
  }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_;
};

}  // namespace kiln::testing
