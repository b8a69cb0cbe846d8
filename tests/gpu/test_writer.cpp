// NVFP4 cache writer on the GPU: byte-identical to the CPU reference (tests/support/nvfp4_reference).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "kiln/jit/error.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "tests/support/device_buffer.h"
#include "tests/support/nvfp4_reference.h"

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::testing::DeviceBuffer;
using kiln::testing::float_to_bf16;
using kiln::testing::kNvfp4TokenBytes;

// Rows whose 16-value groups cover the edge cases: all-zero, -0 only, tiny, saturating (values past
// +-6 x the largest e4m3 scale), NaN and Inf inside a group, mixed magnitudes, then random.
std::vector<std::uint16_t> make_rows(std::int64_t rows, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> x(rows * 512);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int g = 0; g < 32; ++g) {
      const int kind = static_cast<int>((r * 7 + g) % 12);
      for (int i = 0; i < 16; ++i) {
        float v = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 16) - 8));
        if (kind == 0) v = 0.0f;
        if (kind == 1) v = -0.0f;
        if (kind == 2) v *= 1e-12f;                                 // scale rounds to 0
        if (kind == 3) v = (i % 2 ? -1.0f : 1.0f) * 3.0e4f * (1 + i);  // amax / 6 > 448: saturating scale
        if (kind == 4 && i == 5) v = std::numeric_limits<float>::quiet_NaN();
        if (kind == 5 && i == 9) v = -std::numeric_limits<float>::infinity();
        if (kind == 6) v = (i == 0) ? 1000.0f : v * 1e-3f;          // tiny next to a large one
        x[r * 512 + g * 16 + i] = float_to_bf16(v);
      }
    }
  }
  return x;
}

struct Layout {
  const char* name;
  int rank;
};

TensorView cache_view(void* data, const char* layout, std::int64_t pages, std::int64_t page, std::int64_t page_stride) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kU8;
  if (std::strcmp(layout, "compact") == 0) {
    v.rank = 3;
    v.shape = {pages, page, 384};
    v.strides = {page_stride, 384, 1};
  } else if (std::strcmp(layout, "HND") == 0) {
    v.rank = 4;
    v.shape = {pages, 1, page, 384};
    v.strides = {page_stride, page * 384, 384, 1};
  } else {
    v.rank = 4;
    v.shape = {pages, page, 1, 384};
    v.strides = {page_stride, 384, 384, 1};
  }
  return v;
}

constexpr std::uint8_t kPoison = 0xab;

}  // namespace

TEST_CASE("writer pack is byte-identical to the CPU reference", "[gpu]") {
  for (const int page : {2, 32, 64, 128}) {
    for (const char* layout : {"compact", "HND", "NHD"}) {
      const std::int64_t pages = page == 2 ? 37 : 5;
      const std::int64_t page_stride = page * kNvfp4TokenBytes + 64;  // padding between pages must survive
      const auto x = make_rows(pages * page, 1234u + page);
      DeviceBuffer src(x.size() * 2), cache(pages * page_stride);
      src.upload(x);
      cache.fill(kPoison);
      kiln::nvfp4::pack(TensorView::contiguous(src.get(), DType::kBf16, {pages, page, 512}),
                        cache_view(cache.get(), layout, pages, page, page_stride), nullptr);
      const auto got = cache.download<std::uint8_t>(cache.bytes());
      std::vector<std::uint8_t> want(cache.bytes(), kPoison);
      for (std::int64_t t = 0; t < pages * page; ++t) {
        kiln::testing::nvfp4_write_token(want.data(), page_stride, page, t, &x[t * 512]);
      }
      INFO("page " << page << " layout " << layout);
      std::size_t first_diff = got.size();
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want[i]) {
          first_diff = i;
          break;
        }
      }
      INFO("first differing byte " << first_diff);
      CHECK(first_diff == got.size());
    }
  }
}

TEST_CASE("writer append: skips bad slots, lowest duplicate row wins, matches the reference", "[gpu]") {
  const int page = 64;
  const std::int64_t pages = 9, n = 300, page_stride = page * kNvfp4TokenBytes;
  const auto base = make_rows(pages * page, 7);
  const auto rows = make_rows(n, 8);
  std::mt19937 rng(9);
  std::vector<std::int32_t> slots(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const int kind = static_cast<int>(rng() % 10);
    slots[i] = kind == 0 ? -1 - static_cast<int>(rng() % 5)                       // negative: skipped
               : kind == 1 ? static_cast<int>(pages * page + rng() % 100)         // past the end: skipped
               : kind == 2 ? static_cast<int>(rng() % 8)                          // many duplicates
                           : static_cast<int>(rng() % (pages * page));
  }
  std::vector<std::uint8_t> want(pages * page_stride, 0);
  for (std::int64_t t = 0; t < pages * page; ++t) kiln::testing::nvfp4_write_token(want.data(), page_stride, page, t, &base[t * 512]);
  DeviceBuffer cache(want.size()), src(rows.size() * 2), map(slots.size() * 4);
  cache.upload(want);
  src.upload(rows);
  map.upload(slots);
  std::vector<bool> taken(pages * page, false);
  for (std::int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= pages * page || taken[slots[i]]) continue;
    taken[slots[i]] = true;
    kiln::testing::nvfp4_write_token(want.data(), page_stride, page, slots[i], &rows[i * 512]);
  }
  kiln::nvfp4::append(TensorView::contiguous(src.get(), DType::kBf16, {n, 512}),
                      TensorView::contiguous(map.get(), DType::kI32, {n}),
                      cache_view(cache.get(), "HND", pages, page, page_stride), nullptr);
  CHECK(cache.download<std::uint8_t>(want.size()) == want);
}

TEST_CASE("writer append captured in a CUDA graph and replayed with new rows equals eager", "[gpu]") {
  const kiln::Driver& d = kiln::Driver::get();
  const int page = 32;
  const std::int64_t pages = 4, n = 40, page_stride = page * kNvfp4TokenBytes;
  DeviceBuffer cache(pages * page_stride), src(n * 512 * 2), map(n * 4);
  std::vector<std::int32_t> slots(n);
  for (std::int64_t i = 0; i < n; ++i) slots[i] = static_cast<std::int32_t>((i * 37) % (pages * page));
  map.upload(slots);
  cache.fill(0);
  const auto view_rows = TensorView::contiguous(src.get(), DType::kBf16, {n, 512});
  const auto view_map = TensorView::contiguous(map.get(), DType::kI32, {n});
  const auto view_cache = cache_view(cache.get(), "compact", pages, page, page_stride);

  CUstream stream = nullptr;
  d.check(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  kiln::nvfp4::warm({kiln::nvfp4::WriterOp::kAppend, page}, {0});  // warm before capture
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  d.check(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  kiln::nvfp4::append(view_rows, view_map, view_cache, stream);
  d.check(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  d.check(d.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");

  for (std::uint32_t round = 0; round < 3; ++round) {
    const auto rows = make_rows(n, 100 + round);
    src.upload(rows);  // new values at the same address
    d.check(d.cuGraphLaunch(exec, stream), "cuGraphLaunch");
    d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    const auto replayed = cache.download<std::uint8_t>(cache.bytes());
    kiln::nvfp4::append(view_rows, view_map, view_cache, stream);  // eager, same values
    d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    CHECK(cache.download<std::uint8_t>(cache.bytes()) == replayed);
    std::vector<std::uint8_t> want(cache.bytes(), 0);
    for (std::int64_t i = 0; i < n; ++i) kiln::testing::nvfp4_write_token(want.data(), page_stride, page, slots[i], &rows[i * 512]);
    CHECK(replayed == want);
    cache.fill(0);
  }
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  d.cuStreamDestroy(stream);
}

TEST_CASE("a launch during capture whose key is not warm fails naming the key and compiles nothing", "[gpu]") {
  const kiln::Driver& d = kiln::Driver::get();
  const int page = 16;  // never warmed in this process
  DeviceBuffer cache(2 * page * kNvfp4TokenBytes), src(512 * 2), map(4);
  CUstream stream = nullptr;
  d.check(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  const auto before = kiln::KernelService::global().counters();
  d.check(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  try {
    kiln::nvfp4::append(TensorView::contiguous(src.get(), DType::kBf16, {1, 512}),
                        TensorView::contiguous(map.get(), DType::kI32, {1}),
                        cache_view(cache.get(), "compact", 2, page, page * kNvfp4TokenBytes), stream);
    FAIL("launch during capture of a cold key did not throw");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kNotWarm);
    CHECK_THAT(e.details().key, Catch::Contains("nvfp4_writer:sm_") && Catch::Contains("page_size=16"));
  }
  CUgraph graph = nullptr;
  d.check(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  if (graph) d.cuGraphDestroy(graph);
  const auto after = kiln::KernelService::global().counters();
  CHECK(after.compiles == before.compiles);
  CHECK(after.loads == before.loads);
  d.cuStreamDestroy(stream);
}

TEST_CASE("threads warm different keys while another captures and replays a graph", "[gpu]") {
  const kiln::Driver& d = kiln::Driver::get();
  const int page = 64;
  const std::int64_t pages = 2, n = 16;
  DeviceBuffer cache(pages * page * kNvfp4TokenBytes), src(n * 512 * 2), map(n * 4);
  std::vector<std::int32_t> slots(n);
  for (std::int64_t i = 0; i < n; ++i) slots[i] = static_cast<std::int32_t>(i * 3);
  map.upload(slots);
  const auto rows = make_rows(n, 42);
  src.upload(rows);
  kiln::nvfp4::warm({kiln::nvfp4::WriterOp::kAppend, page}, {0});
  CUstream stream = nullptr;
  d.check(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  d.check(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  kiln::nvfp4::append(TensorView::contiguous(src.get(), DType::kBf16, {n, 512}), TensorView::contiguous(map.get(), DType::kI32, {n}),
                      cache_view(cache.get(), "compact", pages, page, page * kNvfp4TokenBytes), stream);
  d.check(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  d.check(d.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");

  std::vector<std::thread> warmers;
  std::atomic<int> failures{0};
  for (const int p : {8, 24, 48, 96}) {
    warmers.emplace_back([p, &failures] {
      try {
        kiln::ScopedDeviceContext ctx(0);
        kiln::nvfp4::warm({kiln::nvfp4::WriterOp::kPack, p}, {0});
      } catch (...) {
        ++failures;
      }
    });
  }
  for (int i = 0; i < 50; ++i) d.check(d.cuGraphLaunch(exec, stream), "cuGraphLaunch");
  d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (auto& t : warmers) t.join();
  CHECK(failures == 0);
  std::vector<std::uint8_t> want(cache.bytes(), 0);
  cache.fill(0);
  d.check(d.cuGraphLaunch(exec, stream), "cuGraphLaunch");
  d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (std::int64_t i = 0; i < n; ++i) kiln::testing::nvfp4_write_token(want.data(), page * kNvfp4TokenBytes, page, slots[i], &rows[i * 512]);
  CHECK(cache.download<std::uint8_t>(cache.bytes()) == want);
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  d.cuStreamDestroy(stream);
}
