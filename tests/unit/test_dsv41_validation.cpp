// Host validation, variant and plan resolution of the sparse DeepSeek-V4.1 decode launcher
// (runtime/sparse_dsv41/README.md), and its policy, key and render. Host only: tensors are fake,
// aligned, non-overlapping addresses that are never dereferenced, so every call that reaches the
// driver is a bug; the engine API is only called where validation must fail first (or T == 0).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/kernel_templates/sparse_dsv41/params.cuh"
#include "kiln/runtime/families.h"
#include "kiln/runtime/paged_cache_view.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "kiln/runtime/sparse_dsv41/planner.h"
#include "tests/support/expect_error.h"
#include "tests/support/fake_decode_call.h"
#include "tests/support/h200_residency.h"

namespace {

using kiln::DType;
using kiln::Error;
using kiln::ErrorCode;
using kiln::TensorView;
namespace d = kiln::dsv41;

using namespace kiln::testing::fake;  // region constants, view, cache3

const d::Dsv41Device kH200{"sm_90a", 132, false, kiln::testing::h200_residency()};
const d::Dsv41Device kRtx{"sm_120a", 188, false};

struct Call : DecodeCall<Call, d::Dsv41Options> {
  Call(int t = 4, int h = 64, int k = 128) : DecodeCall(t, h, k, 528, 288) {}

  d::Dsv41Plan plan(const d::Dsv41Device& device = kH200) const {
    return d::plan_dsv41_decode(q, kv, indices, output, out_lse, sm_scale, opt, device);
  }
  d::Dsv41Plan run() const { return d::cake_sparse_mla_sm120_dsv41_mixed_decode(q, kv, indices, output, out_lse, sm_scale, opt, nullptr); }
};

using kiln::testing::expect_error;  // (call, argument, message parts, code)
using kiln::testing::expect_rejected;

}  // namespace

TEST_CASE("dsv41 validation: a well-formed call plans without a driver", "[unit]") {
  Call c;
  // sm_90a, H = 64: 2 chunks, base 4 * 2 = 8, 80 <= 132: 2 splits; 8 sm90 CTAs are at most a
  // quarter of the SMs, so "default".
  CHECK(c.with_mid(2).plan() == d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 2, 1, 0});
  Call rtx;
  rtx.with_mid(2);
  CHECK(rtx.plan(kRtx) == d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 2, 1, 0});

  Call full(4, 64, 128);
  full.with_extra(512).with_mid(16);
  full.opt.topk_length = view(kLen, DType::kI32, {8});
  full.opt.attn_sink = view(kSink, DType::kF32, {64});
  full.opt.extra_topk_length = view(kXLen, DType::kI32, {4});
  full.opt.lse_scale = std::log(2.0);
  const d::Dsv41Plan p = full.plan();
  // 10 chunks, base 8 on 132 SMs: cap 151, one chunk per block fits: 10 splits; 40 sm90 CTAs.
  CHECK(p == d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 10, 1, 0});
  CHECK(p == d::resolve_dsv41_plan(4, 64, 128, 512, kH200, d::Dsv41Variant::kSm90, std::nullopt, 16, true));
}

TEST_CASE("dsv41 validation: the plan follows the companion planners (ragged, head tiles, unified memory)", "[unit]") {
  // (32, 64, 128 + 512) on 188 SMs: (3, 4), or (4, 3) when a length tensor makes the call ragged.
  const d::Dsv41Device big{"sm_90a", 188, false};
  Call c(32, 64, 128);
  c.with_extra(512).with_mid(10);
  CHECK(c.plan(big) == d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 3, 4, 0});
  c.opt.extra_topk_length = view(kXLen, DType::kI32, {32});
  CHECK(c.plan(big) == d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 4, 3, 0});
  c.opt.extra_topk_length.reset();
  c.opt.topk_length = view(kLen, DType::kI32, {32});
  CHECK(c.plan(big) == d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 4, 3, 0});
  // The "default" variant reports one tile but plans with plan_head_tiles's two, like upstream.
  c.opt.variant = "default";
  CHECK(c.plan(big) == d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 4, 3, 0});
  // GB10's policy through the device description: (1, 64, 128 + 512) on 48 unified SMs -> (5, 2).
  Call g(1, 64, 128);
  g.with_extra(512).with_mid(10);
  CHECK(g.plan(d::Dsv41Device{"sm_120a", 48, true}) == d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 5, 2, 0});
  // An explicit num_splits is normalised and max_splits is not consulted (5 sm90 CTAs: "default").
  g.opt.num_splits = 7;
  g.opt.max_splits = 1;
  CHECK(g.plan() == d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 5, 2, 0});
}

TEST_CASE("dsv41 validation: variant choice and refusal", "[unit]") {
  for (int h : d::supported_heads()) {
    INFO("H " << h);
    CHECK(d::resolve_variant("sm_90a", h, std::nullopt) == std::nullopt);
    CHECK(d::resolve_variant("sm_90a", h, "default") == d::Dsv41Variant::kDefault);
    CHECK(d::resolve_variant("sm_90a", h, "sm90") == d::Dsv41Variant::kSm90);
    const std::vector<d::Dsv41Variant> both{d::Dsv41Variant::kDefault, d::Dsv41Variant::kSm90};
    CHECK(d::dsv41_variants_for("sm_90a", h) == (h >= 32 ? both : std::vector{d::Dsv41Variant::kDefault}));
    CHECK(d::dsv41_variants_for("sm_120a", h) == std::vector{d::Dsv41Variant::kDefault});
    // One token on 10 one-chunk splits: 10-20 sm90 CTAs; on 16 two-chunk ones 16-32: at most a
    // quarter of 132 SMs. 8 tokens on 5 splits: 40-80 sm90 CTAs.
    CHECK(d::choose_variant(kH200, 1, h, {10, 1}) == d::Dsv41Variant::kDefault);
    CHECK(d::choose_variant(kH200, 1, h, {16, 2}) == d::Dsv41Variant::kDefault);
    CHECK(d::choose_variant(kH200, 8, h, {5, 2}) == (h >= 32 ? d::Dsv41Variant::kSm90 : d::Dsv41Variant::kDefault));
    // 64 tokens, one split of 10 chunks: 64 x ceil(H / 64) CTAs, and at H 64 each split is dealt to a
    // pair (5 chunks each).
    CHECK(d::choose_variant(kH200, 64, h, {1, 10}) == (h >= 32 ? d::Dsv41Variant::kSm90 : d::Dsv41Variant::kDefault));
    CHECK(d::choose_variant(kRtx, 64, h, {1, 10}) == d::Dsv41Variant::kDefault);
    CHECK(d::variant_head_tiles(d::Dsv41Variant::kDefault, h) == 1);
    CHECK(d::variant_head_tiles(d::Dsv41Variant::kSm90, h) == d::plan_head_tiles(1, h, 128, 0, 132));
  }
  expect_error([] { d::resolve_variant("sm_100a", 64, std::nullopt); }, "device", {"sm_100a"}, ErrorCode::kUnsupported);
  expect_error([] { d::choose_variant({"sm_100a", 132, false}, 64, 64, {1, 10}); }, "device", {"sm_100a"}, ErrorCode::kUnsupported);
  // H 64: a split of 10 chunks dealt to two CTAs of 5 (128 CTAs fit 132 SMs); 5 chunks are not dealt
  // (each CTA would be spared fewer than two); "default" is never dealt.
  CHECK(d::dsv41_cluster_size(kH200, 64, 64, {d::Dsv41Variant::kSm90, 2, 1, 10, 0}) == 2);
  CHECK(d::dsv41_cluster_size(kH200, 64, 64, {d::Dsv41Variant::kSm90, 2, 1, 10, 0}, false) == 1);
  CHECK(d::dsv41_cluster_size(kH200, 64, 64, {d::Dsv41Variant::kDefault, 1, 1, 10, 0}) == 1);
  // T 8, H 128, 2048 candidates planned as 4 splits of 8: with scratch for 32 splits, 8 of 4 chunks
  // (128 CTAs; 16 would be two waves); none, a num_splits override or "default": as planned.
  const d::Dsv41Plan planned{d::Dsv41Variant::kSm90, 2, 4, 8, 0};
  CHECK(d::dsv41_launch_plan(kH200, 8, 128, 32, planned, true, std::nullopt, 32) == d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 8, 4, 0});
  CHECK(d::dsv41_launch_plan(kH200, 8, 128, 32, planned, true, std::nullopt, 0) == planned);
  CHECK(d::dsv41_launch_plan(kH200, 8, 128, 32, planned, false, std::nullopt, 32) == planned);
  const d::Dsv41Plan compact{d::Dsv41Variant::kDefault, 1, 4, 8, 0};
  CHECK(d::dsv41_launch_plan(kH200, 8, 128, 32, compact, true, std::nullopt, 32) == compact);
  // The staged body: "default" on sm_90a only.
  const d::Dsv41Plan sm90_runs{d::Dsv41Variant::kSm90, 2, 4, 8, 0};
  CHECK(d::dsv41_bulk_gather(kH200, 8, 128, false, compact, std::nullopt));
  CHECK(d::dsv41_bulk_gather(kH200, 8, 128, false, compact, true));
  CHECK_FALSE(d::dsv41_bulk_gather(kH200, 8, 128, false, compact, false));
  CHECK_FALSE(d::dsv41_bulk_gather(kRtx, 8, 128, false, compact, std::nullopt));
  CHECK_FALSE(d::dsv41_bulk_gather(kH200, 8, 128, false, sm90_runs, false));
  expect_error([&] { d::dsv41_bulk_gather(kH200, 8, 128, false, sm90_runs, true); }, "bulk_gather",
               {"\"default\" variant on sm_90a", "\"sm90\""});
  expect_error([&] { d::dsv41_bulk_gather(kRtx, 8, 128, false, compact, true); }, "bulk_gather", {"sm_120a"});
  // With the extra pool the compact body runs one wave of one-chunk CTAs: 1 token of 64 heads as 10
  // splits is 40 CTAs. Not without the pool, nor at 8 tokens (320 CTAs), nor with two chunks a CTA,
  // nor when the staged body is asked for.
  const d::Dsv41Plan single{d::Dsv41Variant::kDefault, 1, 10, 1, 0};
  CHECK_FALSE(d::dsv41_bulk_gather(kH200, 1, 64, true, single, std::nullopt));
  CHECK(d::dsv41_bulk_gather(kH200, 1, 64, false, single, std::nullopt));
  CHECK(d::dsv41_bulk_gather(kH200, 8, 64, true, single, std::nullopt));
  CHECK(d::dsv41_bulk_gather(kH200, 1, 64, true, d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 5, 2, 0}, std::nullopt));
  CHECK(d::dsv41_bulk_gather(kH200, 1, 64, true, single, true));
  CHECK(std::string(d::dsv41_variant_name(d::Dsv41Variant::kDefault)) == "default");
  CHECK(std::string(d::dsv41_variant_name(d::Dsv41Variant::kSm90)) == "sm90");

  Call c(4, 16, 128);
  c.with_mid(2);
  CHECK(c.plan().variant == d::Dsv41Variant::kDefault);
  c.opt.variant = "sm90";  // pinned: honoured for H = 16 on sm_90a, one 64-head block
  CHECK(c.plan() == d::Dsv41Plan{d::Dsv41Variant::kSm90, 1, 2, 1, 0});
  expect_error([&] { c.plan(kRtx); }, "variant", {"not exported", "sm_120a"});
  c.opt.variant = "ip+pw";
  expect_rejected(c, "variant", {"unknown exact variant", "'ip+pw'"});
  c.opt.variant = "";
  expect_rejected(c, "variant", {"unknown exact variant"});
}

TEST_CASE("dsv41 validation: compute_precision", "[unit]") {
  CHECK(d::resolve_precision("default") == 0);
  CHECK(d::resolve_precision("bf16") == 0);
  Call c;
  c.with_mid(2);
  c.opt.compute_precision = "default";
  CHECK(c.plan().precision == 0);
  c.opt.compute_precision = "fp8";
  expect_rejected(c, "compute_precision", {"(\"bf16\",)"}, ErrorCode::kUnsupported);
  for (const char* bad : {"fp16", "BF16", "", "float32"}) {
    c.opt.compute_precision = bad;
    expect_rejected(c, "compute_precision", {"compute_precision"});
  }
}

TEST_CASE("dsv41 validation: every refusal carries its upstream phrase", "[unit]") {
  SECTION("heads") {
    for (int h : {24, 40, 56, 72, 88, 104, 120, 4, 136}) {
      Call c(4, h);
      expect_rejected(c, "q", {"query heads"});
    }
  }
  SECTION("q") {
    Call c;
    c.q = view(kQ, DType::kBf16, {4, 64, 576});
    expect_rejected(c, "q", {"q must be [T, H, 512]"});
    c.q = view(kQ, DType::kBf16, {4, 64});
    expect_rejected(c, "q", {"q must be [T, H, 512]"});
    c.q = view(kQ, DType::kF16, {4, 64, 512});
    expect_rejected(c, "q", {"contiguous CUDA bfloat16"});
    c.q = view(kQ, DType::kBf16, {4, 64, 512});
    c.q.strides[0] = 64 * 512 * 2;
    expect_rejected(c, "q", {"contiguous CUDA bfloat16"});
  }
  SECTION("output and out_lse") {
    Call c;
    c.output = view(kOut, DType::kBf16, {4, 32, 512});
    expect_rejected(c, "output", {"output must be"});
    c.output = view(kOut, DType::kF32, {4, 64, 512});
    expect_rejected(c, "output", {"output must be"});
    Call l;
    l.out_lse = view(kLse, DType::kBf16, {4, 64});
    expect_rejected(l, "out_lse", {"out_lse must be"});
    l.out_lse = view(kLse, DType::kF32, {4, 64, 1});
    expect_rejected(l, "out_lse", {"out_lse must be"});
  }
  SECTION("indices and extra_indices") {
    Call c;
    c.indices = view(kIdx, DType::kI64, {4, 128});
    expect_rejected(c, "indices", {"int32"});
    c.indices = view(kIdx, DType::kI32, {4, 2, 128});
    expect_rejected(c, "indices", {"int32"});
    c.indices = view(kIdx, DType::kI32, {3, 128});
    expect_rejected(c, "indices", {"rows"});
    c.indices = view(kIdx, DType::kI32, {4, 0});
    expect_rejected(c, "indices", {"at least one slot"});
    c.indices = view(kIdx, DType::kI32, {4, 1, 128});  // [T, 1, topk] is accepted
    CHECK(c.with_mid(2).plan().num_splits == 2);
    Call x;
    x.with_extra(512);
    x.opt.extra_indices = view(kXIdx, DType::kI32, {4, 0});  // unlike the NVFP4 entry, an empty extra section is refused
    expect_rejected(x, "extra_indices", {"at least one slot"});
    x.opt.extra_indices = view(kXIdx, DType::kI32, {5, 512});
    expect_rejected(x, "extra_indices", {"rows"});
    x.opt.extra_indices = view(kXIdx, DType::kF32, {4, 512});
    expect_rejected(x, "extra_indices", {"int32"});
  }
  SECTION("main and extra caches") {
    Call c;
    c.kv = cache3(kKv, 16, 64, 384);  // a V4 NVFP4 cache
    expect_rejected(c, "kv_cache", {"528"});
    c.kv = cache3(kKv, 16, 64, 288);  // an extra cache as the main one
    expect_rejected(c, "kv_cache", {"528"});
    Call x;
    x.with_extra(512);
    x.opt.extra_kv_cache = cache3(kXKv, 16, 64, 528);  // FlashMLA's FP8 + FP8 pairing
    expect_rejected(x, "extra_kv_cache", {"288"});
    x.opt.extra_kv_cache = view(kXKv, DType::kU8, {16, 64 * 528});
    expect_rejected(x, "extra_kv_cache", {"multiple of 288"});
    c.kv = view(kKv, DType::kU8, {16, 64 * 384});
    expect_rejected(c, "kv_cache", {"multiple of 528"});
  }
  SECTION("extra pool pairing, lengths and sink") {
    Call c;
    c.opt.extra_kv_cache = cache3(kXKv, 64, 2, 288);
    expect_rejected(c, "extra_indices", {"provided together"});
    Call i;
    i.opt.extra_indices = view(kXIdx, DType::kI32, {4, 512});
    expect_rejected(i, "extra_kv_cache", {"provided together"});
    Call l;
    l.opt.extra_topk_length = view(kXLen, DType::kI32, {4});
    expect_rejected(l, "extra_topk_length", {"requires extra_indices"});
    Call t;
    t.opt.topk_length = view(kLen, DType::kI64, {4});
    expect_rejected(t, "topk_length", {"1-D int32 tensor with at least"});
    t.opt.topk_length = view(kLen, DType::kI32, {3});
    expect_rejected(t, "topk_length", {"1-D int32 tensor with at least"});
    t.opt.topk_length = view(kLen, DType::kI32, {4, 1});
    expect_rejected(t, "topk_length", {"1-D int32 tensor with at least"});
    Call x;
    x.with_extra(512);
    x.opt.extra_topk_length = view(kXLen, DType::kI32, {2});
    expect_rejected(x, "extra_topk_length", {"1-D int32 tensor with at least"});
    Call s;
    s.opt.attn_sink = view(kSink, DType::kBf16, {64});
    expect_rejected(s, "attn_sink", {"1-D float32 tensor with at least"});
    s.opt.attn_sink = view(kSink, DType::kF32, {63});
    expect_rejected(s, "attn_sink", {"1-D float32 tensor with at least"});
  }
  SECTION("head_tiles, num_splits and max_splits") {
    Call c;
    c.with_mid(16);
    // On sm_90a head_tiles names a variant (1: "default" for H = 64, 2: "sm90"), unless one is pinned.
    c.opt.head_tiles = 1;
    CHECK(c.plan().variant == d::Dsv41Variant::kDefault);
    c.opt.variant = "sm90";
    expect_error([&] { c.plan(); }, "head_tiles", {"head_tiles", "'sm90'"});
    c.opt.variant.reset();
    c.opt.head_tiles = 2;
    CHECK(c.plan().head_tiles == 2);
    CHECK(c.plan().variant == d::Dsv41Variant::kSm90);
    expect_error([&] { c.plan(kRtx); }, "head_tiles", {"head_tiles", "'default'"});
    c.opt.head_tiles.reset();
    c.opt.num_splits = 0;
    expect_rejected(c, "num_splits", {"num_splits must be positive"});
    Call big(4, 64, 1024);
    big.with_extra(1024).with_mid(32);
    big.opt.num_splits = 1;
    expect_rejected(big, "num_splits", {"at most"});
    big.opt.num_splits.reset();
    big.opt.max_splits = 1;
    expect_rejected(big, "max_splits", {"splits (at most 16 chunks per block), max_splits=1"});
  }
  SECTION("scratch") {
    Call c;  // 2 chunks on 132 SMs split in two (a plan of the device: plan-only)
    expect_error([&] { c.plan(); }, "mid_out", {"mid_out"});
    c.with_mid(1);
    expect_error([&] { c.plan(); }, "mid_out", {"S >= num_splits = 2"});
    Call always(4, 64, 1024);  // 2048 candidates split on every device: refused before the driver
    always.with_extra(1024);
    expect_rejected(always, "mid_out", {"mid_out"});
    Call s;
    s.with_mid(2);
    s.opt.mid_out = view(kMidOut, DType::kF32, {4, 64, 2, 512});
    expect_rejected(s, "mid_out", {"mid_out must be"});
    s.with_mid(2);
    s.opt.mid_lse = view(kMidLse, DType::kF32, {4, 64, 3});
    expect_rejected(s, "mid_lse", {"mid_lse must be"});
    s.opt.mid_lse = view(kMidLse, DType::kBf16, {4, 64, 2});
    expect_rejected(s, "mid_lse", {"mid_lse must be"});
    Call one;  // num_splits = 1 needs no scratch
    one.opt.num_splits = 1;
    CHECK(one.plan().num_splits == 1);
  }
  SECTION("aliasing") {
    Call c;
    c.with_mid(2);
    c.output = view(kQ, DType::kBf16, {4, 64, 512});
    expect_rejected(c, "output", {"must not overlap"});
  }
}

TEST_CASE("dsv41 cache views: every accepted view and each refusal", "[unit]") {
  using kiln::check_record_cache;
  const auto geometry = [](const TensorView& v, int record) {
    const kiln::PagedCacheGeometry g = check_record_cache(v, "kv_cache", record);
    return std::vector<std::int64_t>{g.pages, g.page_size, g.page_stride};
  };
  for (int record : {528, 288}) {
    INFO("record " << record);
    for (std::int64_t page : {1, 2, 32, 48, 53, 61, 64, 128}) {
      INFO("page " << page);
      const std::vector<std::int64_t> want{7, page, page * record};
      CHECK(geometry(view(kKv, DType::kU8, {7, page * record}), record) == want);
      CHECK(geometry(view(kKv, DType::kU8, {7, page, record}), record) == want);
      CHECK(geometry(view(kKv, DType::kU8, {7, 1, page, record}), record) == want);
      CHECK(geometry(view(kKv, DType::kU8, {7, page, 1, record}), record) == want);
      // A padded pool (+128 B per page).
      TensorView padded = view(kKv, DType::kU8, {7, page, record});
      padded.strides[0] = page * record + 128;
      CHECK(geometry(padded, record) == std::vector<std::int64_t>{7, page, page * record + 128});
    }
    // One page of one row: any per-token stride is moot.
    TensorView single = view(kKv, DType::kU8, {1, 1, 1, record});
    single.strides[2] = 7;
    CHECK(geometry(single, record) == std::vector<std::int64_t>{1, 1, record});
  }

  const auto refuses = [](const TensorView& v, int record, std::initializer_list<std::string> parts,
                          ErrorCode code = ErrorCode::kInvalidArgument) {
    expect_error([&] { check_record_cache(v, "kv_cache", record); }, "kv_cache", parts, code);
  };
  refuses(view(kKv, DType::kI8, {4, 64, 528}), 528, {"torch.uint8"});
  refuses(view(kKv, DType::kU8, {4, 64, 384}), 528, {"528"});
  refuses(view(kKv, DType::kU8, {4, 64, 528}), 288, {"288"});
  refuses(view(kKv, DType::kU8, {4, 64 * 528 + 16}), 528, {"multiple of 528"});
  refuses(view(kKv, DType::kU8, {4, 0}), 288, {"multiple of 288"});
  refuses(view(kKv, DType::kU8, {4, 2, 32, 528}), 528, {"singleton"});
  TensorView unpacked = view(kKv, DType::kU8, {4, 64, 528});
  unpacked.strides[0] = 64 * 544;
  unpacked.strides[1] = 544;  // INLINE-like per-token stride with padding
  refuses(unpacked, 528, {"packed"});
  TensorView strided = view(kKv, DType::kU8, {4, 64, 528});
  strided.strides[2] = 2;
  refuses(strided, 528, {"contiguous"});
  refuses(view(kKv, DType::kU8, {528}), 528, {"rank"});
  refuses(view(kKv, DType::kU8, {2, 2, 1, 4, 528}), 528, {"rank"});
  refuses(view(kKv, DType::kU8, {0, 64, 528}), 528, {"at least one page"});
  refuses(view(kKv, DType::kU8, {4, 0, 528}), 528, {"at least one page"});
  TensorView tight = view(kKv, DType::kU8, {4, 64, 528});
  tight.strides[0] = 63 * 528;
  refuses(tight, 528, {"smaller than"});
  TensorView one_page = view(kKv, DType::kU8, {1, 64, 528});
  one_page.strides[0] = 528;  // a page stride below the page is refused even for one page
  refuses(one_page, 528, {"smaller than"});
  TensorView odd = view(kKv, DType::kU8, {4, 61, 528});
  odd.strides[0] = 61 * 528 + 8;
  refuses(odd, 528, {"multiple of 16"});
  refuses(TensorView::contiguous(addr(kKv + 8), DType::kU8, {4, 64, 528}), 528, {"16-byte aligned"});
}

TEST_CASE("dsv41 validation: T == 0 returns the plan without the driver", "[unit]") {
  Call c(0, 64, 128);
  c.with_extra(512);
  // 10 chunks, no blocks: one chunk per split; no scratch is needed with no token.
  const d::Dsv41Plan want{d::Dsv41Variant::kDefault, 1, 10, 1, 0};
  CHECK(c.run() == want);
  CHECK(c.plan() == want);
  c.opt.variant = "sm90";
  CHECK(c.run() == d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 10, 1, 0});
  // Still validated first.
  c.opt.compute_precision = "fp8";
  expect_error([&] { c.run(); }, "compute_precision", {}, ErrorCode::kUnsupported);
}

TEST_CASE("dsv41 policy: fields, key, render", "[unit]") {
  kiln::register_builtin_families();
  const d::Dsv41Policy plain{64, true, false, d::Dsv41Variant::kDefault};
  const d::Dsv41Policy hopper{128, false, true, d::Dsv41Variant::kSm90};
  CHECK(plain.key("sm_120a").str().rfind("sparse_dsv41:sm_120a:has_extra=true,heads=64,split=false,variant=default:", 0) == 0);
  CHECK(hopper.key("sm_90a").str().rfind("sparse_dsv41:sm_90a:has_extra=false,heads=128,split=true,variant=sm90:", 0) == 0);
  CHECK(plain.fingerprint() != d::Dsv41Policy{64, true, false, d::Dsv41Variant::kSm90}.fingerprint());
  CHECK(plain.fingerprint() != d::Dsv41Policy{64, true, true, d::Dsv41Variant::kDefault}.fingerprint());
  expect_error([&] { hopper.key("sm_120a"); }, "variant", {"sm_90a"}, ErrorCode::kUnsupported);
  for (int h : {24, 0, 136, 7}) {
    expect_error([&] { d::Dsv41Policy{h, false, false, d::Dsv41Variant::kDefault}.validate(); }, "heads", {"48"});
  }
  for (int h : d::supported_heads()) d::Dsv41Policy{h, false, false, d::Dsv41Variant::kDefault}.validate();

  const kiln::Family& f = kiln::find_family("sparse_dsv41");
  const nlohmann::json canonical = f.canonicalize({{"heads", 128}, {"variant", "sm90"}, {"split", true}});
  CHECK(canonical == nlohmann::json{{"heads", 128}, {"has_extra", false}, {"split", true}, {"variant", "sm90"}});
  const kiln::KernelSource s1 = f.render(canonical);
  // H > 64: the pair kernel, then the one-group kernel an unpaired launch runs.
  REQUIRE(s1.name_expressions.size() == 2);
  CHECK(s1.name_expressions[0] == "kiln::sparse_dsv41_sm90_kernel<2, false>");
  CHECK(s1.name_expressions[1] == "kiln::sparse_dsv41_sm90_kernel<1, false, true>");
  CHECK(f.render(f.canonicalize({{"heads", 64}, {"variant", "sm90"}})).name_expressions ==
        std::vector<std::string>{"kiln::sparse_dsv41_sm90_kernel<1, false>"});
  CHECK(s1.source.find("sparse_dsv41/kernel_sm90.cuh") != std::string::npos);
  // split and H are run-time values of the kernels: not rendered (the sm90 kernel names its head
  // groups), so keys that differ only in them share one cache entry; has_extra is a template
  // argument. The merge is the NVFP4 family's sparse_merge module, the key's companion.
  const kiln::KernelSource s2 = f.render(f.canonicalize({{"heads", 8}, {"has_extra", true}}));
  REQUIRE(s2.name_expressions.size() == 2);
  CHECK(s2.name_expressions[0] == "kiln::sparse_dsv41_decode_kernel<true>");
  CHECK(s2.name_expressions[kiln::kDsv41StagedEntry] == "kiln::sparse_dsv41_staged_kernel<true>");
  CHECK(s2.source.find("sparse_dsv41/kernel.cuh") != std::string::npos);
  const std::vector<kiln::SemanticKey> companions = kiln::companion_keys(kiln::SemanticKey("sparse_dsv41", canonical, "sm_90a"));
  REQUIRE(companions.size() == 1);
  CHECK(companions[0] == kiln::sparse::SparseMergePolicy{128}.key("sm_90a"));
  const auto entry = [](const d::Dsv41Policy& p, const char* arch) { return kiln::make_build_request(p.key(arch)).cache_key; };
  for (const d::Dsv41Variant variant : {d::Dsv41Variant::kDefault, d::Dsv41Variant::kSm90}) {
    const kiln::CacheKey base = entry({64, false, false, variant}, "sm_90a");
    CHECK(entry({64, false, true, variant}, "sm_90a") == base);
    CHECK(entry({64, true, false, variant}, "sm_90a") != base);
    CHECK(entry({64, true, true, variant}, "sm_90a") == entry({64, true, false, variant}, "sm_90a"));
    if (variant == d::Dsv41Variant::kSm90) CHECK(entry({128, false, false, variant}, "sm_90a") != base);  // a cluster pair
    else CHECK(entry({128, false, false, variant}, "sm_90a") == base);
    CHECK(entry({32, false, false, variant}, "sm_90a") == base);
  }
  CHECK(entry({64, false, false, d::Dsv41Variant::kDefault}, "sm_120a") != entry({64, false, false, d::Dsv41Variant::kDefault}, "sm_90a"));
  CHECK(entry({64, false, false, d::Dsv41Variant::kSm90}, "sm_90a") != entry({64, false, false, d::Dsv41Variant::kDefault}, "sm_90a"));
  CHECK_THROWS_AS(f.canonicalize({{"heads", 64}, {"variant", "ip+pw"}}), Error);
  CHECK_THROWS_AS(f.canonicalize({{"heads", 24}}), Error);
  CHECK_THROWS_AS(f.canonicalize({{"variant", "default"}}), Error);  // heads has no default
  CHECK_THROWS_AS(f.canonicalize({{"heads", 64}, {"head_tiles", 2}}), Error);

  // The key a plan launches.
  CHECK(d::dsv41_policy(64, true, d::Dsv41Plan{d::Dsv41Variant::kSm90, 2, 3, 4, 0}) ==
        d::Dsv41Policy{64, true, true, d::Dsv41Variant::kSm90});
  CHECK(d::dsv41_policy(16, false, d::Dsv41Plan{d::Dsv41Variant::kDefault, 1, 1, 2, 0}) ==
        d::Dsv41Policy{16, false, false, d::Dsv41Variant::kDefault});
}
