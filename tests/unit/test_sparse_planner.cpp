// Planners of the sparse NVFP4 MLA decode: the spec's reference points and input checks.
#include <catch2/catch.hpp>

#include "kiln/jit/error.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "tests/support/sparse_plan_reference.h"

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

TEST_CASE("sparse planners agree with the spec's rules written independently", "[unit]") {
  // tests/support/sparse_plan_reference.cpp re-derives both planners from the spec's text; every
  // branch (small and large dies, below and above one wave, each head-count rule) is crossed here.
  int compared = 0;
  for (int sms : {20, 40, 63, 64, 78, 114, 132, 188}) {
    for (int tokens : {1, 2, 3, 6, 8, 12, 24, 48, 64, 128, 512}) {
      for (int heads : {8, 16, 32, 48, 64, 96, 128}) {
        for (const auto& [topk, extra] : {std::pair{1, 0}, {64, 0}, {65, 0}, {128, 0}, {512, 0}, {2048, 0}, {128, 512}, {1, 2048}}) {
          const kiln::testing::SparsePlanRef want = kiln::testing::sparse_plan_reference(tokens, heads, topk, extra, sms);
          const sp::SplitPlanResult got = sp::resolve_plan(tokens, heads, topk, extra, sms);
          INFO("sms " << sms << " T " << tokens << " H " << heads << " topk " << topk << "+" << extra);
          CHECK(got.head_tiles == want.head_tiles);
          CHECK(got.num_splits == want.num_splits);
          CHECK(got.chunks_per_block == want.chunks_per_block);
          ++compared;
        }
      }
    }
  }
  CHECK(compared == 8 * 11 * 7 * 8);
}
