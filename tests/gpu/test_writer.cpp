// NVFP4 cache writer on the GPU: byte-identical to the CPU reference (tests/support/nvfp4_reference),
// which encodes by brute-force nearest-value search and shares no code with the kernels.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "tests/support/device_buffer.h"
#include "tests/support/graph_capture.h"
#include "tests/support/nvfp4_device.h"
#include "tests/support/nvfp4_reference.h"

namespace {

namespace kt = kiln::testing;
using kiln::DType;
using kiln::TensorView;
using kt::DeviceBuffer;
using kt::kNvfp4TokenBytes;

constexpr std::uint8_t kPoison = 0xab;
constexpr std::uint16_t kBf16PosInf = 0x7f80, kBf16NegInf = 0xff80, kBf16NaN = 0x7fc0, kBf16NegNaN = 0xffc1;

// Upstream multiplies by rcp.approx.ftz.f32 of the scale (MUFU.RCP), not by a correctly rounded
// 1/scale: the reference takes those values from the device.
const kt::Nvfp4Reciprocals& device_reciprocals() { return kt::nvfp4_device_reciprocals(); }

std::uint16_t bf16(float f) { return kt::float_to_bf16(f); }

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

// Rows from a list of 16-value groups (28 per row; the last row padded with zero groups) and
// random RoPE tails.
std::vector<std::uint16_t> rows_from_groups(const std::vector<std::array<std::uint16_t, 16>>& groups, std::uint32_t seed) {
  const std::size_t n = (groups.size() + kt::kNvfp4Groups - 1) / kt::kNvfp4Groups;
  std::vector<std::uint16_t> x(n * 512, 0);
  std::mt19937 rng(seed);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::copy(groups[g].begin(), groups[g].end(), &x[(g / kt::kNvfp4Groups) * 512 + (g % kt::kNvfp4Groups) * 16]);
  }
  for (std::size_t r = 0; r < n; ++r) {
    for (int j = 448; j < 512; ++j) x[r * 512 + j] = static_cast<std::uint16_t>(rng());  // any bits, NaN included
  }
  return x;
}

// Packs `x` (whole pages of `page` rows) into a poisoned cache and compares every byte with the
// reference. Returns the first differing byte (or the cache size) for the failure message.
std::size_t pack_and_compare(const std::vector<std::uint16_t>& x, int page, const char* layout, std::int64_t extra_stride) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size() / 512);
  const std::int64_t pages = (rows + page - 1) / page;
  std::vector<std::uint16_t> padded(x);
  padded.resize(static_cast<std::size_t>(pages * page * 512), 0);
  const std::int64_t page_stride = page * kNvfp4TokenBytes + extra_stride;
  DeviceBuffer src(padded.size() * 2), cache(pages * page_stride);
  src.upload(padded);
  cache.fill(kPoison);
  kiln::nvfp4::pack(TensorView::contiguous(src.get(), DType::kBf16, {pages, page, 512}), cache_view(cache.get(), layout, pages, page, page_stride),
                    nullptr);
  const auto got = cache.download<std::uint8_t>(cache.bytes());
  std::vector<std::uint8_t> want(cache.bytes(), kPoison);
  for (std::int64_t t = 0; t < pages * page; ++t) kt::nvfp4_write_token(want.data(), page_stride, page, t, &padded[t * 512], device_reciprocals());
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  if (diff.first != got.end()) {
    const std::size_t at = static_cast<std::size_t>(diff.first - got.begin());
    INFO("byte " << at << ": got 0x" << std::hex << int(*diff.first) << ", want 0x" << int(*diff.second));
    CHECK(false);
    return at;
  }
  return got.size();
}

// Random groups: normal values times 2^k, a few groups per scale.
std::vector<std::uint16_t> random_rows(std::int64_t rows, std::uint32_t seed, int exp_lo, int exp_hi) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> x(rows * 512);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int g = 0; g < 32; ++g) {
      const float scale = std::exp2(static_cast<float>(exp_lo + static_cast<int>(rng() % (exp_hi - exp_lo + 1))));
      for (int i = 0; i < 16; ++i) x[r * 512 + g * 16 + i] = bf16(normal(rng) * scale);
    }
  }
  return x;
}

}  // namespace

TEST_CASE("writer pack: every bf16 amax gives the reference scale and codes", "[gpu][writer]") {
  // One group per positive bf16 value v (subnormals, normals, Inf, every NaN pattern): element 0 is
  // +-v, the rest are v * k / 16 with alternating signs, so the group's scale comes from v.
  std::vector<std::array<std::uint16_t, 16>> groups;
  for (std::uint32_t bits = 0; bits <= 0x7fff; ++bits) {
    std::array<std::uint16_t, 16> g{};
    const float v = kt::bf16_to_float(static_cast<std::uint16_t>(bits));
    g[0] = static_cast<std::uint16_t>(bits | ((bits & 1) << 15));
    for (int k = 1; k < 16; ++k) g[k] = std::isfinite(v) ? bf16((k % 2 ? -1.0f : 1.0f) * v * static_cast<float>(k) / 16.0f) : bf16(k * 0.5f);
    groups.push_back(g);
  }
  const auto x = rows_from_groups(groups, 1);
  CHECK(pack_and_compare(x, 64, "compact", 0) == (x.size() / 512 + 63) / 64 * 64 * kNvfp4TokenBytes);
}

TEST_CASE("writer pack: every bf16 value under every e4m3 scale", "[gpu][writer]") {
  // For each non-zero scale s, amax = the largest bf16 whose amax / 6 rounds to s, then every bf16
  // magnitude up to amax with both signs (NaN too): every tie of the E2M1 rounding is met.
  std::vector<std::array<std::uint16_t, 16>> groups;
  std::uint16_t amax_bits = 0;
  for (int s = 1; s <= 126; ++s) {
    while (amax_bits < 0x7f7f && kt::float_to_e4m3_satfinite(kt::bf16_to_float(static_cast<std::uint16_t>(amax_bits + 1)) / 6.0f) <= s) ++amax_bits;
    REQUIRE(kt::float_to_e4m3_satfinite(kt::bf16_to_float(amax_bits) / 6.0f) == s);
    std::array<std::uint16_t, 16> g{};
    int fill = 1;
    g[0] = amax_bits;
    for (std::uint32_t m = 0; m <= amax_bits; m += (s < 120 ? 1 : 3)) {
      for (std::uint32_t sign : {0u, 0x8000u}) {
        g[fill++] = static_cast<std::uint16_t>(m | sign);
        if (fill == 16) {
          groups.push_back(g);
          fill = 1;
          g[0] = static_cast<std::uint16_t>(amax_bits | (groups.size() % 2 ? 0x8000 : 0));
        }
      }
    }
    g[fill] = groups.size() % 2 ? kBf16NaN : kBf16NegNaN;  // a NaN element never sets the scale
    groups.push_back(g);
  }
  const auto x = rows_from_groups(groups, 2);
  CHECK(pack_and_compare(x, 64, "HND", 0) == (x.size() / 512 + 63) / 64 * 64 * kNvfp4TokenBytes);
}

TEST_CASE("writer pack: edge groups (zeros, -0, underflow, NaN, Inf, saturation)", "[gpu][writer]") {
  std::vector<std::array<std::uint16_t, 16>> groups;
  auto add = [&](std::initializer_list<std::uint16_t> head, std::uint16_t rest) {
    std::array<std::uint16_t, 16> g;
    g.fill(rest);
    std::copy(head.begin(), head.end(), g.begin());
    groups.push_back(g);
  };
  add({}, 0x0000);                                         // all +0: scale 0, codes 0
  add({}, 0x8000);                                         // all -0: codes 0x8
  add({0x8000, 0x0000, 0x8000}, 0x0000);                   // mixed signed zeros
  add({bf16(1.0f)}, bf16(-1e-3f));                         // negatives rounding to zero keep their sign
  add({}, bf16(-1e-30f));                                  // scale underflows to 0: x * 0 = -0
  add({0x8001, 0x0001, 0x807f}, 0x0000);                   // bf16 subnormals
  add({kBf16NaN}, 0x0000);                                 // NaN alone: scale 0, NaN -> +6
  add({kBf16NegNaN}, 0x8000);                              // negative NaN -> +6 all the same
  add({kBf16NaN, bf16(3.0f)}, bf16(-1.0f));                // NaN among values
  add({}, kBf16NaN);                                       // all NaN
  add({kBf16PosInf}, bf16(1.0f));                          // Inf: scale 448, Inf -> +6
  add({kBf16NegInf}, bf16(-200.0f));                       // -Inf -> -6
  add({kBf16PosInf, kBf16NegInf, kBf16NaN}, bf16(150.0f)); // both infinities and NaN
  add({bf16(3.0e4f), bf16(-3.0e4f)}, bf16(2688.0f));       // amax / 6 > 448: saturated scale, codes +-6
  add({0x7f7f, 0xff7f}, bf16(1e38f));                      // the largest finite bf16
  add({bf16(6.0f * 448.0f)}, bf16(-6.0f * 448.0f));        // exactly the largest scale
  add({bf16(5.0f), bf16(-5.0f), bf16(0.25f)}, bf16(1.25f)); // ties at scale 1
  const auto x = rows_from_groups(groups, 3);
  CHECK(pack_and_compare(x, 2, "NHD", 0) == (x.size() / 512 + 1) / 2 * 2 * kNvfp4TokenBytes);
}

TEST_CASE("writer pack: random data at several scales, every layout, padded page strides", "[gpu][writer]") {
  const std::pair<int, int> ranges[] = {{-40, -30}, {-12, -4}, {-3, 3}, {4, 12}, {30, 40}, {-60, 60}};
  int seed = 10;
  for (const int page : {2, 32, 64, 128}) {
    for (const char* layout : {"compact", "HND", "NHD"}) {
      const auto [lo, hi] = ranges[seed % 6];
      const std::int64_t rows = page == 2 ? 74 : 5 * page;
      INFO("page " << page << " layout " << layout << " exponents [" << lo << ", " << hi << "]");
      CHECK(pack_and_compare(random_rows(rows, seed++, lo, hi), page, layout, 64) == static_cast<std::size_t>(rows / page * (page * kNvfp4TokenBytes + 64)));
    }
  }
}

namespace {

// Appends `rows` through `slots` into a cache whose bytes start as `initial`, and checks every
// byte: targeted slots hold the record of their lowest row (padding zero again), others unchanged.
void append_and_compare(const std::vector<std::uint16_t>& rows, const std::vector<std::int32_t>& slots, std::vector<std::uint8_t> initial,
                        int page, std::int64_t pages, const char* layout) {
  const std::int64_t n = static_cast<std::int64_t>(slots.size()), page_stride = page * kNvfp4TokenBytes;
  DeviceBuffer cache(initial.size()), src(rows.size() * 2), map(slots.size() * 4);
  cache.upload(initial);
  src.upload(rows);
  map.upload(slots);
  kiln::nvfp4::append(TensorView::contiguous(src.get(), DType::kBf16, {n, 512}), TensorView::contiguous(map.get(), DType::kI32, {n}),
                      cache_view(cache.get(), layout, pages, page, page_stride), nullptr);
  std::vector<bool> taken(pages * page, false);
  for (std::int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= pages * page || taken[slots[i]]) continue;
    taken[slots[i]] = true;
    kt::nvfp4_write_token(initial.data(), page_stride, page, slots[i], &rows[i * 512], device_reciprocals());
  }
  const auto got = cache.download<std::uint8_t>(initial.size());
  const auto diff = std::mismatch(got.begin(), got.end(), initial.begin());
  INFO("first differing byte " << (diff.first - got.begin()) << " of " << got.size());
  CHECK(diff.first == got.end());
}

// Slot mapping with invalid entries (negative, past the end) and many duplicates.
std::vector<std::int32_t> messy_slots(std::int64_t n, std::int64_t slots_total, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> s(n);
  for (auto& v : s) {
    const int kind = static_cast<int>(rng() % 10);
    v = kind == 0   ? -1 - static_cast<int>(rng() % 5)
        : kind == 1 ? static_cast<int>(slots_total + rng() % 100)
        : kind == 2 ? static_cast<int>(rng() % 8)
        : kind == 3 ? std::numeric_limits<std::int32_t>::min()
                    : static_cast<int>(rng() % slots_total);
  }
  return s;
}

}  // namespace

TEST_CASE("writer append: invalid slots skipped, lowest duplicate row wins, one-launch and claim paths", "[gpu][writer]") {
  const int page = 64;
  const std::int64_t pages = 80, total = pages * page;
  std::vector<std::uint8_t> packed(pages * page * kNvfp4TokenBytes, 0);
  const auto base = random_rows(total, 7, -3, 3);
  for (std::int64_t t = 0; t < total; ++t) kt::nvfp4_write_token(packed.data(), page * kNvfp4TokenBytes, page, t, &base[t * 512], device_reciprocals());
  const std::vector<std::uint8_t> poisoned(packed.size(), kPoison);  // never written: garbage padding

  for (const std::int64_t n : {1, 300, 1024, 1025, 5000}) {
    const auto rows = random_rows(n, 100 + static_cast<std::uint32_t>(n), -6, 6);
    const auto slots = messy_slots(n, total, static_cast<std::uint32_t>(n));
    INFO("N " << n);
    append_and_compare(rows, slots, packed, page, pages, "HND");
    append_and_compare(rows, slots, poisoned, page, pages, "compact");
  }
  SECTION("one slot for every row") {
    for (const std::int64_t n : {700, 3000}) {
      INFO("N " << n);
      append_and_compare(random_rows(n, 5, -3, 3), std::vector<std::int32_t>(n, 77), poisoned, page, pages, "NHD");
    }
  }
  SECTION("padding words naming rows of the batch: stale claims must lose") {
    // Each target slot's padding names a row of this batch that targets another slot, or a higher
    // row that targets the same slot.
    const std::int64_t n = 4000;
    std::vector<std::int32_t> slots(n);
    for (std::int64_t i = 0; i < n; ++i) slots[i] = static_cast<std::int32_t>((i * 7919) % (total / 2));
    std::vector<std::uint8_t> stale(packed);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t s = slots[i];
      const std::uint32_t fake = static_cast<std::uint32_t>(i % 2 ? (i + 1) % n : n - 1 - i);
      std::memcpy(&stale[(s / page) * page * kNvfp4TokenBytes + page * 352 + (s % page) * 32 + 28], &fake, 4);
    }
    append_and_compare(random_rows(n, 9, -3, 3), slots, stale, page, pages, "compact");
  }
}

TEST_CASE("writer append: large duplicate-heavy batches over several waves of blocks", "[gpu][writer]") {
  // 70k rows: 274 claim blocks and 4375 write blocks, more than an H200 holds at once.
  const int page = 128;
  const std::int64_t pages = 96, total = pages * page;
  const std::vector<std::uint8_t> poisoned(total * kNvfp4TokenBytes, kPoison);
  const std::int64_t n = 70000;
  const auto rows = random_rows(n, 21, -8, 8);
  SECTION("about 6 rows a slot, invalid slots, garbage padding") {
    append_and_compare(rows, messy_slots(n, total, 31), poisoned, page, pages, "compact");
  }
  SECTION("runs of one slot across warps and blocks, then every row to one slot") {
    std::vector<std::int32_t> runs(n);
    for (std::int64_t i = 0; i < n; ++i) runs[i] = static_cast<std::int32_t>((i / 37 * 7919) % total);
    append_and_compare(rows, runs, poisoned, page, pages, "NHD");
    append_and_compare(rows, std::vector<std::int32_t>(n, static_cast<std::int32_t>(total - 1)), poisoned, page, pages, "HND");
  }
}

// Small enough for compute-sanitizer (memcheck, racecheck): every writer kernel once.
TEST_CASE("writer: sanitizer subset", "[gpu][writer][sanitizer]") {
  const int page = 32;
  const std::int64_t pages = 100, total = pages * page;
  CHECK(pack_and_compare(random_rows(2 * page, 3, -3, 3), page, "compact", 0) == static_cast<std::size_t>(2 * page * kNvfp4TokenBytes));
  const std::vector<std::uint8_t> poisoned(total * kNvfp4TokenBytes, kPoison);
  for (const std::int64_t n : {300, 2000}) {  // one launch; claim + write
    append_and_compare(random_rows(n, 50 + static_cast<std::uint32_t>(n), -3, 3), messy_slots(n, total, 60 + static_cast<std::uint32_t>(n)), poisoned,
                       page, pages, "compact");
  }
}

TEST_CASE("writer append captured in a CUDA graph and replayed with new rows equals eager", "[gpu][writer]") {
  const kiln::Driver& d = kiln::Driver::get();
  const int page = 32;
  const std::int64_t pages = 200;
  for (const std::int64_t n : {40, 2500}) {  // one launch; claim + write (programmatic dependent)
    DeviceBuffer cache(pages * page * kNvfp4TokenBytes), src(n * 512 * 2), map(n * 4);
    std::vector<std::int32_t> slots(n);
    for (std::int64_t i = 0; i < n; ++i) slots[i] = static_cast<std::int32_t>((i * 37) % 1000);  // duplicates when n > 1000
    map.upload(slots);
    cache.fill(0);
    const auto view_rows = TensorView::contiguous(src.get(), DType::kBf16, {n, 512});
    const auto view_map = TensorView::contiguous(map.get(), DType::kI32, {n});
    const auto view_cache = cache_view(cache.get(), "compact", pages, page, page * kNvfp4TokenBytes);

    const kt::Stream owned;
    const CUstream stream = owned.get();
    kiln::nvfp4::warm({kiln::nvfp4::WriterOp::kAppend, page}, {0});  // warm before capture
    kt::CapturedGraph graph(stream, [&] { kiln::nvfp4::append(view_rows, view_map, view_cache, stream); });
    graph.instantiate();

    for (std::uint32_t round = 0; round < 3; ++round) {
      INFO("N " << n << " round " << round);
      const auto rows = random_rows(n, 100 + round, -4, 4);
      src.upload(rows);  // new values at the same address
      graph.launch(stream);
      d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      const auto replayed = cache.download<std::uint8_t>(cache.bytes());
      kiln::nvfp4::append(view_rows, view_map, view_cache, stream);  // eager, same values
      d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      CHECK(cache.download<std::uint8_t>(cache.bytes()) == replayed);
      std::vector<std::uint8_t> want(cache.bytes(), 0);
      std::vector<bool> taken(pages * page, false);
      for (std::int64_t i = 0; i < n; ++i) {
        if (taken[slots[i]]) continue;
        taken[slots[i]] = true;
        kt::nvfp4_write_token(want.data(), page * kNvfp4TokenBytes, page, slots[i], &rows[i * 512], device_reciprocals());
      }
      CHECK(replayed == want);
      cache.fill(0);
    }
  }
}

TEST_CASE("a launch during capture whose key is not warm fails naming the key and compiles nothing", "[gpu][writer]") {
  const int page = 16;  // never warmed in this process
  DeviceBuffer cache(2 * page * kNvfp4TokenBytes), src(512 * 2), map(4);
  const kt::Stream stream;
  const auto before = kiln::KernelService::global().counters();
  try {
    // The launch throws inside the capture; CapturedGraph ends the capture before passing it on.
    const kt::CapturedGraph graph(stream.get(), [&] {
      kiln::nvfp4::append(TensorView::contiguous(src.get(), DType::kBf16, {1, 512}), TensorView::contiguous(map.get(), DType::kI32, {1}),
                          cache_view(cache.get(), "compact", 2, page, page * kNvfp4TokenBytes), stream.get());
    });
    FAIL("launch during capture of a cold key did not throw");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kNotWarm);
    CHECK_THAT(e.details().key, Catch::Contains("nvfp4_writer:sm_") && Catch::Contains("page_size=16"));
  }
  const auto after = kiln::KernelService::global().counters();
  CHECK(after.compiles == before.compiles);
  CHECK(after.loads == before.loads);
}

TEST_CASE("threads warm different keys while another captures and replays a graph", "[gpu][writer]") {
  const kiln::Driver& d = kiln::Driver::get();
  const int page = 64;
  const std::int64_t pages = 2, n = 16;
  DeviceBuffer cache(pages * page * kNvfp4TokenBytes), src(n * 512 * 2), map(n * 4);
  std::vector<std::int32_t> slots(n);
  for (std::int64_t i = 0; i < n; ++i) slots[i] = static_cast<std::int32_t>(i * 3);
  map.upload(slots);
  const auto rows = random_rows(n, 42, -3, 3);
  src.upload(rows);
  kiln::nvfp4::warm({kiln::nvfp4::WriterOp::kAppend, page}, {0});
  const kt::Stream owned;
  const CUstream stream = owned.get();
  // Thread-local mode: the warming threads below may use the driver while this thread captures.
  kt::CapturedGraph graph(
      stream,
      [&] {
        kiln::nvfp4::append(TensorView::contiguous(src.get(), DType::kBf16, {n, 512}), TensorView::contiguous(map.get(), DType::kI32, {n}),
                            cache_view(cache.get(), "compact", pages, page, page * kNvfp4TokenBytes), stream);
      },
      CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  graph.instantiate();

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
  for (int i = 0; i < 50; ++i) graph.launch(stream);
  d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (auto& t : warmers) t.join();
  CHECK(failures == 0);
  std::vector<std::uint8_t> want(cache.bytes(), 0);
  cache.fill(0);
  graph.launch(stream);
  d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (std::int64_t i = 0; i < n; ++i) kt::nvfp4_write_token(want.data(), page * kNvfp4TokenBytes, page, slots[i], &rows[i * 512], device_reciprocals());
  CHECK(cache.download<std::uint8_t>(cache.bytes()) == want);
}
