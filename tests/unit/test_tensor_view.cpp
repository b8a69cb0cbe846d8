// TensorView::from_dlpack: the device travels with the view, and memory a GPU cannot address is
// refused by name.
#include <catch2/catch.hpp>
#include <dlpack/dlpack.h>

#include "kiln/jit/error.h"
#include "kiln/runtime/tensor_view.h"
#include "tests/support/expect_error.h"

namespace {

DLTensor tensor(DLDeviceType type, int device, std::int64_t* shape) {
  DLTensor t{};
  t.data = reinterpret_cast<void*>(0x10000);
  t.device = {type, device};
  t.ndim = 2;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape;
  return t;
}

}  // namespace

TEST_CASE("from_dlpack keeps the CUDA device and refuses host memory", "[tensor_view]") {
  std::int64_t shape[2] = {3, 4};
  const kiln::TensorView v = kiln::TensorView::from_dlpack(tensor(kDLCUDA, 3, shape), "q");
  CHECK(v.device == 3);
  CHECK(v.rank == 2);
  CHECK(v.stride(0) == 4);
  CHECK(kiln::TensorView::from_dlpack(tensor(kDLCUDAManaged, 1, shape), "q").device == 1);
  CHECK(kiln::TensorView::contiguous(nullptr, kiln::DType::kBf16, {2}).device == kiln::TensorView::kAnyDevice);
  for (DLDeviceType host : {kDLCPU, kDLCUDAHost}) {
    const kiln::Error e = kiln::testing::expect_error([&] { kiln::TensorView::from_dlpack(tensor(host, 0, shape), "kv_cache"); });
    CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("kv_cache: expected CUDA device memory"));
  }
}
