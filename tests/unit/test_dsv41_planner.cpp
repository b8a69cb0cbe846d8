// Planners of the sparse DeepSeek-V4.1 decode against the contract (runtime/sparse_dsv41/README.md,
// "Chunks, splits, head tiles"): every reference point of FlashInfer's fitted plans and rule tests,
// the input checks with their upstream phrases, and the invariants upstream checks over its grid.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/sparse_dsv41/planner.h"

namespace {

namespace d = kiln::dsv41;
using kiln::dsv41::SplitPlan;

struct Point {
  int sms, tokens, heads, topk, extra;
  SplitPlan want;
  int head_tiles = 0;  // 0: plan_head_tiles's
  int max_splits = 16;
  bool unified = false;
  bool ragged = false;
};

SplitPlan plan(const Point& p) {
  const int tiles = p.head_tiles ? p.head_tiles : d::plan_head_tiles(p.tokens, p.heads, p.topk, p.extra, p.sms);
  return d::plan_splits(p.tokens, p.heads, p.topk, p.extra, p.sms, {p.max_splits, tiles, p.unified, p.ragged});
}

// The message of the kiln::Error `f` throws (kInvalidArgument), or a failed check.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
    return e.what();
  }
  FAIL("no error");
  return {};
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace

TEST_CASE("dsv41 num_chunks, heads, head tiles and scratch", "[unit]") {
  CHECK(d::num_chunks(128) == 2);
  CHECK(d::num_chunks(1) == 1);
  CHECK(d::num_chunks(130, 1) == 4);
  CHECK(d::num_chunks(128, 512) == 10);
  CHECK(d::num_chunks(0, 512) == 8);
  CHECK(d::num_chunks(512, 1024) == 24);
  CHECK(d::num_chunks(0, 0) == 0);
  CHECK(error_of([] { d::num_chunks(-1, 0); }).find("topk") != std::string::npos);

  CHECK(std::vector<int>(d::supported_heads().begin(), d::supported_heads().end()) ==
        std::vector<int>{8, 16, 32, 48, 64, 80, 96, 112, 128});
  CHECK(std::vector<int>(d::two_tile_heads().begin(), d::two_tile_heads().end()) ==
        std::vector<int>{32, 48, 64, 80, 96, 112, 128});
  for (int h : d::supported_heads()) {
    // T, topk and the SM count do not enter.
    const int want = h >= 32 ? 2 : 1;
    CHECK(d::plan_head_tiles(1, h, 1, 0, 1) == want);
    CHECK(d::plan_head_tiles(512, h, 2048, 512, 188) == want);
  }
  CHECK(error_of([] { d::plan_head_tiles(1, 64, 128, 0, 0); }).find("num_sms") != std::string::npos);

  CHECK(d::scratch_bytes(2, 64, 128, 512) == 2 * 64 * 10 * (512 * 2 + 4) + 2 * 64 * 4 + 48);
  CHECK(d::scratch_bytes(0, 128, 2048, 0) == 48);
  CHECK(d::scratch_bytes(1, 8, 0, 512) == 8 * 8 * 1028 + 8 * 4 + 48);
}

TEST_CASE("dsv41 plan_splits reproduces every reference point", "[unit]") {
  const std::vector<Point> points = {
      // 188 SMs, head tiles from plan_head_tiles.
      {188, 1, 64, 128, 512, {10, 1}}, {188, 8, 64, 128, 512, {10, 1}}, {188, 32, 64, 128, 512, {3, 4}},
      {188, 32, 64, 128, 512, {4, 3}, 0, 16, false, true}, {188, 64, 64, 128, 512, {1, 10}}, {188, 128, 64, 128, 512, {2, 5}},
      {188, 8, 8, 128, 512, {10, 1}}, {188, 32, 8, 128, 512, {5, 2}}, {188, 128, 8, 128, 512, {1, 10}},
      {188, 8, 128, 128, 512, {5, 2}}, {188, 32, 128, 128, 512, {1, 10}}, {188, 8, 64, 128, 0, {2, 1}},
      {188, 32, 64, 128, 0, {1, 2}},
      // 188 SMs, one head tile.
      {188, 1, 8, 128, 0, {2, 1}, 1}, {188, 18, 8, 128, 0, {2, 1}, 1}, {188, 19, 8, 128, 0, {1, 2}, 1},
      {188, 1, 8, 128, 0, {1, 2}, 1, 1}, {188, 128, 128, 128, 0, {1, 2}, 1}, {188, 1, 16, 512, 0, {8, 1}, 1},
      {188, 16, 16, 512, 0, {8, 1}, 1}, {188, 32, 16, 512, 0, {4, 2}, 1}, {188, 64, 16, 512, 0, {3, 3}, 1},
      {188, 128, 16, 512, 0, {1, 8}, 1}, {188, 256, 16, 512, 0, {2, 4}, 1}, {188, 4, 128, 512, 0, {1, 8}, 1, 1},
      // 170 SMs.
      {170, 32, 64, 128, 512, {3, 4}}, {170, 32, 64, 128, 512, {3, 4}, 0, 16, false, true}, {170, 128, 64, 128, 512, {3, 4}},
      {170, 128, 128, 128, 512, {3, 4}}, {170, 8, 128, 512, 0, {4, 2}, 2}, {170, 256, 16, 512, 0, {3, 3}},
      {170, 512, 16, 512, 0, {3, 3}},
      // 48 SMs with unified memory (GB10).
      {48, 1, 64, 128, 512, {5, 2}, 0, 16, true}, {48, 8, 64, 128, 512, {2, 5}, 0, 16, true},
      {48, 1, 16, 512, 0, {4, 2}, 0, 16, true}, {48, 8, 16, 512, 0, {2, 4}, 0, 16, true},
      {48, 32, 16, 512, 0, {1, 8}, 0, 16, true}, {48, 48, 16, 512, 0, {1, 8}, 0, 16, true},
      {48, 49, 16, 512, 0, {2, 4}, 0, 16, true}, {48, 64, 16, 512, 0, {2, 4}, 0, 16, true},
      {48, 65, 16, 512, 0, {1, 8}, 0, 16, true}, {48, 1, 8, 128, 0, {1, 2}, 0, 16, true},
  };
  for (const Point& p : points) {
    INFO("sms " << p.sms << " (T " << p.tokens << ", H " << p.heads << ", " << p.topk << " + " << p.extra << ") tiles "
                << p.head_tiles << " max_splits " << p.max_splits << (p.unified ? " unified" : "") << (p.ragged ? " ragged" : ""));
    const SplitPlan got = plan(p);
    INFO("got (" << got.num_splits << ", " << got.chunks_per_block << ")");
    CHECK(got == p.want);
  }
}

TEST_CASE("dsv41 plan_splits: two head tiles halve the grid the planner sees", "[unit]") {
  for (int sms : {48, 170, 188}) {
    for (bool unified : {false, true}) {
      for (int tokens : {1, 5, 8, 32, 128}) {
        for (int topk : {64, 128, 512, 1024}) {
          for (int extra : {0, 512}) {
            INFO("sms " << sms << " T " << tokens << " topk " << topk << "+" << extra << (unified ? " unified" : ""));
            CHECK(d::plan_splits(tokens, 32, topk, extra, sms, {16, 2, unified, false}) ==
                  d::plan_splits(tokens, 16, topk, extra, sms, {16, 1, unified, false}));
          }
        }
      }
    }
  }
}

TEST_CASE("dsv41 plan_splits and resolve_splits reject bad input with upstream's phrases", "[unit]") {
  CHECK(error_of([] { d::plan_splits(1, 64, 128, 0, 0); }).find("num_sms") != std::string::npos);
  CHECK(error_of([] { d::plan_splits(1, 64, 128, 0, 188, {16, 3}); }).find("head_tiles") != std::string::npos);
  CHECK(error_of([] { d::plan_splits(1, 64, 128, 0, 188, {16, 0}); }).find("head_tiles") != std::string::npos);
  CHECK(error_of([] { d::plan_splits(1, 64, 0, 0, 188); }).find("at least one candidate") != std::string::npos);
  // 2048 candidates are 32 chunks: at least 2 splits of 16.
  const std::string too_few = error_of([] { d::plan_splits(1, 64, 1024, 1024, 188, {1, 2}); });
  CHECK(too_few.find("splits (at most 16 chunks per block), max_splits=1") != std::string::npos);
  CHECK(too_few.find("argument 'max_splits'") != std::string::npos);
  CHECK(error_of([] { d::plan_splits(1, 64, 128, 0, 188, {0, 2}); }).find("max_splits=0") != std::string::npos);
  CHECK(d::plan_splits(1, 64, 1024, 1024, 188, {2, 2}).num_splits == 2);

  CHECK(error_of([] { d::resolve_splits(128, 0, 0); }).find("num_splits must be positive") != std::string::npos);
  CHECK(error_of([] { d::resolve_splits(1024, 1024, 1); }).find("at most") != std::string::npos);
  // max_splits is not consulted for an explicit count; the count is normalised.
  CHECK(d::resolve_splits(128, 512, 7) == SplitPlan{5, 2});
  CHECK(d::resolve_splits(128, 512, 64) == SplitPlan{10, 1});
  CHECK(d::resolve_splits(1024, 1024, 2) == SplitPlan{2, 16});
}

TEST_CASE("dsv41 plans keep upstream's invariants over its grid", "[unit]") {
  std::size_t plans = 0;
  std::set<std::pair<int, int>> seen;  // the grid reaches many distinct plans, not one
  for (int sms : {48, 170, 188}) {
    for (bool unified : {false, true}) {
      for (bool ragged : {false, true}) {
        for (int tokens : {1, 5, 8, 32, 128}) {
          for (int heads : d::supported_heads()) {
            for (int topk : {1, 64, 128, 130, 512, 1024}) {
              for (int extra : {0, 2, 512, 1024}) {
                const int chunks = d::num_chunks(topk, extra);
                const int tiles = d::plan_head_tiles(tokens, heads, topk, extra, sms);
                const d::SplitOptions o{16, tiles, unified, ragged};
                const SplitPlan p = d::plan_splits(tokens, heads, topk, extra, sms, o);
                INFO("sms " << sms << (unified ? " unified" : "") << (ragged ? " ragged" : "") << " T " << tokens << " H " << heads
                            << " " << topk << "+" << extra << " -> (" << p.num_splits << ", " << p.chunks_per_block << ")");
                REQUIRE(d::plan_splits(tokens, heads, topk, extra, sms, o) == p);
                REQUIRE(p.chunks_per_block >= 1);
                REQUIRE(p.chunks_per_block <= 16);
                REQUIRE(p.num_splits == ceil_div(chunks, p.chunks_per_block));
                REQUIRE((p.num_splits - 1) * p.chunks_per_block < chunks);
                REQUIRE(p.num_splits >= ceil_div(chunks, 16));
                REQUIRE(p.num_splits <= 16);
                if (chunks == 1) REQUIRE(p.num_splits == 1);
                const std::int64_t rows = std::int64_t(tokens) * heads;
                REQUIRE(d::scratch_bytes(tokens, heads, topk, extra) >= rows * p.num_splits * 1028 + rows * 4);
                seen.insert({p.num_splits, p.chunks_per_block});
                ++plans;
              }
            }
          }
        }
      }
    }
  }
  CHECK(plans == 3 * 2 * 2 * 5 * 9 * 6 * 4);
  CHECK(seen.size() >= 10);
}
