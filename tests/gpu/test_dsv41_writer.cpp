// DeepSeek-V4.1 cache writers on the GPU: every byte equal to the CPU reference
// (tests/support/dsv41_reference_encode), which encodes by nearest-value search and shares no code
// with the kernels. Both formats, bf16 and fp16 rows, every accepted cache view.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/dsv41_writer/writer.h"
#include "kiln/runtime/kernel_service.h"
#include "tests/support/device_buffer.h"
#include "tests/support/dsv41_reference_encode.h"
#include "tests/support/graph_capture.h"

namespace {

namespace kt = kiln::testing;
namespace dw = kiln::dsv41;
using kiln::DType;
using kiln::TensorView;
using kt::DeviceBuffer;
using kt::Dsv41Format;

constexpr std::uint8_t kPoison = 0xab;

// Rows of 512 values as raw 16-bit patterns of one dtype.
struct Rows {
  DType dtype = DType::kBf16;
  std::vector<std::uint16_t> bits;
  std::int64_t count() const { return static_cast<std::int64_t>(bits.size() / 512); }
  float value(std::size_t i) const { return dtype == DType::kBf16 ? kt::dsv41_bf16_value(bits[i]) : kt::dsv41_fp16_value(bits[i]); }
  std::vector<float> row(std::int64_t r) const {
    std::vector<float> x(512);
    for (int d = 0; d < 512; ++d) x[d] = value(static_cast<std::size_t>(r * 512 + d));
    return x;
  }
  std::uint16_t encode(float f) const { return dtype == DType::kBf16 ? kt::dsv41_bf16_bits(f) : kt::dsv41_fp16_bits(f); }
};

dw::CacheFormat api_format(Dsv41Format f) { return f == Dsv41Format::kFp8 ? dw::CacheFormat::kFp8 : dw::CacheFormat::kFp4; }
const char* name_of(Dsv41Format f) { return f == Dsv41Format::kFp8 ? "fp8" : "fp4"; }
int group_of(Dsv41Format f) { return f == Dsv41Format::kFp8 ? 32 : 16; }

// "2D" [P, page * rec], "3D" [P, page, rec], "HND" [P, 1, page, rec], "NHD" [P, page, 1, rec].
TensorView cache_view(void* data, const std::string& layout, std::int64_t pages, std::int64_t page, std::int64_t page_stride, std::int64_t rec) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kU8;
  if (layout == "2D") {
    v.rank = 2;
    v.shape = {pages, page * rec};
    v.strides = {page_stride, 1};
  } else if (layout == "3D") {
    v.rank = 3;
    v.shape = {pages, page, rec};
    v.strides = {page_stride, rec, 1};
  } else if (layout == "HND") {
    v.rank = 4;
    v.shape = {pages, 1, page, rec};
    v.strides = {page_stride, page * rec, rec, 1};
  } else {
    v.rank = 4;
    v.shape = {pages, page, 1, rec};
    v.strides = {page_stride, rec, rec, 1};
  }
  return v;
}

// Rows from a list of groups (the last row padded with zero groups).
Rows rows_from_groups(DType dtype, int group, const std::vector<std::vector<std::uint16_t>>& groups) {
  Rows r;
  r.dtype = dtype;
  const int per_row = 512 / group;
  const std::size_t n = (groups.size() + per_row - 1) / per_row;
  r.bits.assign(n * 512, 0);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::copy(groups[g].begin(), groups[g].end(), &r.bits[(g / per_row) * 512 + (g % per_row) * group]);
  }
  return r;
}

Rows random_rows(DType dtype, std::int64_t n, std::uint32_t seed, int exp_lo, int exp_hi) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Rows r;
  r.dtype = dtype;
  r.bits.resize(static_cast<std::size_t>(n * 512));
  for (std::int64_t i = 0; i < n; ++i) {
    for (int g = 0; g < 32; ++g) {
      const float scale = std::exp2(static_cast<float>(exp_lo + static_cast<int>(rng() % (exp_hi - exp_lo + 1))));
      for (int j = 0; j < 16; ++j) r.bits[i * 512 + g * 16 + j] = r.encode(normal(rng) * scale);
    }
  }
  return r;
}

// The reference image of `initial` after writing row i of `rows` to slot slots[i] (skipping
// invalid slots and any slot an earlier row took).
template <class Slot>
std::vector<std::uint8_t> reference(Dsv41Format f, const Rows& rows, const std::vector<Slot>& slots, std::vector<std::uint8_t> image,
                                    std::int64_t page, std::int64_t page_stride, std::int64_t total) {
  std::vector<bool> taken(static_cast<std::size_t>(total), false);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const long long s = static_cast<long long>(slots[i]);
    if (s < 0 || s >= total || taken[s]) continue;
    taken[s] = true;
    kt::dsv41_write_slot(f, image.data(), page_stride, static_cast<int>(page), s, rows.row(static_cast<std::int64_t>(i)).data());
  }
  return image;
}

bool same_bytes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  REQUIRE(got.size() == want.size());
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  if (diff.first == got.end()) return true;
  const std::size_t at = static_cast<std::size_t>(diff.first - got.begin());
  std::size_t count = 0;
  for (std::size_t i = 0; i < got.size(); ++i) count += got[i] != want[i];
  UNSCOPED_INFO("byte " << at << ": got 0x" << std::hex << int(*diff.first) << ", want 0x" << int(*diff.second) << std::dec << " (" << count
                        << " bytes differ)");
  return false;
}

// Packs whole pages of `rows` (padded with zero rows) into a cache filled with kPoison; the padding
// of each page (extra_stride bytes) must stay kPoison.
bool pack_matches(Dsv41Format f, const Rows& rows_in, std::int64_t page, const std::string& layout, std::int64_t extra_stride) {
  Rows rows = rows_in;
  const std::int64_t pages = (rows.count() + page - 1) / page;
  rows.bits.resize(static_cast<std::size_t>(pages * page * 512), 0);
  const std::int64_t rec = kt::dsv41_record_bytes(f), page_stride = page * rec + extra_stride;
  DeviceBuffer src(rows.bits.size() * 2), cache(static_cast<std::size_t>(pages * page_stride));
  src.upload(rows.bits);
  cache.fill(kPoison);
  const TensorView latent = layout == "NHD" ? TensorView::contiguous(src.get(), rows.dtype, {pages, page, 1, 512})
                            : layout == "HND" ? TensorView::contiguous(src.get(), rows.dtype, {pages, 1, page, 512})
                                              : TensorView::contiguous(src.get(), rows.dtype, {pages, page, 512});
  dw::pack(api_format(f), latent, cache_view(cache.get(), layout, pages, page, page_stride, rec), nullptr);
  std::vector<std::int64_t> identity(static_cast<std::size_t>(pages * page));
  std::iota(identity.begin(), identity.end(), 0);
  const auto want = reference(f, rows, identity, std::vector<std::uint8_t>(cache.bytes(), kPoison), page, page_stride, pages * page);
  return same_bytes(cache.download<std::uint8_t>(cache.bytes()), want);
}

// One group per positive value of the dtype (subnormals, normals, Inf, NaN patterns): element 0 is
// +-v, the others v * k / group with alternating signs, so that v sets the group's scale.
std::vector<std::vector<std::uint16_t>> every_amax(const Rows& like, int group) {
  std::vector<std::vector<std::uint16_t>> groups;
  for (std::uint32_t b = 0; b <= 0x7fff; ++b) {
    std::vector<std::uint16_t> g(group);
    Rows one = like;
    one.bits = {static_cast<std::uint16_t>(b)};
    const float v = one.value(0);
    g[0] = static_cast<std::uint16_t>(b | ((b & 1) << 15));
    for (int k = 1; k < group; ++k) g[k] = std::isfinite(v) ? like.encode((k % 2 ? -1.0f : 1.0f) * v * static_cast<float>(k) / group) : like.encode(k * 0.5f);
    groups.push_back(g);
  }
  return groups;
}

}  // namespace

TEST_CASE("dsv41 pack: every bf16 and fp16 amax gives the reference bytes", "[gpu][dsv41_writer]") {
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    for (const DType dtype : {DType::kBf16, DType::kF16}) {
      INFO(name_of(f) << (dtype == DType::kBf16 ? " bf16" : " fp16"));
      Rows like;
      like.dtype = dtype;
      CHECK(pack_matches(f, rows_from_groups(dtype, group_of(f), every_amax(like, group_of(f))), 64, "3D", 0));
    }
  }
}

TEST_CASE("dsv41 pack: every bf16 magnitude under every scale (E4M3 and E2M1 ties, subnormal codes)", "[gpu][dsv41_writer]") {
  SECTION("fp8: amax = 448 * 2^k for every k up to 119, then every bf16 magnitude within 2^-19 of it, both signs") {
    std::vector<std::vector<std::uint16_t>> groups;
    for (int k = -13; k <= 119; ++k) {  // 448 * 2^120 is past the largest bf16
      const std::uint16_t amax = kt::dsv41_bf16_bits(std::ldexp(448.0f, k));
      const std::uint16_t low = kt::dsv41_bf16_bits(std::ldexp(448.0f, k - 19));
      std::vector<std::uint16_t> g = {amax};
      for (std::uint32_t m = low; m <= amax; ++m) {
        for (const std::uint32_t sign : {0u, 0x8000u}) {
          g.push_back(static_cast<std::uint16_t>(m | sign));
          if (g.size() == 32) {
            groups.push_back(g);
            g = {static_cast<std::uint16_t>(amax | (groups.size() % 2 ? 0x8000 : 0))};
          }
        }
      }
      g.resize(32, 0);
      groups.push_back(g);
    }
    CHECK(pack_matches(Dsv41Format::kFp8, rows_from_groups(DType::kBf16, 32, groups), 64, "HND", 0));
  }
  SECTION("fp4: for every scale byte, the largest amax giving it, then every bf16 magnitude up to it") {
    std::vector<std::vector<std::uint16_t>> groups;
    std::uint16_t amax = 0;
    const auto scale_of = [](std::uint16_t a) {
      std::vector<float> x(16, 0.0f);
      x[0] = kt::dsv41_bf16_value(a);
      std::vector<std::uint8_t> packed(8);
      return kt::dsv41_fp4_group(x.data(), packed.data());
    };
    for (int s = 1; s <= 126; ++s) {
      while (amax < 0x7f7f && scale_of(static_cast<std::uint16_t>(amax + 1)) <= s) ++amax;
      REQUIRE(scale_of(amax) == s);
      std::vector<std::uint16_t> g = {amax};
      for (std::uint32_t m = 0; m <= amax; m += (s < 110 ? 1 : 5)) {
        for (const std::uint32_t sign : {0u, 0x8000u}) {
          g.push_back(static_cast<std::uint16_t>(m | sign));
          if (g.size() == 16) {
            groups.push_back(g);
            g = {static_cast<std::uint16_t>(amax | (groups.size() % 2 ? 0x8000 : 0))};
          }
        }
      }
      g.resize(16, 0);
      groups.push_back(g);
    }
    CHECK(pack_matches(Dsv41Format::kFp4, rows_from_groups(DType::kBf16, 16, groups), 64, "NHD", 0));
  }
}

TEST_CASE("dsv41 pack: edge groups (x1000, 1e-5, NaN and Inf poisoning only their group, zeros, -0)", "[gpu][dsv41_writer]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    for (const DType dtype : {DType::kBf16, DType::kF16}) {
      INFO(name_of(f) << (dtype == DType::kBf16 ? " bf16" : " fp16"));
      Rows r = random_rows(dtype, 8, 5, -3, 1);  // background: every other group stays ordinary
      const int group = group_of(f);
      const auto set_group = [&](int row, int g, const std::vector<float>& head, float rest) {
        for (int i = 0; i < group; ++i) r.bits[row * 512 + g * group + i] = r.encode(i < static_cast<int>(head.size()) ? head[i] : rest);
      };
      const auto scale_group = [&](int row, int g, float factor) {
        for (int i = 0; i < group; ++i) r.bits[row * 512 + g * group + i] = r.encode(r.value(row * 512 + g * group + i) * factor);
      };
      scale_group(0, 3, dtype == DType::kBf16 ? 1000.0f : 60.0f);  // fp16 stops at 65504
      scale_group(0, 4, 1e-5f);
      set_group(1, 0, {nan}, 1.0f);
      set_group(1, 2, {1.0f, -nan, 2.0f}, -0.5f);
      set_group(2, 5, {inf}, -3.0f);
      set_group(2, 6, {-inf, 0.0f, -0.0f}, 7.0f);
      set_group(2, 7, {inf, nan}, 1.0f);
      set_group(3, 1, {}, 0.0f);
      set_group(3, 2, {-0.0f, 0.0f}, -0.0f);
      set_group(3, 3, {6.0f, 0.25f, -0.75f, 1.25f, -1.75f, 2.5f, -3.5f, 5.0f}, 0.0f);  // E2M1 ties at scale 1
      set_group(4, 0, {448.0f, -448.0f, 0.01f, -0.003f}, 1e-3f);
      set_group(4, 1, {60000.0f}, -60000.0f);
      set_group(4, 2, {1e-30f}, -1e-30f);
      for (const std::int64_t page : {64, 61}) CHECK(pack_matches(f, r, page, page == 64 ? "3D" : "2D", 0));
    }
  }
}

TEST_CASE("dsv41 pack: page sizes, every view, padded page strides (padding untouched)", "[gpu][dsv41_writer]") {
  const std::pair<int, int> ranges[] = {{-40, -30}, {-12, -4}, {-3, 3}, {4, 12}, {30, 40}, {-60, 60}};
  int seed = 10;
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    for (const std::int64_t page : {1, 2, 53, 61, 64, 128}) {
      for (const std::string layout : {"2D", "3D", "HND", "NHD"}) {
        for (const std::int64_t extra : {0, 128}) {
          const DType dtype = seed % 2 ? DType::kF16 : DType::kBf16;
          auto [lo, hi] = ranges[seed % 6];
          if (dtype == DType::kF16) lo = std::max(lo, -14), hi = std::min(hi, 12);
          INFO(name_of(f) << " page " << page << " " << layout << " +" << extra << (dtype == DType::kF16 ? " fp16" : " bf16"));
          CHECK(pack_matches(f, random_rows(dtype, 3 * page + 1, seed++, lo, hi), page, layout, extra));
        }
      }
    }
  }
}

namespace {

// Appends rows through slots (int32 or int64) into a cache whose bytes start as `initial`.
template <class Slot>
std::vector<std::uint8_t> run_append(Dsv41Format f, const Rows& rows, const std::vector<Slot>& slots, const std::vector<std::uint8_t>& initial,
                                     std::int64_t pages, std::int64_t page, std::int64_t page_stride, const std::string& layout) {
  const std::int64_t n = static_cast<std::int64_t>(slots.size());
  DeviceBuffer cache(initial.size()), src(rows.bits.size() * 2), map(slots.size() * sizeof(Slot));
  cache.upload(initial);
  src.upload(rows.bits);
  map.upload(slots);
  dw::append(api_format(f), TensorView::contiguous(src.get(), rows.dtype, {n, 512}),
             TensorView::contiguous(map.get(), sizeof(Slot) == 8 ? DType::kI64 : DType::kI32, {n}),
             cache_view(cache.get(), layout, pages, page, page_stride, kt::dsv41_record_bytes(f)), nullptr);
  return cache.download<std::uint8_t>(initial.size());
}

template <class Slot>
std::vector<Slot> messy_slots(std::int64_t n, std::int64_t total, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Slot> s(static_cast<std::size_t>(n));
  for (auto& v : s) {
    const int kind = static_cast<int>(rng() % 10);
    v = kind == 0   ? static_cast<Slot>(-1 - static_cast<int>(rng() % 5))
        : kind == 1 ? static_cast<Slot>(total + rng() % 100)
        : kind == 2 ? static_cast<Slot>(rng() % 8)
        : kind == 3 ? std::numeric_limits<Slot>::min()
        : kind == 4 ? (sizeof(Slot) == 8 ? static_cast<Slot>((1ll << 32) + rng() % 8) : static_cast<Slot>(rng() % total))  // wraps in int32
                    : static_cast<Slot>(rng() % total);
  }
  return s;
}

}  // namespace

TEST_CASE("dsv41 append: a shuffled permutation of every slot reproduces pack (int32 and int64 maps)", "[gpu][dsv41_writer]") {
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    for (const std::int64_t page : {64, 61}) {
      for (const std::int64_t pages : {8, 40}) {  // 512 / 488 rows: one launch; 2560 / 2440: claim + write
        const std::int64_t total = pages * page, rec = kt::dsv41_record_bytes(f), stride = page * rec + 16;
        const Rows packed_rows = random_rows(page == 64 ? DType::kBf16 : DType::kF16, total, static_cast<std::uint32_t>(total), -6, 6);
        std::vector<std::int64_t> perm(static_cast<std::size_t>(total));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<std::uint32_t>(page)));
        Rows shuffled = packed_rows;
        for (std::int64_t i = 0; i < total; ++i) std::copy_n(&packed_rows.bits[perm[i] * 512], 512, &shuffled.bits[i * 512]);
        const std::vector<std::uint8_t> poisoned(static_cast<std::size_t>(pages * stride), kPoison);
        std::vector<std::int64_t> identity(static_cast<std::size_t>(total));
        std::iota(identity.begin(), identity.end(), 0);
        const auto want = reference(f, packed_rows, identity, poisoned, page, stride, total);
        std::vector<std::int32_t> perm32(perm.begin(), perm.end());
        INFO(name_of(f) << " page " << page << " pages " << pages);
        CHECK(same_bytes(run_append(f, shuffled, perm, poisoned, pages, page, stride, "NHD"), want));
        CHECK(same_bytes(run_append(f, shuffled, perm32, poisoned, pages, page, stride, "2D"), want));
        // And pack itself gives the same bytes.
        DeviceBuffer src(packed_rows.bits.size() * 2), cache(poisoned.size());
        src.upload(packed_rows.bits);
        cache.upload(poisoned);
        dw::pack(api_format(f), TensorView::contiguous(src.get(), packed_rows.dtype, {pages, page, 512}),
                 cache_view(cache.get(), "HND", pages, page, stride, rec), nullptr);
        CHECK(same_bytes(cache.download<std::uint8_t>(cache.bytes()), want));
      }
    }
  }
}

TEST_CASE("dsv41 append: invalid slots skipped, the lowest duplicate row wins, other bytes untouched", "[gpu][dsv41_writer]") {
  const std::int64_t page = 64, pages = 80, total = pages * page;
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    const std::int64_t rec = kt::dsv41_record_bytes(f), stride = page * rec;
    std::mt19937 rng(3);
    std::vector<std::uint8_t> garbage(static_cast<std::size_t>(pages * stride));
    for (auto& b : garbage) b = static_cast<std::uint8_t>(rng());
    for (const std::int64_t n : {1, 300, 1024, 1025, 5000}) {
      INFO(name_of(f) << " N " << n);
      const Rows rows = random_rows(n % 2 ? DType::kBf16 : DType::kF16, n, 100 + static_cast<std::uint32_t>(n), -6, 6);
      const auto s32 = messy_slots<std::int32_t>(n, total, static_cast<std::uint32_t>(n));
      const auto s64 = messy_slots<std::int64_t>(n, total, static_cast<std::uint32_t>(n));
      CHECK(same_bytes(run_append(f, rows, s32, garbage, pages, page, stride, "3D"), reference(f, rows, s32, garbage, page, stride, total)));
      CHECK(same_bytes(run_append(f, rows, s64, garbage, pages, page, stride, "HND"), reference(f, rows, s64, garbage, page, stride, total)));
    }
    SECTION(std::string("every row to one slot, ") + name_of(f)) {
      for (const std::int64_t n : {700, 3000}) {
        const Rows rows = random_rows(DType::kBf16, n, 5, -3, 3);
        const std::vector<std::int32_t> one(static_cast<std::size_t>(n), 77);
        CHECK(same_bytes(run_append(f, rows, one, garbage, pages, page, stride, "NHD"), reference(f, rows, one, garbage, page, stride, total)));
      }
    }
    SECTION(std::string("stale claim words naming rows of the batch must lose, ") + name_of(f)) {
      // Each target slot's first 8 scale bytes look like a claim ((row + 1) << 8) of a row that
      // targets another slot, or of a higher row that targets this one.
      const std::int64_t n = 4000;
      std::vector<std::int32_t> slots(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) slots[i] = static_cast<std::int32_t>((i * 7919) % (total / 2));
      std::vector<std::uint8_t> stale(garbage);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t s = slots[i];
        const std::uint64_t fake_row = static_cast<std::uint64_t>(i % 2 ? (i + 1) % n : n - 1 - i);
        const std::uint64_t word = (fake_row + 1) << 8;
        std::memcpy(&stale[(s / page) * stride + page * (rec == 528 ? 512 : 256) + (s % page) * (rec == 528 ? 16 : 32)], &word, 8);
      }
      const Rows rows = random_rows(DType::kBf16, n, 9, -3, 3);
      CHECK(same_bytes(run_append(f, rows, slots, stale, pages, page, stride, "3D"), reference(f, rows, slots, stale, page, stride, total)));
    }
  }
}

// Small enough for compute-sanitizer (memcheck, racecheck): every writer kernel of both formats.
TEST_CASE("dsv41 writers: sanitizer subset", "[gpu][dsv41_writer][sanitizer]") {
  const std::int64_t page = 61, pages = 60, total = pages * page;
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    CHECK(pack_matches(f, random_rows(DType::kBf16, 2 * page, 3, -3, 3), page, "HND", 32));
    const std::int64_t stride = page * kt::dsv41_record_bytes(f);
    const std::vector<std::uint8_t> poisoned(static_cast<std::size_t>(pages * stride), kPoison);
    for (const std::int64_t n : {300, 2000}) {  // one launch; claim + write
      const Rows rows = random_rows(DType::kF16, n, 50 + static_cast<std::uint32_t>(n), -3, 3);
      const auto slots = messy_slots<std::int64_t>(n, total, 60 + static_cast<std::uint32_t>(n));
      CHECK(same_bytes(run_append(f, rows, slots, poisoned, pages, page, stride, "3D"), reference(f, rows, slots, poisoned, page, stride, total)));
    }
  }
}

TEST_CASE("dsv41 append captured in a CUDA graph and replayed with new rows equals eager and the reference", "[gpu][dsv41_writer]") {
  const kiln::Driver& d = kiln::Driver::get();
  const std::int64_t page = 32, pages = 200;
  for (const Dsv41Format f : {Dsv41Format::kFp8, Dsv41Format::kFp4}) {
    const std::int64_t rec = kt::dsv41_record_bytes(f), stride = page * rec;
    for (const std::int64_t n : {40, 2500}) {  // one launch; claim + write (programmatic dependent)
      INFO(name_of(f) << " N " << n);
      DeviceBuffer cache(static_cast<std::size_t>(pages * stride)), src(static_cast<std::size_t>(n * 512 * 2)), map(static_cast<std::size_t>(n * 8));
      std::vector<std::int64_t> slots(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) slots[i] = (i * 37) % 1000;  // duplicates when n > 1000
      map.upload(slots);
      cache.fill(0);
      const auto view_rows = TensorView::contiguous(src.get(), DType::kBf16, {n, 512});
      const auto view_map = TensorView::contiguous(map.get(), DType::kI64, {n});
      const auto view_cache = cache_view(cache.get(), "HND", pages, page, stride, rec);
      const kt::Stream owned;
      const CUstream stream = owned.get();
      dw::warm({api_format(f), dw::WriterOp::kAppend}, {0});  // before capture
      kt::CapturedGraph graph(stream, [&] { dw::append(api_format(f), view_rows, view_map, view_cache, stream); });
      graph.instantiate();
      for (std::uint32_t round = 0; round < 3; ++round) {
        const Rows rows = random_rows(DType::kBf16, n, 100 + round, -4, 4);
        src.upload(rows.bits);
        graph.launch(stream);
        d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
        const auto replayed = cache.download<std::uint8_t>(cache.bytes());
        dw::append(api_format(f), view_rows, view_map, view_cache, stream);  // eager, same values
        d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
        CHECK(cache.download<std::uint8_t>(cache.bytes()) == replayed);
        CHECK(same_bytes(replayed, reference(f, rows, slots, std::vector<std::uint8_t>(cache.bytes(), 0), page, stride, pages * page)));
        cache.fill(0);
      }
    }
  }
}
