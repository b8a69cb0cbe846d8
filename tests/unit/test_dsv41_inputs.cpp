// The DeepSeek-V4.1 GPU suite's inputs (tests/support/dsv41_inputs) are what that suite claims: for
// every case of the matrix, NaN in every cache byte no valid candidate names (slot 0 and page padding
// included), finite records of the stated range in every row one does, masked and out-of-length
// slots naming only slot 0 or the far index, the empty rows and length clamps the case asks for;
// and the parallel oracle equals the reference run on the whole problem at once. The GPU suite
// cannot run in CI, so its harness is checked here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "tests/support/dsv41_inputs.h"
#include "tests/support/dsv41_matrix.h"
#include "tests/support/dsv41_reference.h"

namespace dm = kiln::testing::dsv41_matrix;
namespace kt = kiln::testing;

namespace {

bool all_nan_bytes(const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != dm::kNanByte) return false;
  }
  return true;
}

// Checks one pool against the set of slots the case's valid candidates name.
void check_pool(const dm::PoolImage& pool, const std::set<std::int32_t>& live, float max_abs) {
  const kt::Dsv41Geometry g = kt::dsv41_geometry(pool.format);
  CHECK(live.count(0) == 0);
  CHECK(pool.bytes.size() == static_cast<std::size_t>(pool.pages * pool.page_stride));
  const long long used = static_cast<long long>(pool.page_size) * g.record_bytes;
  for (long long pg = 0; pg < pool.pages; ++pg) {
    CHECK(all_nan_bytes(&pool.bytes[pg * pool.page_stride + used], static_cast<std::size_t>(pool.page_stride - used)));
  }
  std::vector<float> x(kt::kDsv41Dims);
  std::size_t bad_live = 0, bad_dead = 0;
  for (long long s = 0; s < pool.slots(); ++s) {
    const std::uint8_t* data = &pool.bytes[kt::dsv41_data_offset(pool.format, pool.page_stride, pool.page_size, s)];
    const std::uint8_t* scales = &pool.bytes[kt::dsv41_scale_offset(pool.format, pool.page_stride, pool.page_size, s)];
    if (live.count(static_cast<std::int32_t>(s)) == 0) {
      bad_dead += !(all_nan_bytes(data, g.data_bytes) && all_nan_bytes(scales, g.scale_bytes));
      continue;
    }
    kt::dsv41_dequantize_slot(pool.cache(), s, x.data());
    for (const float v : x) bad_live += !(std::fabs(v) <= max_abs);  // NaN fails too
  }
  CHECK(bad_live == 0);
  CHECK(bad_dead == 0);
}

}  // namespace

TEST_CASE("dsv41 inputs: NaN wherever the decode must not read, finite records wherever it must", "[unit]") {
  const auto matrix = dm::conformance_matrix();
  for (std::size_t ci = 0; ci < matrix.size(); ++ci) {
    const dm::Dsv41Case& c = matrix[ci];
    INFO(c.label());
    const int rounds = ci % 5 == 0 ? 3 : 1;  // the graph test's rewrites on some
    const dm::HostCase h(c, 1234 + ci, rounds);
    REQUIRE(h.rounds.size() == static_cast<std::size_t>(rounds));
    std::set<std::int32_t> main_live, extra_live;
    std::size_t active = 0, negative = 0;
    for (const dm::Inputs& in : h.rounds) {
      REQUIRE(in.q.size() == static_cast<std::size_t>(c.tokens) * c.heads * 512);
      REQUIRE(in.len.size() == (c.main_lengths_given() ? static_cast<std::size_t>(c.tokens) : 0u));
      REQUIRE(in.xlen.size() == (c.extra_lengths_given() ? static_cast<std::size_t>(c.tokens) : 0u));
      for (const bool is_extra : {false, true}) {
        if (is_extra && !c.has_extra) continue;
        const kt::Dsv41Section sec = h.section(in, is_extra);
        const std::vector<int>& fixed = is_extra ? c.extra_lengths : c.main_lengths;
        for (int t = 0; t < c.tokens; ++t) {
          INFO((is_extra ? "extra" : "main") << " section, token " << t);
          const int len = sec.lengths ? std::clamp(int(sec.lengths[t]), 0, sec.topk) : sec.topk;
          const std::int32_t* row = sec.indices + static_cast<long long>(t) * sec.row_stride;
          for (int j = len; j < sec.row_stride; ++j) CHECK((row[j] == 0 || row[j] == dm::kFarIndex));
          const bool has_role = static_cast<std::size_t>(t) < c.empty_rows.size();
          const dm::EmptyRow role = has_role ? c.empty_rows[t] : dm::EmptyRow::kMain;
          for (const std::int32_t s : kt::dsv41_valid_candidates(sec, t)) (is_extra ? extra_live : main_live).insert(s);
          if (has_role) {
            const bool emptied = role == dm::EmptyRow::kAllMasked || role == dm::EmptyRow::kBoth ||
                                 role == (is_extra ? dm::EmptyRow::kExtra : dm::EmptyRow::kMain);
            if (emptied) CHECK(kt::dsv41_valid_candidates(sec, t).empty());
            if (role == dm::EmptyRow::kAllMasked) {
              CHECK(len == sec.topk);
              for (int j = 0; j < len; ++j) CHECK(row[j] < 0);
            }
            continue;
          }
          if (sec.lengths && fixed.empty() && c.tokens > dm::kLengthNegativeToken) {
            if (t == dm::kLengthOverToken) CHECK(sec.lengths[t] > sec.topk);
            if (t == dm::kLengthNegativeToken) CHECK(sec.lengths[t] < 0);
          }
          if (!fixed.empty()) CHECK(sec.lengths[t] == fixed[t % fixed.size()]);
          for (int j = 0; j < len; ++j) {
            ++active;
            negative += row[j] < 0;
          }
        }
      }
    }
    check_pool(h.main, main_live, dm::kMainMaxAbs);
    if (c.has_extra) check_pool(h.extra, extra_live, dm::kExtraMaxAbs);
    if (active >= 1000) {  // the share of masked slots the case asks for, within sampling noise
      const double share = static_cast<double>(negative) / active, want = c.masked_percent / 100.0;
      CHECK(share > 0.6 * want);
      CHECK(share < 1.4 * want + 0.01);
    }
  }
}

TEST_CASE("dsv41 inputs: the parallel oracle equals the reference over the whole problem", "[unit]") {
  for (const bool sink : {false, true}) {
    dm::Dsv41Case c;
    c.tokens = 5;
    c.heads = 48;  // three 16-head blocks per token
    c.topk = 70;
    c.page = 53;
    c.has_extra = true;
    c.extra_topk = 65;
    c.extra_page = 2;
    c.sink = sink;
    c.lengths = dm::Lengths::kBoth;
    c.empty_rows = {dm::EmptyRow::kBoth, dm::EmptyRow::kAllMasked, dm::EmptyRow::kExtra};
    c.idx_pad = 8;
    c.lse_scale = 0.5;
    const dm::HostCase h(c, 77);
    const dm::Reference ref = dm::run_oracle(h, h.rounds[0], c.lse_scale);

    kt::Dsv41Problem p;
    p.tokens = c.tokens;
    p.heads = c.heads;
    p.q = h.rounds[0].q.data();
    p.main = h.section(h.rounds[0], false);
    p.extra = h.section(h.rounds[0], true);
    p.attn_sink = sink ? h.sink.data() : nullptr;
    p.sm_scale = h.sm_scale;
    p.lse_scale = c.lse_scale;
    std::vector<float> out(ref.out.size()), lse(ref.lse.size());
    kt::dsv41_reference(p, out.data(), lse.data());
    CHECK(std::memcmp(out.data(), ref.out.data(), out.size() * 4) == 0);
    CHECK(std::memcmp(lse.data(), ref.lse.data(), lse.size() * 4) == 0);

    CHECK(ref.empty[0]);
    CHECK(ref.empty[1]);
    for (int t = 0; t < c.tokens; ++t) {
      CHECK(ref.empty[t] == (kt::dsv41_valid_candidates(p.main, t).empty() && kt::dsv41_valid_candidates(p.extra, t).empty()));
      for (int hd = 0; hd < c.heads; ++hd) {
        const std::size_t row = static_cast<std::size_t>(t) * c.heads + hd;
        INFO("token " << t << " head " << hd);
        if (ref.empty[t]) {
          for (int d = 0; d < 512; ++d) CHECK(ref.out[row * 512 + d] == 0.0f);
          if (sink) CHECK(ref.lse[row] == Approx(h.sink[hd] * 1.4426950408889634 * 0.5));
          else CHECK(ref.lse[row] == -std::numeric_limits<float>::infinity());
        } else {
          CHECK(std::isfinite(ref.lse[row]));
          for (int d = 0; d < 512; ++d) CHECK(std::isfinite(ref.out[row * 512 + d]));
        }
      }
    }
  }
}
