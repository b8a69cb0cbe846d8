// Host validation and plan resolution of the sparse NVFP4 decode launcher. Host only: tensors are
// fake, aligned, non-overlapping addresses that are never dereferenced, so every call that reaches
// the driver is a bug; the engine API is only called where validation must fail first (or T == 0).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "tests/support/expect_error.h"
#include "tests/support/fake_decode_call.h"
#include "tests/support/h200_residency.h"

namespace {

using kiln::DType;
using kiln::Error;
using kiln::ErrorCode;
using kiln::TensorView;
namespace sp = kiln::sparse;

using namespace kiln::testing::fake;  // region constants, view, cache3

// A GPU of target `arch` and `sms` SMs with the H200's cluster residency scaled to it.
sp::SparseDevice dev(std::string_view arch, int sms) { return sp::SparseDevice{arch, sms, kiln::testing::h200_residency(sms)}; }

// An NVFP4 cache [P, page, 384] with an optional padded page stride (bytes).
TensorView nvfp4_cache(std::uintptr_t a, std::int64_t pages, std::int64_t page, std::int64_t page_stride = 0) {
  return cache3(a, pages, page, 384, page_stride);
}

struct Call : DecodeCall<Call, sp::SparseOptions> {
  Call(int t = 4, int h = 64, int k = 128) : DecodeCall(t, h, k, 384, 384) {}

  sp::SplitPlanResult plan(int sms = 132) const {
    return sp::plan_sparse_decode(q, kv, indices, output, out_lse, sm_scale, opt, sms);
  }
  sp::SplitPlanResult run() const {
    return sp::cake_sparse_mla_sm120_dsv4_nvfp4_decode(q, kv, indices, output, out_lse, sm_scale, opt, nullptr);
  }
};

using kiln::testing::expect_error;  // (call, argument, message parts, code)
using kiln::testing::expect_rejected;

}  // namespace

TEST_CASE("sparse validation: a well-formed call plans without a driver", "[unit]") {
  Call c;
  CHECK(c.plan() == sp::SplitPlanResult{1, 1, 2});
  Call full(4, 64, 128);
  full.with_extra(512).with_mid(16);
  full.opt.topk_length = view(kLen, DType::kI32, {8});
  full.opt.attn_sink = view(kSink, DType::kF32, {64});
  full.opt.extra_topk_length = view(kXLen, DType::kI32, {4});
  full.opt.lse_scale = std::log(2.0);
  const sp::SplitPlanResult p = full.plan();
  CHECK(p.num_splits * p.chunks_per_block >= 10);
  // The contract's planners by hand: 2 + 8 chunks, 16 CTAs (< sms / 3: one head tile); base 16 doubles
  // to 4 splits (8 would put 128 CTAs above 4/5 of 132), cpb ceil(10 / 4) = 3.
  CHECK(p == sp::SplitPlanResult{1, 4, 3});
}

TEST_CASE("sparse validation: T == 0 returns the plan without a launch or a driver", "[unit]") {
  Call c(0, 64, 512);
  const sp::SplitPlanResult planned = c.plan(188);
  CHECK(c.run() == planned);  // no driver on the unit machine: reaching it would throw kDriver
  // 8 chunks, no CTAs: splits double while each keeps >= 2 chunks: 4 splits of 2.
  CHECK(planned == sp::SplitPlanResult{1, 4, 2});
  // Nothing is written at T == 0, so a splitting plan needs no scratch; null data is fine when empty.
  CHECK(planned.num_splits > 1);
  Call empty(0, 128, 2048);
  empty.q.data = empty.output.data = empty.out_lse.data = empty.indices.data = nullptr;
  CHECK(empty.run().num_splits >= 2);
  // ... but the arguments are still validated.
  empty.opt.head_tiles = 3;
  expect_error([&] { empty.run(); }, "head_tiles");
}

TEST_CASE("sparse validation: the T == 0 plan does not depend on the SM count", "[unit]") {
  // Why the launcher may resolve the zero-token plan without asking the device.
  for (int heads : {8, 16, 32, 48, 64, 96, 128}) {
    for (int topk : {1, 64, 128, 512, 1024, 2048}) {
      for (int extra : {0, 512}) {
        const sp::SplitPlanResult ref = sp::resolve_plan(0, heads, topk, extra, 132);
        for (int sms : {3, 8, 20, 63, 64, 78, 114, 170, 188, 1000}) {
          INFO("H " << heads << " topk " << topk << " extra " << extra << " sms " << sms);
          CHECK(sp::resolve_plan(0, heads, topk, extra, sms) == ref);
        }
      }
    }
  }
}

TEST_CASE("sparse validation: spec reference points through plan resolution", "[unit]") {
  // (188 SMs, 1 tile) points, through the full call with head_tiles forced to 1.
  struct Point {
    int tokens, heads, topk, max_splits, splits, cpb;
  };
  for (const Point& pt : {Point{1, 8, 128, 16, 1, 2}, Point{128, 128, 128, 16, 1, 2}, Point{1, 16, 512, 16, 8, 1},
                          Point{8, 128, 512, 16, 2, 4}, Point{8, 8, 512, 16, 4, 2}, Point{128, 128, 512, 16, 1, 8},
                          Point{4, 128, 512, 1, 1, 8}}) {
    INFO("T " << pt.tokens << " H " << pt.heads << " topk " << pt.topk);
    Call c(pt.tokens, pt.heads, pt.topk);
    c.with_mid(8);
    c.opt.head_tiles = 1;
    c.opt.max_splits = pt.max_splits;
    CHECK(c.plan(188) == sp::SplitPlanResult{1, pt.splits, pt.cpb});
  }
  // Without an override the head-tile planner runs first and the split planner sees its choice.
  Call big(128, 128, 128);
  CHECK(big.plan(188) == sp::SplitPlanResult{2, 1, 2});
  CHECK(big.plan(188).head_tiles == sp::plan_head_tiles(128, 128, 128, 0, 188));
  Call mid(6, 128, 2048);
  mid.with_mid(16);
  const sp::SplitPlanResult p = mid.plan(132);
  CHECK(p.head_tiles == 2);
  const sp::SplitPlan s = sp::plan_splits(6, 128, 2048, 0, 132, 16, 2);
  CHECK(p.num_splits == s.num_splits);
  CHECK(p.chunks_per_block == s.chunks_per_block);
  // The extra section's chunks count: 128 + 512 -> 2 + 8 chunks.
  Call x(1, 64, 128);
  x.with_extra(512).with_mid(16);
  // 10 chunks, base 4 on 188 SMs: 8 splits (16 would leave a split < 2 chunks), then cpb 2 -> 5 splits.
  CHECK(x.plan(188) == sp::SplitPlanResult{1, 5, 2});
  CHECK(x.plan(188).num_splits * x.plan(188).chunks_per_block >= 10);
}

TEST_CASE("sparse validation: explicit num_splits and head_tiles", "[unit]") {
  Call c(4, 64, 512);
  c.with_mid(8);
  c.opt.num_splits = 3;
  CHECK(c.plan() == sp::SplitPlanResult{c.plan().head_tiles, 3, 3});
  c.opt.num_splits = 7;  // cpb = ceil(8/7) = 2 -> 4 splits
  CHECK(c.plan().num_splits == 4);
  CHECK(c.plan().chunks_per_block == 2);
  c.opt.num_splits = 1;
  c.opt.head_tiles = 2;
  CHECK(c.plan() == sp::SplitPlanResult{2, 1, 8});
  c.opt.num_splits = 100;  // more splits than chunks: normalised to one chunk per block
  CHECK(c.plan() == sp::SplitPlanResult{2, 8, 1});

  c.opt.num_splits = 0;
  expect_rejected(c, "num_splits", {">= 1", "0"});
  Call big(4, 64, 2048);
  big.opt.num_splits = 1;
  expect_rejected(big, "num_splits", {"32 chunks", "16"});
  big.opt.num_splits.reset();
  big.opt.max_splits = 0;
  expect_rejected(big, "max_splits", {">= 1"});
  big.opt.max_splits = 1;
  expect_rejected(big, "max_splits", {">= 2"});

  Call h(4, 48, 128);
  h.opt.head_tiles = 2;
  expect_rejected(h, "head_tiles", {"H % 32", "48"});
  h.opt.head_tiles = 0;
  expect_rejected(h, "head_tiles", {"1 or 2"});
  h.opt.head_tiles = 3;
  expect_rejected(h, "head_tiles", {"1 or 2", "3"});
}

TEST_CASE("sparse validation: split plans need mid_out and mid_lse of the right shape", "[unit]") {
  Call c(4, 64, 512);
  c.opt.num_splits = 4;
  expect_rejected(c, "mid_out", {"S >= 4"});  // explicit split: caught before the device is asked
  Call planned(1, 16, 512);                    // the planner splits 8 ways on 188 SMs
  expect_error([&] { planned.plan(188); }, "mid_out", {"S >= 8"});
  Call forced(1, 16, 2048);  // > 16 chunks always split, whatever the device
  expect_rejected(forced, "mid_out", {"S >= 2"});

  c.with_mid(3);
  expect_rejected(c, "mid_out", {"S >= num_splits = 4", "[4, 64, 3, 512]"});
  c.with_mid(4);
  CHECK(c.plan().num_splits == 4);

  Call m = c;
  m.opt.mid_lse = view(kMidLse, DType::kF32, {4, 64, 5});
  expect_rejected(m, "mid_lse", {"[4, 64, 4]"});
  m.opt.mid_lse = view(kMidLse, DType::kF32, {4, 64 * 4});
  expect_rejected(m, "mid_lse", {"rank 3"});
  m.opt.mid_lse = view(kMidLse, DType::kBf16, {4, 64, 4});
  expect_rejected(m, "mid_lse", {"float32"});
  m.opt.mid_lse.reset();
  expect_rejected(m, "mid_lse", {"together"});
  m = c;
  m.opt.mid_out.reset();
  expect_rejected(m, "mid_out", {"together"});
  m = c;
  m.opt.mid_out = view(kMidOut, DType::kF32, {4, 64, 4, 512});
  expect_rejected(m, "mid_out", {"bfloat16"});
  m.opt.mid_out = view(kMidOut, DType::kBf16, {4, 64, 4, 448});
  expect_rejected(m, "mid_out", {"[4, 64, S, 512]"});
  m.opt.mid_out = view(kMidOut, DType::kBf16, {3, 64, 4, 512});
  expect_rejected(m, "mid_out", {"[4, 64, S, 512]"});
  m.opt.mid_out = view(kMidOut, DType::kBf16, {4, 64, 4, 512});
  m.opt.mid_out->strides[2] = 1024;  // padded split stride: not contiguous
  m.opt.mid_out->strides[1] = 4096;
  m.opt.mid_out->strides[0] = 4096 * 64;
  expect_rejected(m, "mid_out", {"contiguous"});
  m.opt.mid_out = view(kMidOut + 8, DType::kBf16, {4, 64, 4, 512});
  expect_rejected(m, "mid_out", {"16-byte aligned"});
  m = c;
  m.opt.mid_lse->strides = {64 * 4, 1, 64, 0, 0, 0};
  expect_rejected(m, "mid_lse", {"contiguous"});
}

TEST_CASE("sparse validation: q", "[unit]") {
  Call c;
  c.q = view(kQ, DType::kBf16, {4, 64 * 512});
  expect_rejected(c, "q", {"rank 3"});
  c.q = view(kQ, DType::kF16, {4, 64, 512});
  expect_rejected(c, "q", {"bfloat16", "float16"});
  c.q = view(kQ, DType::kBf16, {4, 64, 576});
  expect_rejected(c, "q", {"512"});
  c.q = view(kQ + 2, DType::kBf16, {4, 64, 512});
  expect_rejected(c, "q", {"16-byte aligned"});
  c.q = view(kQ, DType::kBf16, {4, 64, 512});
  c.q.strides[0] = 64 * 1024;  // padded token stride
  expect_rejected(c, "q", {"contiguous"});
  for (int h : {0, 4, 12, 36, 136, 256}) {
    Call bad(4, h, 128);
    INFO("H " << h);
    expect_rejected(bad, "q", {"multiples of 8 in [8, 128]"}, ErrorCode::kUnsupported);
  }
  for (int h : {8, 16, 24, 40, 48, 80, 96, 112, 120, 128}) {
    INFO("H " << h);
    CHECK_NOTHROW(Call(2, h, 64).plan());
  }
  c = Call();
  c.q.data = nullptr;
  expect_rejected(c, "q", {"null"});
}

TEST_CASE("sparse validation: output and out_lse", "[unit]") {
  Call c;
  c.output = view(kOut, DType::kF32, {4, 64, 512});
  expect_rejected(c, "output", {"bfloat16"});
  c.output = view(kOut, DType::kBf16, {4, 32, 512});
  expect_rejected(c, "output", {"[4, 64, 512]"});
  c.output = view(kOut, DType::kBf16, {4, 64, 512, 1});
  expect_rejected(c, "output", {"rank 3"});
  c.output = view(kOut, DType::kBf16, {4, 64, 512});
  c.output.strides[0] = 64 * 1024;
  expect_rejected(c, "output", {"contiguous"});
  c.output = view(kOut + 4, DType::kBf16, {4, 64, 512});
  expect_rejected(c, "output", {"16-byte aligned"});

  c = Call();
  c.out_lse = view(kLse, DType::kBf16, {4, 64});
  expect_rejected(c, "out_lse", {"float32"});
  c.out_lse = view(kLse, DType::kF32, {4, 72});
  expect_rejected(c, "out_lse", {"[4, 64]"});
  c.out_lse = view(kLse, DType::kF32, {4 * 64});
  expect_rejected(c, "out_lse", {"rank 2"});
  c.out_lse = view(kLse, DType::kF32, {4, 64});
  c.out_lse.strides[0] = 128;
  expect_rejected(c, "out_lse", {"contiguous"});
  c.out_lse = view(kLse + 2, DType::kF32, {4, 64});
  expect_rejected(c, "out_lse", {"4-byte aligned"});
}

TEST_CASE("sparse validation: kv_cache layouts, strides and alignment", "[unit]") {
  Call c;
  // The three layouts, dense and with a padded page stride, at several page sizes.
  for (int page : {1, 2, 32, 64, 128, 100}) {
    INFO("page " << page);
    c.kv = nvfp4_cache(kKv, 16, page);
    CHECK_NOTHROW(c.plan());
    c.kv = nvfp4_cache(kKv, 16, page, page * 384 + 16);
    CHECK_NOTHROW(c.plan());
    c.kv = view(kKv, DType::kU8, {16, 1, page, 384});  // HND
    CHECK_NOTHROW(c.plan());
    c.kv.strides[0] = page * 384 + 32;
    CHECK_NOTHROW(c.plan());
    c.kv = view(kKv, DType::kU8, {16, page, 1, 384});  // NHD
    CHECK_NOTHROW(c.plan());
    c.kv.strides[0] = page * 384 + 48;
    CHECK_NOTHROW(c.plan());
  }
  c.kv = nvfp4_cache(kKv, 1, 64, 7);  // one page: its stride is never used
  CHECK_NOTHROW(c.plan());

  c.kv = view(kKv, DType::kI8, {16, 64, 384});
  expect_rejected(c, "kv_cache", {"uint8", "int8"});
  c.kv = view(kKv, DType::kU8, {16 * 64 * 384});
  expect_rejected(c, "kv_cache", {"rank 3 or 4"});
  c.kv = view(kKv, DType::kU8, {16, 64, 352});
  expect_rejected(c, "kv_cache", {"384"});
  c.kv = view(kKv, DType::kU8, {16, 2, 32, 384});
  expect_rejected(c, "kv_cache", {"HND [P, 1, page, 384]", "[16, 2, 32, 384]"});
  c.kv = nvfp4_cache(kKv, 16, 64);
  c.kv.strides = {64 * 384 * 2, 384 * 2, 2, 0, 0, 0};
  expect_rejected(c, "kv_cache", {"stride(-1) == 1"});
  c.kv = nvfp4_cache(kKv + 8, 16, 64);
  expect_rejected(c, "kv_cache", {"16-byte aligned"});
  c.kv = nvfp4_cache(kKv, 16, 64, 64 * 384 + 8);
  expect_rejected(c, "kv_cache", {"multiple of 16", "24584"});
  c.kv = nvfp4_cache(kKv, 16, 64, 64 * 384 - 16);
  expect_rejected(c, "kv_cache", {">= page_size * 384 = 24576"});
  c.kv = nvfp4_cache(kKv, 16, 64);
  c.kv.strides[1] = 512;  // tokens not packed within a page
  c.kv.strides[0] = 64 * 512;
  expect_rejected(c, "kv_cache", {"token stride 384", "512"});
  c.kv = view(kKv, DType::kU8, {16, 1, 64, 384});
  c.kv.strides[2] = 400;
  c.kv.strides[0] = 64 * 400;
  expect_rejected(c, "kv_cache", {"token stride 384"});
  c.kv = view(kKv, DType::kU8, {16, 0, 384});
  expect_rejected(c, "kv_cache", {"page size >= 1"});
  c.kv = nvfp4_cache(kKv, 16, 64);
  c.kv.data = nullptr;
  expect_rejected(c, "kv_cache", {"null"});
}

TEST_CASE("sparse validation: indices and topk_length", "[unit]") {
  Call c;
  c.indices = view(kIdx, DType::kI32, {4, 1, 128});
  CHECK(c.plan() == Call().plan());
  c.indices = view(kIdx, DType::kI32, {4, 128});
  c.indices.strides[0] = 256;  // a row stride wider than topk is fine
  CHECK_NOTHROW(c.plan());

  c.indices = view(kIdx, DType::kI64, {4, 128});
  expect_rejected(c, "indices", {"int32", "int64"});
  c.indices = view(kIdx, DType::kI32, {4 * 128});
  expect_rejected(c, "indices", {"rank 2 or 3"});
  c.indices = view(kIdx, DType::kI32, {4, 2, 64});
  expect_rejected(c, "indices", {"[T, 1, topk]", "[4, 2, 64]"});
  c.indices = view(kIdx, DType::kI32, {3, 128});
  expect_rejected(c, "indices", {"T = 4"});
  c.indices = view(kIdx, DType::kI32, {4, 0});
  expect_rejected(c, "indices", {"topk (last dimension) >= 1"});
  c.indices = view(kIdx, DType::kI32, {4, 128});
  c.indices.strides = {256, 2, 0, 0, 0, 0};
  expect_rejected(c, "indices", {"stride(-1) == 1"});
  c.indices = view(kIdx + 2, DType::kI32, {4, 128});
  expect_rejected(c, "indices", {"4-byte aligned"});

  c = Call();
  c.opt.topk_length = view(kLen, DType::kI32, {4});
  CHECK_NOTHROW(c.plan());
  c.opt.topk_length = view(kLen, DType::kI32, {3});
  expect_rejected(c, "topk_length", {"at least T = 4 entries", "[3]"});
  c.opt.topk_length = view(kLen, DType::kI64, {4});
  expect_rejected(c, "topk_length", {"int32"});
  c.opt.topk_length = view(kLen, DType::kI32, {4, 1});
  expect_rejected(c, "topk_length", {"rank 1"});
  c.opt.topk_length = view(kLen, DType::kI32, {4});
  c.opt.topk_length->strides[0] = 2;
  expect_rejected(c, "topk_length", {"stride(0) == 1"});
}

TEST_CASE("sparse validation: attn_sink, sm_scale, lse_scale", "[unit]") {
  Call c;
  c.opt.attn_sink = view(kSink, DType::kF32, {64});
  CHECK_NOTHROW(c.plan());
  c.opt.attn_sink = view(kSink, DType::kF32, {63});
  expect_rejected(c, "attn_sink", {"at least H = 64 entries"});
  c.opt.attn_sink = view(kSink, DType::kBf16, {64});
  expect_rejected(c, "attn_sink", {"float32"});
  c.opt.attn_sink = view(kSink + 1, DType::kF32, {64});
  expect_rejected(c, "attn_sink", {"aligned"});

  c = Call();
  c.sm_scale = 0.0;
  expect_rejected(c, "sm_scale");
  c.sm_scale = NAN;
  expect_rejected(c, "sm_scale");
  c = Call();
  c.opt.lse_scale = INFINITY;
  expect_rejected(c, "lse_scale", {"finite"});
  c.opt.lse_scale = 1e300;  // overflows float32
  expect_rejected(c, "lse_scale", {"finite"});
}

TEST_CASE("sparse validation: extra cache, indices and lengths come together", "[unit]") {
  Call c;
  c.with_extra(512).with_mid(16);
  CHECK_NOTHROW(c.plan());
  c.opt.extra_topk_length = view(kXLen, DType::kI32, {4});
  CHECK_NOTHROW(c.plan());
  c.opt.extra_topk_length = view(kXLen, DType::kI32, {2});
  expect_rejected(c, "extra_topk_length", {"at least T = 4"});

  Call alone;
  alone.opt.extra_kv_cache = nvfp4_cache(kXKv, 64, 2);
  expect_rejected(alone, "extra_indices", {"extra_kv_cache"});
  alone.opt.extra_kv_cache.reset();
  alone.opt.extra_indices = view(kXIdx, DType::kI32, {4, 512});
  expect_rejected(alone, "extra_kv_cache", {"extra_indices"});
  alone.opt.extra_indices.reset();
  alone.opt.extra_topk_length = view(kXLen, DType::kI32, {4});
  expect_rejected(alone, "extra_topk_length", {"without extra_indices"});

  // The extra pool follows the same format rules under its own name, with its own page geometry.
  Call x;
  x.with_extra(64).with_mid(16);
  for (int page : {2, 32, 64}) {
    x.opt.extra_kv_cache = view(kXKv, DType::kU8, {64, 1, page, 384});
    CHECK_NOTHROW(x.plan());
    x.opt.extra_kv_cache = view(kXKv, DType::kU8, {64, page, 1, 384});
    CHECK_NOTHROW(x.plan());
  }
  x.opt.extra_kv_cache = nvfp4_cache(kXKv + 4, 64, 2);
  expect_rejected(x, "extra_kv_cache", {"16-byte aligned"});
  x.opt.extra_kv_cache = nvfp4_cache(kXKv, 64, 2, 2 * 384 + 4);
  expect_rejected(x, "extra_kv_cache", {"multiple of 16"});
  x.opt.extra_kv_cache = nvfp4_cache(kXKv, 64, 2, 384);
  expect_rejected(x, "extra_kv_cache", {">= page_size * 384 = 768"});
  x.opt.extra_kv_cache = view(kXKv, DType::kU8, {64, 2, 2, 384});
  expect_rejected(x, "extra_kv_cache", {"NHD"});
  x.opt.extra_kv_cache = view(kXKv, DType::kBf16, {64, 2, 384});
  expect_rejected(x, "extra_kv_cache", {"uint8"});
  x.opt.extra_kv_cache = nvfp4_cache(kXKv, 64, 2);
  x.opt.extra_indices = view(kXIdx, DType::kI32, {5, 64});
  expect_rejected(x, "extra_indices", {"T = 4"});
  x.opt.extra_indices = view(kXIdx, DType::kF32, {4, 64});
  expect_rejected(x, "extra_indices", {"int32"});
  x.opt.extra_indices = view(kXIdx, DType::kI32, {4, 1, 64});
  CHECK_NOTHROW(x.plan());
  x.opt.extra_indices = view(kXIdx, DType::kI32, {4, 0});  // an empty extra section is allowed
  CHECK(x.plan() == Call().plan());
}

TEST_CASE("sparse validation: outputs must not overlap inputs or each other", "[unit]") {
  Call c;
  c.output = view(kQ, DType::kBf16, {4, 64, 512});  // in-place over q
  expect_rejected(c, "output", {"disjoint from 'q'"});
  c = Call();
  c.out_lse = view(kKv + 1024, DType::kF32, {4, 64});
  expect_rejected(c, "out_lse", {"disjoint from 'kv_cache'"});
  c = Call();
  c.out_lse = view(kOut + 4 * 64 * 1024 - 16, DType::kF32, {4, 64});  // tail of output
  expect_rejected(c, "output", {"disjoint from 'out_lse'"});
  c = Call();
  c.opt.topk_length = view(kOut + 64, DType::kI32, {4});
  expect_rejected(c, "output", {"disjoint from 'topk_length'"});
  c = Call();
  c.opt.attn_sink = view(kLse, DType::kF32, {64});
  expect_rejected(c, "out_lse", {"disjoint from 'attn_sink'"});
  c = Call();
  c.with_extra(64);
  c.opt.extra_indices = view(kOut, DType::kI32, {4, 64});
  expect_rejected(c, "output", {"disjoint from 'extra_indices'"});
  c = Call(4, 64, 512);
  c.with_mid(8);
  c.opt.mid_out = view(kIdx, DType::kBf16, {4, 64, 8, 512});
  expect_rejected(c, "mid_out", {"disjoint from 'indices'"});
  c.with_mid(8);
  c.opt.mid_lse = view(kOut, DType::kF32, {4, 64, 8});
  expect_rejected(c, "mid_lse", {"disjoint from 'output'"});
  c.with_mid(8);
  c.opt.mid_lse = view(kMidOut + 4096, DType::kF32, {4, 64, 8});
  expect_rejected(c, "mid_out", {"disjoint from 'mid_lse'"});
}

TEST_CASE("sparse family: policy validation, keys and rendering", "[unit]") {
  sp::register_sparse_family();
  const kiln::Family& f = kiln::find_family("sparse_nvfp4");
  const auto canon = f.canonicalize({{"heads", 64}});
  CHECK(canon == nlohmann::json{{"heads", 64}, {"head_tiles", 1}, {"has_extra", false}, {"split", false}, {"kernel", "mma"}});
  const auto fails = [&](const nlohmann::json& p, const std::string& part) {
    try {
      f.canonicalize(p);
      FAIL("accepted " << p.dump());
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.code() == ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
  };
  fails(nlohmann::json::object(), "'heads'");
  fails({{"heads", 12}}, "'heads'");
  fails({{"heads", 136}}, "'heads'");
  fails({{"heads", "64"}}, "'heads'");
  fails({{"heads", 64}, {"head_tiles", 3}}, "'head_tiles'");
  fails({{"heads", 48}, {"head_tiles", 2}}, "heads % 32");
  fails({{"heads", 64}, {"split", 1}}, "'split'");
  fails({{"heads", 64}, {"has_extra", "yes"}}, "'has_extra'");
  fails({{"heads", 64}, {"page_size", 64}}, "no field 'page_size'");
  fails(nlohmann::json::array(), "JSON object");

  fails({{"heads", 64}, {"kernel", "wgmma"}}, "'kernel'");
  fails({{"heads", 64}, {"kernel", 1}}, "'kernel'");
  fails({{"heads", 64}, {"head_tiles", 2}, {"kernel", "sm90"}}, "only kernel \"mma\"");
  fails({{"heads", 64}, {"head_tiles", 2}, {"kernel", "mma_small"}}, "only kernel \"mma\"");
  CHECK(f.canonicalize({{"heads", 64}})["kernel"] == "mma");

  // split and H are run-time values of the kernels: not rendered (the sm90 kernel names its head
  // groups, 1 or 2); has_extra is a template argument. A module holds the decode kernel only: the
  // merge is the sparse_merge companion, one module per arch.
  const sp::SparsePolicy direct{128, 2, true, false};
  const kiln::KernelSource s1 = f.render(direct.key("sm_90a").policy());
  REQUIRE(s1.name_expressions.size() == 1);
  CHECK(s1.name_expressions[0] == "kiln::sparse_nvfp4_decode_kernel<2, true, false>");
  CHECK(s1.source.find("sparse_nvfp4/kernel.cuh") != std::string::npos);
  const sp::SparsePolicy split{16, 1, false, true, sp::SparseKernel::kMmaSmall};
  const kiln::KernelSource s2 = f.render(split.key("sm_120a").policy());
  REQUIRE(s2.name_expressions.size() == 1);
  CHECK(s2.name_expressions[0] == "kiln::sparse_nvfp4_decode_kernel<1, false, true>");
  const sp::SparsePolicy hopper{96, 1, true, true, sp::SparseKernel::kSm90};
  const kiln::KernelSource s3 = f.render(hopper.key("sm_90a").policy());
  // H > 64: the pair kernel, then the one-group kernel an unpaired launch runs.
  REQUIRE(s3.name_expressions.size() == 2);
  CHECK(s3.name_expressions[0] == "kiln::sparse_nvfp4_sm90_kernel<2, true>");
  CHECK(s3.name_expressions[1] == "kiln::sparse_nvfp4_sm90_kernel<1, true, true>");
  const sp::SparsePolicy hopper64{64, 1, false, true, sp::SparseKernel::kSm90};
  CHECK(f.render(hopper64.key("sm_90a").policy()).name_expressions == std::vector<std::string>{"kiln::sparse_nvfp4_sm90_kernel<1, false>"});
  CHECK(s3.source.find("sparse_nvfp4/kernel_sm90.cuh") != std::string::npos);
  for (const auto& [policy, arch] : {std::pair{direct, "sm_90a"}, std::pair{split, "sm_120a"}, std::pair{hopper, "sm_90a"}}) {
    const std::vector<kiln::SemanticKey> companions = kiln::companion_keys(policy.key(arch));
    REQUIRE(companions.size() == 1);
    CHECK(companions[0] == sp::SparseMergePolicy{policy.heads}.key(arch));
    const kiln::KernelSource merge = kiln::find_family("sparse_merge").render(companions[0].policy());
    REQUIRE(merge.name_expressions.size() == 1);
    CHECK(merge.name_expressions[0] == "kiln::sparse_nvfp4_merge_kernel");
    CHECK(merge.source.find("sparse_nvfp4/merge.cuh") != std::string::npos);
    CHECK(kiln::companion_keys(companions[0]).empty());
  }
  expect_error([] { sp::SparseMergePolicy{12}.validate(); }, "heads", {"multiple of 8"});

  // Keys that differ only in split, or in H (within the sm90 kernel's head groups), share one cache
  // entry; any other field (has_extra included), the arch or the kernel gives another.
  const auto entry = [](const sp::SparsePolicy& p, const char* arch) { return kiln::make_build_request(p.key(arch)).cache_key; };
  for (const sp::SparseKernel kernel : {sp::SparseKernel::kMma, sp::SparseKernel::kMmaSmall, sp::SparseKernel::kSm90}) {
    const kiln::CacheKey base = entry({64, 1, false, false, kernel}, "sm_90a");
    CHECK(entry({64, 1, false, true, kernel}, "sm_90a") == base);
    CHECK(entry({64, 1, true, false, kernel}, "sm_90a") != base);
    CHECK(entry({64, 1, true, true, kernel}, "sm_90a") == entry({64, 1, true, false, kernel}, "sm_90a"));
    CHECK(entry({32, 1, false, false, kernel}, "sm_90a") == base);
    if (kernel == sp::SparseKernel::kSm90) CHECK(entry({128, 1, false, false, kernel}, "sm_90a") != base);  // a cluster pair
    else CHECK(entry({128, 1, false, false, kernel}, "sm_90a") == base);
    if (kernel != sp::SparseKernel::kSm90) CHECK(entry({64, 1, false, false, kernel}, "sm_120a") != base);
  }
  CHECK(entry({64, 2, true, true}, "sm_90a") == entry({64, 2, true, false}, "sm_90a"));
  CHECK(entry({64, 2, false, true}, "sm_90a") == entry({64, 2, false, false}, "sm_90a"));
  CHECK(entry({64, 2, false, false}, "sm_90a") != entry({64, 1, false, false}, "sm_90a"));
  CHECK(entry({128, 2, false, false}, "sm_90a") == entry({32, 2, false, false}, "sm_90a"));
  const auto merge_entry = [](int heads, const char* arch) {
    return kiln::make_build_request(sp::SparseMergePolicy{heads}.key(arch)).cache_key;
  };
  CHECK(merge_entry(8, "sm_90a") == merge_entry(128, "sm_90a"));
  CHECK(merge_entry(8, "sm_90a") != merge_entry(8, "sm_120a"));
  CHECK(entry({64, 1, false, false, sp::SparseKernel::kMmaSmall}, "sm_90a") != entry({64, 1, false, false}, "sm_90a"));
  CHECK(entry({64, 1, false, false, sp::SparseKernel::kSm90}, "sm_90a") != entry({64, 1, false, false}, "sm_90a"));

  const kiln::SemanticKey k = direct.key("sm_90a");
  CHECK(kiln::SemanticKey::parse(k.str()) == k);
  CHECK(k.str().rfind("sparse_nvfp4:sm_90a:has_extra=true,head_tiles=2,heads=128,kernel=mma,split=false:", 0) == 0);
  CHECK(hopper.key("sm_90a").str().rfind("sparse_nvfp4:sm_90a:has_extra=true,head_tiles=1,heads=96,kernel=sm90,split=true:", 0) == 0);
  CHECK(hopper.fingerprint() != sp::SparsePolicy{96, 1, true, true, sp::SparseKernel::kMma}.fingerprint());
  CHECK(hopper.fingerprint() != sp::SparsePolicy{96, 1, true, true, sp::SparseKernel::kMmaSmall}.fingerprint());
  CHECK(direct.fingerprint() != split.fingerprint());
  CHECK(direct.fingerprint() != sp::SparsePolicy{128, 2, true, true}.fingerprint());
  CHECK(direct.fingerprint() != sp::SparsePolicy{128, 1, true, false}.fingerprint());
  CHECK(direct.fingerprint() != sp::SparsePolicy{128, 2, false, false}.fingerprint());
  CHECK(direct.fingerprint() != sp::SparsePolicy{96, 2, true, false}.fingerprint());

  CHECK(sp::sparse_policy(64, true, {2, 4, 2}) == sp::SparsePolicy{64, 2, true, true});
  CHECK(sp::sparse_policy(8, false, {1, 1, 2}) == sp::SparsePolicy{8, 1, false, false});
  // The 16- and 64-head kernels map a two-tile plan onto their own blocks: one key for both tilings.
  CHECK(sp::sparse_policy(64, true, {2, 4, 2}, sp::SparseKernel::kSm90) == sp::SparsePolicy{64, 1, true, true, sp::SparseKernel::kSm90});
  CHECK(sp::sparse_policy(64, false, {2, 1, 8}, sp::SparseKernel::kMmaSmall) ==
        sp::SparsePolicy{64, 1, false, false, sp::SparseKernel::kMmaSmall});
}

TEST_CASE("sparse validation: the launcher's kernel per target", "[unit]") {
  using K = sp::SparseKernel;
  const sp::SplitPlanResult one{1, 1, 8}, two{2, 2, 16};
  CHECK(sp::choose_kernel(dev("sm_120a", 170), 512, 128, two) == K::kMmaSmall);
  CHECK(sp::choose_kernel(dev("sm_120a", 170), 1, 8, one) == K::kMmaSmall);
  // sm_90a: the Hopper kernel from a fifth of the SMs' worth of its 64-head blocks, for H a multiple of 64
  // or 32, unless the mma.sync grid runs as clusters; or wherever its splits can be dealt to CTAs of
  // >= 2 chunks each (>= 4 for H = 32).
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 64, 128, one) == K::kSm90);   // 128 blocks
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 64, 64, one) == K::kSm90);    // 64 blocks
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 16, 128, two) == K::kSm90);   // 64 blocks
  // 32 blocks, mma.sync's 64 CTAs would fit pairs of 8 chunks, but sm90 deals 2 slices of 8.
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 128, two) == K::kSm90);
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 64, two) == K::kSm90);     // 16 blocks, 4 slices of 4
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 512, 32, two) == K::kSm90);   // half the 64 rows padded
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 64, 32, two) == K::kSm90);
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 512, 16, two) == K::kMma);    // more padding: not measured faster
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 512, 96, two) == K::kMma);
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 14, 128, one) == K::kSm90);   // 28 blocks: 5 * 28 >= 132
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 13, 128, one) == K::kSm90);   // 26 blocks, dealt: 2 slices of 4
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 13, 128, {1, 1, 6}) == K::kSm90);  // 2 slices of 3
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 1, 8, one, K::kMmaSmall) == K::kMmaSmall);
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 1, 8, one, K::kSm90) == K::kSm90);
  // Whatever it picks without an override is listed for the target (what prebuild manifests use).
  for (const char* arch : {"sm_90a", "sm_120a"})
    for (int heads : {8, 16, 32, 48, 64, 96, 128})
      for (int tokens : {1, 8, 64, 512}) {
        const K k = sp::choose_kernel(dev(arch, 132), tokens, heads, two);
        const auto all = sp::sparse_kernels_for(arch, heads);
        CHECK(std::find(all.begin(), all.end(), k) != all.end());
      }
  expect_error([&] { sp::choose_kernel(dev("sm_120a", 132), 1, 64, one, K::kSm90); }, "kernel", {"sm_90a"}, ErrorCode::kUnsupported);
  // A target kiln has no kernel for is refused by name, never planned as another.
  expect_error([&] { sp::choose_kernel(dev("sm_100a", 148), 1, 64, one); }, "device", {"sm_100a"}, ErrorCode::kUnsupported);
  expect_error([&] { sp::sparse_kernels_for("sm_80", 64); }, "device", {"sm_80"}, ErrorCode::kUnsupported);
}

TEST_CASE("sparse validation: CTAs per cluster of an mma.sync launch", "[unit]") {
  // T = 1 on 132 SMs, H 64 / 512 candidates: 1 tile, 4 splits of 2 chunks (16 CTAs). A pair of CTAs
  // per split would spare each one chunk only: no cluster unless forced.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 64, {1, 4, 2}) == 1);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 64, {1, 4, 2}, true) == 2);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 64, {1, 16, 2}, true) == 2);
  // 3 chunks: one each on 3 CTAs spares two.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 64, {1, 4, 3}) == 3);
  // H 128 / 2048 candidates: 8 splits of 4 chunks on 8 head groups; 4 CTAs of one chunk would be 256
  // CTAs (two waves), 2 CTAs of 2 chunks fit.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 128, {1, 8, 4}) == 2);
  // Twice the SMs would hold the 256 CTAs, but not as 64 clusters of 4 (the H200's 30 per 132 SMs,
  // scaled: 60); 68 clusters' worth of SMs would.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 264), 1, 128, {1, 8, 4}) == 2);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 290), 1, 128, {1, 8, 4}) == 4);
  // 5 chunks: one each on 5 CTAs when they fit, else 3 + 2.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 2, 64, {1, 2, 5}) == 5);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 32), 2, 64, {1, 2, 5}) == 2);
  // At most 8 CTAs: 16 chunks as 8 pairs.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 16, {1, 1, 16}) == 8);
  // One chunk per split, or a full grid, or forced off: no cluster.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 64, {1, 8, 1}) == 1);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 64, 128, {2, 2, 16}) == 1);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 1, 64, {1, 4, 2}, false) == 1);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 32), 1, 64, {1, 4, 3}) == 1);   // 2 + 1 spares one chunk
  // Forced on: the fewest chunks per CTA regardless of the wave.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 64, 128, {2, 2, 16}, true) == 8);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 64, 128, {1, 8, 1}, true) == 1);
}

TEST_CASE("sparse validation: the plan a launch runs", "[unit]") {
  using K = sp::SparseKernel;
  // T = 1, 512 candidates (8 chunks), planned as 4 splits of 2: one cluster of 8 single-chunk CTAs per
  // head block runs them as one split (no merge) at H = 64 (32 CTAs) and H = 128 (64 CTAs).
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 8, {1, 4, 2}, true, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 1, 8});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 128, 8, {1, 4, 2}, true, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 1, 8});
  // As planned: a num_splits override, dealing forced off, another kernel, more chunks than a
  // cluster holds (2048 candidates), no split, or too many clusters (T = 8: 32 of 8).
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 8, {1, 4, 2}, false, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 8, {1, 4, 2}, true, false, K::kMma) == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 8, {1, 4, 2}, true, std::nullopt, K::kSm90) == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 8, {1, 4, 2}, true, std::nullopt, K::kMmaSmall) == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 32, {1, 16, 2}, true, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 16, 2});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 64, 8, {1, 1, 8}, true, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 1, 8});
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 8, 64, 8, {1, 2, 4}, true, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 2, 4});
  // 2 chunks never deal (one CTA each spares nothing).
  CHECK(sp::sparse_launch_plan(dev("sm_90a", 132), 1, 8, 2, {1, 2, 1}, true, std::nullopt, K::kMma) == sp::SplitPlanResult{1, 2, 1});
}

TEST_CASE("sparse validation: an sm90 launch runs more splits where the scratch holds them", "[unit]") {
  constexpr sp::SparseKernel kSm90 = sp::SparseKernel::kSm90;
  const sp::SparseDevice h = dev("sm_90a", 132);
  // T = 8, H = 64, 512 candidates planned as 2 splits of 4: with room for 8 splits, 8 of one chunk
  // (64 CTAs).
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, kSm90, 8) == sp::SplitPlanResult{1, 8, 1});
  // max_splits caps it (4 splits of 2), as it caps the planner.
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, kSm90, 8, 4) == sp::SplitPlanResult{1, 4, 2});
  // H = 128, 10 chunks planned as one split: 10 splits would be 160 CTAs, so 9 -> 2 chunks each -> 5
  // splits (80 CTAs), the largest normalised count that fits.
  CHECK(sp::sparse_launch_plan(h, 8, 128, 10, {1, 1, 10}, true, std::nullopt, kSm90, 10) == sp::SplitPlanResult{1, 5, 2});
  // H = 128, 2048 candidates: 8 splits of 4 chunks (128 CTAs); 16 would be two waves.
  CHECK(sp::sparse_launch_plan(h, 8, 128, 32, {2, 2, 16}, true, std::nullopt, kSm90, 32) == sp::SplitPlanResult{2, 8, 4});
  // As planned: no scratch, scratch for the plan's splits only, a num_splits override, dealing
  // forced either way, H not a multiple of 64, another kernel, or a grid already a wave (T = 64, H = 128).
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, kSm90, 0) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, kSm90, 2) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, false, std::nullopt, kSm90, 8) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, true, kSm90, 8) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, false, kSm90, 8) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 8, 96, 8, {1, 2, 4}, true, std::nullopt, kSm90, 8) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, sp::SparseKernel::kMmaSmall, 8) == sp::SplitPlanResult{1, 2, 4});
  CHECK(sp::sparse_launch_plan(h, 64, 128, 32, {2, 2, 16}, true, std::nullopt, kSm90, 32) == sp::SplitPlanResult{2, 2, 16});
  // mma.sync the same, by its 16-head blocks: T = 1, H = 64, 512 candidates with room for 8 splits
  // runs 8 of one chunk (32 CTAs) rather than one split dealt over a cluster of 8; 2048 candidates
  // stay at max_splits 16; T = 8 fits 4 splits of 2 (128 CTAs); forced either way, as planned.
  CHECK(sp::sparse_launch_plan(h, 1, 64, 8, {1, 4, 2}, true, std::nullopt, sp::SparseKernel::kMma, 8) == sp::SplitPlanResult{1, 8, 1});
  CHECK(sp::sparse_launch_plan(h, 1, 64, 32, {1, 16, 2}, true, std::nullopt, sp::SparseKernel::kMma, 32) == sp::SplitPlanResult{1, 16, 2});
  CHECK(sp::sparse_launch_plan(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, sp::SparseKernel::kMma, 8) == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::sparse_launch_plan(h, 1, 64, 8, {1, 4, 2}, true, false, sp::SparseKernel::kMma, 8) == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::sparse_launch_plan(h, 1, 64, 8, {1, 4, 2}, true, true, sp::SparseKernel::kMma, 8) == sp::SplitPlanResult{1, 1, 8});
  // Where the mma.sync runs give each CTA at most two chunks and its grid fits one wave, an unforced
  // launch takes mma.sync: T = 1, H = 128, 2048 candidates (planned 8 of 4, which choose_kernel gives
  // sm90) run as 16 of 2 on 128 mma.sync CTAs; T = 8, H = 64, 512 candidates as 4 of 2. Not where the
  // scratch holds only the plan, nor with a kernel or cluster override, nor at T = 8, H = 128
  // (mma.sync 2 of 4).
  const sp::SplitPlanResult h128{1, 8, 4};
  CHECK(sp::choose_kernel(h, 1, 128, h128) == sp::SparseKernel::kSm90);
  const sp::SparseLaunch m = sp::plan_sparse_launch(h, 1, 128, 32, h128, true, std::nullopt, std::nullopt, 32);
  CHECK(m.kernel == sp::SparseKernel::kMma);
  CHECK(m.runs == sp::SplitPlanResult{1, 16, 2});
  CHECK(m.cluster == 1);
  CHECK(sp::plan_sparse_launch(h, 1, 128, 32, h128, true, std::nullopt, std::nullopt, 8).kernel == kSm90);
  CHECK(sp::plan_sparse_launch(h, 1, 128, 32, h128, true, kSm90, std::nullopt, 32).kernel == kSm90);
  CHECK(sp::plan_sparse_launch(h, 1, 128, 32, h128, true, std::nullopt, false, 32).kernel == kSm90);
  CHECK(sp::plan_sparse_launch(h, 1, 128, 32, h128, false, std::nullopt, std::nullopt, 32).kernel == kSm90);
  CHECK(sp::plan_sparse_launch(h, 8, 128, 8, {1, 1, 8}, true, std::nullopt, std::nullopt, 8).kernel == kSm90);
  CHECK(sp::choose_kernel(h, 8, 64, {1, 2, 4}) == kSm90);
  const sp::SparseLaunch t8 = sp::plan_sparse_launch(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, std::nullopt, 8);
  CHECK(t8.kernel == sp::SparseKernel::kMma);
  CHECK(t8.runs == sp::SplitPlanResult{1, 4, 2});
  CHECK(sp::plan_sparse_launch(h, 8, 64, 8, {1, 2, 4}, true, std::nullopt, std::nullopt, 2).kernel == kSm90);
  // Three chunks a CTA with bulk gathers: T = 8, H = 64, 128 + 512 candidates (planned 2 of 5) as 4
  // of 3; not four (T = 8, H = 128, 512 candidates: mma.sync 2 of 4, above), nor three with two head
  // tiles (T = 11, H = 64, 1024 candidates: mma.sync 6 of 3 on 132 two-tile CTAs).
  const sp::SparseLaunch t8x = sp::plan_sparse_launch(h, 8, 64, 10, {1, 2, 5}, true, std::nullopt, std::nullopt, 10);
  CHECK(t8x.kernel == sp::SparseKernel::kMma);
  CHECK(t8x.runs == sp::SplitPlanResult{1, 4, 3});
  CHECK(t8x.bulk_gather);
  CHECK(sp::plan_sparse_launch(h, 11, 64, 16, {2, 4, 4}, true, sp::SparseKernel::kMma, std::nullopt, 16).runs == sp::SplitPlanResult{2, 6, 3});
  CHECK(sp::plan_sparse_launch(h, 11, 64, 16, {2, 4, 4}, true, std::nullopt, std::nullopt, 16).kernel == kSm90);
  // The whole launch: the sm90 kernel, no dealing on the wider plan.
  const sp::SparseLaunch l = sp::plan_sparse_launch(h, 8, 64, 8, {1, 2, 4}, true, kSm90, std::nullopt, 8);
  CHECK(l.runs == sp::SplitPlanResult{1, 8, 1});
  CHECK(l.cluster == 1);
  CHECK_FALSE(l.unpaired);  // one head group: nothing to pair
  // H = 128: 8 splits of one chunk (128 CTAs) and T = 1 / 2048 candidates as 16 of 2 run unpaired;
  // so do 8 of 4 (NVFP4's bound); 3 chunks at V4.1's bound of 2, a grid past one wave, a dealt split or
  // H <= 64 keep the pairs (or have none).
  const sp::SparseLaunch u = sp::plan_sparse_launch(h, 8, 128, 8, {1, 1, 8}, true, kSm90, std::nullopt, 8);
  CHECK(u.runs == sp::SplitPlanResult{1, 8, 1});
  CHECK(u.unpaired);
  CHECK(sp::plan_sparse_launch(h, 1, 128, 32, {1, 8, 4}, true, kSm90, std::nullopt, 32).unpaired);
  CHECK(sp::plan_sparse_launch(h, 8, 128, 32, {2, 2, 16}, true, kSm90, std::nullopt, 32).unpaired);
  CHECK(sp::sparse_sm90_unpaired(h, 8, 128, {1, 8, 2}, 1, sp::kDsv41UnpairedChunks));
  CHECK_FALSE(sp::sparse_sm90_unpaired(h, 8, 128, {1, 8, 3}, 1, sp::kDsv41UnpairedChunks));
  CHECK(sp::sparse_sm90_unpaired(h, 8, 128, {1, 8, 4}, 1, sp::kNvfp4UnpairedChunks));
  CHECK_FALSE(sp::sparse_sm90_unpaired(h, 8, 128, {1, 8, 5}, 1, sp::kNvfp4UnpairedChunks));
  CHECK_FALSE(sp::sparse_sm90_unpaired(h, 9, 128, {1, 8, 1}, 1, 2));  // 144 CTAs
  CHECK_FALSE(sp::sparse_sm90_unpaired(h, 8, 128, {1, 4, 2}, 2, 2));
  CHECK_FALSE(sp::sparse_sm90_unpaired(h, 8, 64, {1, 8, 1}, 1, 2));
  CHECK(sp::sparse_sm90_unpaired(h, 8, 96, {1, 8, 1}, 1, 2));  // two head groups, the second padded
}

TEST_CASE("sparse validation: how an mma.sync launch gathers its records", "[unit]") {
  const sp::SparseDevice h = dev("sm_90a", 132);
  constexpr auto kMma = sp::SparseKernel::kMma, kSm90 = sp::SparseKernel::kSm90;
  // Bulk copies with one head tile, cp.async with two, whatever the grid.
  CHECK(sp::sparse_bulk_gather({1, 2, 16}));
  CHECK(sp::sparse_bulk_gather({1, 16, 2}));
  CHECK_FALSE(sp::sparse_bulk_gather({2, 2, 16}));
  CHECK_FALSE(sp::sparse_bulk_gather({2, 1, 8}));
  // The launch carries the choice for mma.sync only: T = 1, H = 128, 2048 candidates (16 splits of 2
  // on 128 CTAs) gathers by bulk copies; the sm90 launch of the same call and a forced cp.async do not.
  const sp::SplitPlanResult h128{1, 8, 4};
  const sp::SparseLaunch m = sp::plan_sparse_launch(h, 1, 128, 32, h128, true, std::nullopt, std::nullopt, 32);
  REQUIRE(m.kernel == kMma);
  CHECK(m.bulk_gather);
  CHECK_FALSE(sp::plan_sparse_launch(h, 1, 128, 32, h128, true, kSm90, std::nullopt, 32).bulk_gather);
  CHECK_FALSE(sp::plan_sparse_launch(h, 1, 128, 32, h128, true, std::nullopt, std::nullopt, 32, 16, false).bulk_gather);
  // Forced on: any mma.sync launch (two head tiles too); on another kernel it is refused, naming it.
  CHECK(sp::plan_sparse_launch(h, 64, 64, 32, {2, 2, 16}, true, kMma, std::nullopt, 32, 16, true).bulk_gather);
  expect_error([&] { sp::plan_sparse_launch(h, 1, 128, 32, h128, true, kSm90, std::nullopt, 32, 16, true); }, "bulk_gather",
               {"mma", "sm90"});
  expect_error([&] { sp::plan_sparse_launch(dev("sm_120a", 188), 1, 64, 32, {1, 16, 2}, true, std::nullopt, std::nullopt, 32, 16, true); },
               "bulk_gather", {"mma_small"});
}

TEST_CASE("sparse validation: CTAs per head group sharing a split of an sm90 launch", "[unit]") {
  using K = sp::SparseKernel;
  constexpr K kSm90 = K::kSm90;
  // T = 8, H 64 / 2048 candidates: 2 splits of 16 chunks on 16 CTAs. 8 CTAs of 2 chunks would fill
  // 128 SMs, but only 15 clusters of 8 are resident at once on the H200: 6 CTAs of 3 chunks (16
  // clusters of 6 fit, 17 would).
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 64, {1, 2, 16}, std::nullopt, kSm90) == 6);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 64, {1, 2, 16}, true, kSm90) == 8);
  // Half the SMs (the counts halved: 7 clusters of 8, 8 of 6, 15 of 4): 8 (token, split) pairs on
  // 6 CTAs each, 12 on 4.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 66), 4, 64, {1, 2, 16}, std::nullopt, kSm90) == 6);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 66), 6, 64, {1, 2, 16}, std::nullopt, kSm90) == 4);
  // H 128: the cluster pair counts twice against 8 CTAs, so at most 4 slices; 16 (token, split)
  // pairs: 16 clusters of 8 CTAs do not fit, 16 of 6 do (3 slices of 6 chunks).
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 128, {2, 2, 16}, std::nullopt, kSm90) == 3);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 128, {2, 2, 16}, true, kSm90) == 4);
  // T = 4: 8 pairs, 8 clusters of 8 (4 slices of 4 chunks).
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 4, 128, {1, 2, 16}, std::nullopt, kSm90) == 4);
  // The same plan on mma.sync counts 16-head CTAs: 4 times as many, so a pair of CTAs fills the grid.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 64, {1, 2, 16}) == 2);
  // 512 tokens: the grid is full without dealing; forced off; the compact kernel never deals.
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 512, 64, {1, 2, 16}, std::nullopt, kSm90) == 1);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 64, {1, 2, 16}, false, kSm90) == 1);
  CHECK(sp::sparse_cluster_size(dev("sm_90a", 132), 8, 64, {1, 2, 16}, true, K::kMmaSmall) == 1);
  // The launcher takes sm90 where its slices keep >= 2 chunks (4 for H = 32), or 1 against mma.sync
  // CTAs of >= 2; mma.sync where not.
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 64, {1, 2, 16}) == kSm90);
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 4, 128, {1, 2, 16}) == kSm90);
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 128, {1, 1, 8}) == kSm90);   // 4 slices of 2
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 64, {1, 2, 4}) == kSm90);   // 4 slices of 1 against mma.sync pairs of 2
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 64, {1, 2, 5}) == kSm90);   // 5 slices of 1 against pairs of 3 and 2
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 1, 128, {1, 8, 4}) == kSm90);  // 4 slices of 1 (pairs) against mma.sync pairs of 2
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 1, 64, {1, 4, 2}) == K::kMma);  // 2 chunks: no slices
  CHECK(sp::choose_kernel(dev("sm_90a", 132), 8, 32, {1, 4, 8}) == K::kMma);  // H = 32: 4 slices of 2
}
