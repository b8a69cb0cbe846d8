// Planners of the sparse NVFP4 MLA decode against the contract (runtime/sparse_nvfp4/README.md,
// "Chunks, splits, head tiles"): its reference points, hand-derived cases of each head-tile rule, its
// input checks, and the properties every plan must have over a grid that crosses every branch (small
// and large dies, below and above one wave, each head-count rule).
#include <catch2/catch.hpp>

#include "kiln/jit/error.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"

#include <algorithm>
#include <utility>
#include <vector>

using kiln::sparse::SplitPlan;
namespace sp = kiln::sparse;

TEST_CASE("sparse num_chunks and scratch_bytes", "[unit]") {
  CHECK(sp::num_chunks(1, 0) == 1);
  CHECK(sp::num_chunks(64, 0) == 1);
  CHECK(sp::num_chunks(65, 0) == 2);
  CHECK(sp::num_chunks(2048, 0) == 32);
  CHECK(sp::num_chunks(128, 512) == 10);
  CHECK(sp::num_chunks(65, 1) == 3);
  CHECK(sp::scratch_bytes(2, 16, 128, 0) == 2 * 16 * 2 * (512 * 2 + 4) + 2 * 16 * 4 + 48);
  CHECK(sp::scratch_bytes(0, 128, 2048, 0) == 48);
}

TEST_CASE("sparse plan_splits reference points (188 SMs, 1 tile)", "[unit]") {
  CHECK(sp::plan_splits(1, 8, 128, 0, 188) == SplitPlan{1, 2});
  CHECK(sp::plan_splits(128, 128, 128, 0, 188) == SplitPlan{1, 2});
  CHECK(sp::plan_splits(1, 16, 512, 0, 188) == SplitPlan{8, 1});
  CHECK(sp::plan_splits(8, 128, 512, 0, 188) == SplitPlan{2, 4});
  CHECK(sp::plan_splits(8, 8, 512, 0, 188) == SplitPlan{4, 2});
  CHECK(sp::plan_splits(128, 128, 512, 0, 188) == SplitPlan{1, 8});
  CHECK(sp::plan_splits(4, 128, 512, 0, 188, 1) == SplitPlan{1, 8});
}

TEST_CASE("sparse plan_splits: more than 16 chunks always split", "[unit]") {
  const SplitPlan p = sp::plan_splits(128, 128, 2048, 0, 132);
  CHECK(p.chunks_per_block <= 16);
  CHECK(p.num_splits >= 2);
  CHECK(p.num_splits * p.chunks_per_block >= 32);
  CHECK_THROWS_AS(sp::plan_splits(1, 128, 2048, 0, 132, 1), kiln::Error);
}

TEST_CASE("sparse resolve_splits normalises an explicit num_splits", "[unit]") {
  CHECK(sp::resolve_splits(512, 0, 3) == SplitPlan{3, 3});
  CHECK(sp::resolve_splits(512, 0, 7) == SplitPlan{4, 2});  // cpb = ceil(8/7) = 2 -> 4 splits
}

TEST_CASE("sparse plan_head_tiles", "[unit]") {
  CHECK(sp::plan_head_tiles(64, 48, 2048, 0, 132) == 1);    // H % 32 != 0
  CHECK(sp::plan_head_tiles(64, 128, 2048, 0, 132) == 2);   // >= one wave
  CHECK(sp::plan_head_tiles(1, 128, 2048, 0, 132) == 1);    // 8 CTAs < sms/3
  CHECK(sp::plan_head_tiles(6, 128, 2048, 0, 132) == 2);    // 48 CTAs >= 44, 32 chunks
  CHECK(sp::plan_head_tiles(6, 128, 512, 0, 132) == 1);     // 8 chunks < 16
  CHECK(sp::plan_head_tiles(4, 64, 512, 0, 132) == 1);      // 16 CTAs < 44
  CHECK(sp::plan_head_tiles(12, 64, 512, 0, 132) == 2);     // 48 in [44, 88)
  CHECK(sp::plan_head_tiles(24, 64, 512, 0, 132) == 1);     // 96 >= 88
  CHECK(sp::plan_head_tiles(48, 32, 128, 0, 132) == 2);     // 96 >= 88
  CHECK(sp::plan_head_tiles(24, 32, 512, 0, 132) == 2);     // 48 >= 44 with 8 chunks
  CHECK(sp::plan_head_tiles(200, 64, 64, 0, 40) == 1);      // small die, 1 chunk, ctas > 2*sms
}

TEST_CASE("sparse planners reject bad input", "[unit]") {
  CHECK_THROWS_AS(sp::num_chunks(0, 0), kiln::Error);
  CHECK_THROWS_AS(sp::num_chunks(64, -1), kiln::Error);
  CHECK_THROWS_AS(sp::plan_splits(1, 12, 64, 0, 132), kiln::Error);
  CHECK_THROWS_AS(sp::plan_splits(1, 136, 64, 0, 132), kiln::Error);
  CHECK_THROWS_AS(sp::plan_splits(1, 48, 64, 0, 132, 16, 2), kiln::Error);
  CHECK_THROWS_AS(sp::plan_splits(1, 64, 64, 0, 132, 16, 3), kiln::Error);
  CHECK_THROWS_AS(sp::plan_splits(1, 64, 64, 0, 0), kiln::Error);
  CHECK_THROWS_AS(sp::plan_splits(1, 64, 64, 0, 132, 0), kiln::Error);
  CHECK_THROWS_AS(sp::resolve_splits(2048, 0, 1), kiln::Error);
  CHECK_THROWS_AS(sp::resolve_splits(64, 0, 0), kiln::Error);
  try {
    sp::resolve_splits(64, 0, 0);
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
    CHECK(std::string(e.what()).find("num_splits") != std::string::npos);
  }
}

namespace {

constexpr int kMaxChunks = 16;  // chunks one block may handle

int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct Shape {
  int topk, extra;
};

const std::vector<int> kSmCounts = {20, 40, 63, 64, 78, 114, 132, 188};
const std::vector<int> kTokens = {1, 2, 3, 6, 8, 12, 24, 48, 64, 128, 512};
const std::vector<int> kHeads = {8, 16, 32, 48, 64, 96, 128};
const std::vector<Shape> kShapes = {{1, 0}, {64, 0}, {65, 0}, {128, 0}, {512, 0}, {1024, 0}, {2048, 0}, {128, 512}, {1, 2048}};

// Grid and stream caps of the contract's split planner: a split count above the fewest possible is
// only taken below these (or as the one doubling allowed to a whole wave on large dies).
long long grid_cap(int sms) { return sms < 64 ? sms / 3 : sms * 4 / 5; }
long long stream_cap(int sms) { return sms < 64 ? sms / 6 : sms * 4 / 5; }

}  // namespace

TEST_CASE("sparse plans keep every split within the chunk bounds", "[unit]") {
  for (int sms : kSmCounts) {
    for (int tokens : kTokens) {
      for (int heads : kHeads) {
        for (const Shape& s : kShapes) {
          for (int max_splits : {1, 2, 4, 16}) {
            const int chunks = sp::num_chunks(s.topk, s.extra);
            if (ceil_div(chunks, kMaxChunks) > max_splits) continue;  // rejected: checked above
            const int tiles = sp::plan_head_tiles(tokens, heads, s.topk, s.extra, sms);
            const SplitPlan p = sp::plan_splits(tokens, heads, s.topk, s.extra, sms, max_splits, tiles);
            INFO("sms " << sms << " T " << tokens << " H " << heads << " topk " << s.topk << "+" << s.extra << " max_splits "
                        << max_splits << " -> tiles " << tiles << ", " << p.num_splits << " x " << p.chunks_per_block);
            CHECK((tiles == 1 || (tiles == 2 && heads % 32 == 0)));
            CHECK(p.chunks_per_block >= 1);
            CHECK(p.chunks_per_block <= kMaxChunks);
            CHECK(p.num_splits >= 1);
            CHECK(p.num_splits <= max_splits);
            // Every chunk has a split, and no split is empty (split s owns [s * cpb, (s + 1) * cpb)).
            CHECK(p.num_splits * p.chunks_per_block >= chunks);
            CHECK((p.num_splits - 1) * p.chunks_per_block < chunks);
            // The plan is already normalised: resolving its own split count gives it back.
            CHECK(sp::resolve_splits(s.topk, s.extra, p.num_splits) == p);
            // Work of one or two chunks, or a cap of one split, never splits further than it must.
            if (chunks <= 2 || max_splits == 1) CHECK(p.num_splits == ceil_div(chunks, kMaxChunks));
          }
        }
      }
    }
  }
}

TEST_CASE("sparse plans split beyond the minimum only under the grid and stream caps", "[unit]") {
  for (int sms : kSmCounts) {
    for (int tokens : kTokens) {
      for (int heads : kHeads) {
        for (const Shape& s : kShapes) {
          const int chunks = sp::num_chunks(s.topk, s.extra);
          const int fewest = ceil_div(chunks, kMaxChunks);
          const int tiles = sp::plan_head_tiles(tokens, heads, s.topk, s.extra, sms);
          const SplitPlan p = sp::plan_splits(tokens, heads, s.topk, s.extra, sms, 16, tiles);
          if (p.num_splits <= fewest) continue;
          const long long base = static_cast<long long>(tokens) * ceil_div(heads, 16 * tiles);
          INFO("sms " << sms << " T " << tokens << " H " << heads << " topk " << s.topk << "+" << s.extra << " -> "
                      << p.num_splits << " x " << p.chunks_per_block << " (fewest " << fewest << ")");
          const bool within_caps = base * p.num_splits <= grid_cap(sms) && static_cast<long long>(tokens) * p.num_splits <= stream_cap(sms);
          // The one other way past the minimum: a large die, at least a wave of blocks and >= 16
          // chunks take a second split to even out the last wave.
          const bool wave_tail = sms >= 64 && base >= sms && chunks >= kMaxChunks && p.num_splits == 2;
          CHECK((within_caps || wave_tail));
          // Extra splits still leave each block 2 chunks, except where one block is the whole grid.
          if (!(sms >= 64 && base == 1)) CHECK(p.chunks_per_block >= 2);
        }
      }
    }
  }
}

TEST_CASE("sparse plans are monotone in max_splits, and in T below one wave", "[unit]") {
  for (int sms : kSmCounts) {
    for (int heads : kHeads) {
      for (const Shape& s : kShapes) {
        const int chunks = sp::num_chunks(s.topk, s.extra);
        for (int tokens : kTokens) {
          // A higher cap never gives fewer splits.
          int previous = 0;
          for (int max_splits : {1, 2, 4, 8, 16}) {
            if (ceil_div(chunks, kMaxChunks) > max_splits) continue;
            const int n = sp::plan_splits(tokens, heads, s.topk, s.extra, sms, max_splits).num_splits;
            INFO("sms " << sms << " T " << tokens << " H " << heads << " topk " << s.topk << "+" << s.extra << " max_splits " << max_splits);
            CHECK(n >= previous);
            previous = n;
          }
        }
        // While twice the blocks fit under the grid cap, more tokens never give more splits.
        int previous = 1 << 30;
        for (int tokens : kTokens) {
          const long long base = static_cast<long long>(tokens) * ceil_div(heads, 16);
          if (2 * base > grid_cap(sms)) break;
          const int n = sp::plan_splits(tokens, heads, s.topk, s.extra, sms).num_splits;
          INFO("sms " << sms << " T " << tokens << " H " << heads << " topk " << s.topk << "+" << s.extra);
          CHECK(n <= previous);
          previous = n;
        }
      }
    }
  }
}

TEST_CASE("sparse resolve_plan applies overrides and plans the rest", "[unit]") {
  // No override: the planners' head tiles, then their splits for those tiles.
  for (int sms : {40, 132, 188}) {
    for (int tokens : {1, 8, 64}) {
      for (int heads : {32, 64, 128}) {
        const int tiles = sp::plan_head_tiles(tokens, heads, 2048, 0, sms);
        const SplitPlan s = sp::plan_splits(tokens, heads, 2048, 0, sms, 16, tiles);
        CHECK(sp::resolve_plan(tokens, heads, 2048, 0, sms) == sp::SplitPlanResult{tiles, s.num_splits, s.chunks_per_block});
      }
    }
  }
  // An explicit split count is normalised; an explicit head tiling is kept.
  CHECK(sp::resolve_plan(8, 64, 512, 0, 132, 3, 16, 2) == sp::SplitPlanResult{2, 3, 3});
  CHECK(sp::resolve_plan(8, 64, 512, 0, 132, 7, 16, 1) == sp::SplitPlanResult{1, 4, 2});
}
