// The GPU suites' conformance matrices (tests/support/mla_matrix, sparse_matrix, dsv41_matrix) against the axes
// each family's contract lists (runtime/*/README.md): host-only, so CI checks on every run that a
// trimmed table still touches every value, although the launches themselves need a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "kiln/jit/error.h"
#include "kiln/runtime/sparse_dsv41/launch_plan.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "tests/support/dsv41_matrix.h"
#include "tests/support/h200_residency.h"
#include "tests/support/mla_matrix.h"
#include "tests/support/sparse_matrix.h"

namespace mla = kiln::testing::mla_matrix;
namespace sparse = kiln::testing::sparse_matrix;
namespace dsv41 = kiln::testing::dsv41_matrix;

namespace {
constexpr int kMaxChunksPerBlock = 16;  // the contract's bound: more chunks than this must split
}  // namespace

TEST_CASE("mla conformance matrix covers every value of every axis of the contract", "[unit]") {
  const auto m = mla::conformance_matrix();
  std::set<int> pages, heads, sqs, lens;
  std::set<std::pair<int, bool>> page_dtype;
  std::set<bool> outlier_dtypes;
  bool dense_sq_gt1 = false, causal_sq_gt1 = false, packed_uneven = false, packed_empty = false, far = false,
       padded = false, single_split = false;
  for (const mla::MlaCase& c : m) {
    pages.insert(c.page_size);
    heads.insert(c.heads);
    sqs.insert(c.sq);
    page_dtype.insert({c.page_size, c.fp8});
    if (c.outliers) outlier_dtypes.insert(c.fp8);
    lens.insert(c.seq_lens.begin(), c.seq_lens.end());
    dense_sq_gt1 |= !c.causal && c.sq > 1;
    causal_sq_gt1 |= c.causal && c.sq > 1;
    if (c.packed) {
      packed_empty |= std::count(c.q_lens.begin(), c.q_lens.end(), 0) > 0;
      packed_uneven |= std::set<int>(c.q_lens.begin(), c.q_lens.end()).size() > 2;
    }
    far |= c.policy_max_seq_len() >= 16 * *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
    padded |= c.bt_pad > 0;
    single_split |= c.policy_max_seq_len() <= 32;
  }
  for (int p : {16, 32, 64, 128}) {
    CHECK(page_dtype.count({p, false}) == 1);
    CHECK(page_dtype.count({p, true}) == 1);
  }
  for (int h : {6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128}) CHECK(heads.count(h) == 1);
  for (int s : {1, 2, 4, 8, 16, 32, 64}) CHECK(sqs.count(s) >= 1);
  for (int l : {1, 63, 64, 65, 256, 2048, 2049, 4097}) CHECK(lens.count(l) == 1);
  CHECK(dense_sq_gt1);
  CHECK(causal_sq_gt1);
  CHECK(packed_empty);
  CHECK(packed_uneven);
  CHECK(far);
  CHECK(padded);
  CHECK(single_split);
  CHECK(outlier_dtypes == std::set<bool>{false, true});  // large magnitudes in both dtypes
  // The GPU suite runs the fp64 oracle over every launch on the host, so the matrix stays a few
  // minutes on the GPU machine only while no launch costs much more than ~1 G multiply-adds. The
  // bound leaves room for the two batches of random lengths, whatever the seed draws (<= 4.6 G).
  for (const mla::MlaCase& c : m) {
    INFO(c.label());
    CHECK(mla::oracle_gmacs(c) < 5.0);
  }
}

TEST_CASE("sparse conformance matrix covers every value of every axis of the contract", "[unit]") {
  const auto m = sparse::conformance_matrix();
  std::set<int> heads, topk_main_only, topk_with_extra, main_pages, extra_pages;
  std::set<std::pair<int, int>> page_pairs;
  std::set<sparse::Layout> layouts, extra_layouts;
  std::set<sparse::Sink> sinks;
  std::set<sparse::Lengths> lengths;
  std::set<bool> lse_scales, idx_rank3;
  bool head_tiles_sweep = false, split_sweep = false, padded_idx = false;
  for (const sparse::SparseCase& c : m) {
    heads.insert(c.heads);
    (c.has_extra ? topk_with_extra : topk_main_only).insert(c.topk);
    main_pages.insert(c.page);
    layouts.insert(c.layout);
    if (c.has_extra) {
      extra_pages.insert(c.extra_page);
      page_pairs.insert({c.page, c.extra_page});
      extra_layouts.insert(c.extra_layout);
    }
    sinks.insert(c.sink);
    lengths.insert(c.lengths);
    lse_scales.insert(c.ln2);
    idx_rank3.insert(c.rank3_indices);
    head_tiles_sweep |= c.sweep && c.heads % 32 == 0;
    split_sweep |= c.sweep && c.chunks() > kMaxChunksPerBlock;
    padded_idx |= c.idx_pad > 0;
  }
  for (int h : {8, 16, 32, 48, 64, 96, 128}) CHECK(heads.count(h) == 1);
  for (int k : {1, 64, 65, 128, 512, 2048}) {
    CHECK(topk_main_only.count(k) == 1);
    CHECK(topk_with_extra.count(k) == 1);
  }
  for (int mp : {32, 64, 128}) {
    for (int xp : {2, 32, 64}) CHECK(page_pairs.count({mp, xp}) == 1);
  }
  CHECK(layouts.size() == 3);
  CHECK(extra_layouts.size() == 3);
  CHECK(sinks.size() == 3);
  CHECK(lengths.size() == 4);
  CHECK(lse_scales.size() == 2);
  CHECK(idx_rank3.size() == 2);
  CHECK(head_tiles_sweep);
  CHECK(split_sweep);
  CHECK(padded_idx);
  // The fp32 oracle runs on the GPU machine's host for every case: about 6 G multiply-adds in all.
  double gmacs = 0;
  for (const sparse::SparseCase& c : m) gmacs += sparse::oracle_gmacs(c);
  CHECK(gmacs < 10);
}

TEST_CASE("dsv41 conformance matrix covers every value of every axis of the contract", "[unit]") {
  using dsv41::EmptyRow;
  using dsv41::View;
  const auto m = dsv41::conformance_matrix();
  std::set<int> heads_main_only, heads_dual, main_pages, extra_pages;
  std::set<std::pair<int, int>> page_pairs;
  std::set<View> views, extra_views;
  std::set<bool> main_padded, extra_padded, sinks, idx_rank3;
  std::set<double> lse_scales;
  std::set<std::pair<EmptyRow, bool>> empty_rows_sink;  // (kind, sink) among cases with an extra cache
  std::set<EmptyRow> empty_main_only;
  std::set<int> fixed_main, fixed_extra;
  bool clamps_main = false, clamps_extra = false, lengths_extra_only = false, forced = false, planned = false,
       sweep_split = false, sweep_single = false, half_masked = false, padded_idx = false, empty_lse_half = false;
  for (const dsv41::Dsv41Case& c : m) {
    INFO(c.label());
    // Each case is one the contract accepts.
    CHECK(c.topk >= 1);
    CHECK(c.stride_pad % 16 == 0);
    CHECK(c.extra_stride_pad % 16 == 0);
    CHECK(std::find(std::begin(dsv41::kHeads), std::end(dsv41::kHeads), c.heads) != std::end(dsv41::kHeads));
    CHECK(c.empty_rows.size() <= static_cast<std::size_t>(std::min(c.tokens, dsv41::kLengthOverToken)));
    CHECK(c.masked_percent < 100);
    if (c.has_extra) CHECK(c.extra_topk >= 1);
    if (c.num_splits) CHECK((c.chunks() + *c.num_splits - 1) / *c.num_splits <= 16);
    (c.has_extra ? heads_dual : heads_main_only).insert(c.heads);
    main_pages.insert(c.page);
    views.insert(c.view);
    main_padded.insert(c.stride_pad > 0);
    if (c.has_extra) {
      extra_pages.insert(c.extra_page);
      page_pairs.insert({c.page, c.extra_page});
      extra_views.insert(c.extra_view);
      extra_padded.insert(c.extra_stride_pad > 0);
      for (const EmptyRow e : c.empty_rows) empty_rows_sink.insert({e, c.sink});
    } else {
      for (const EmptyRow e : c.empty_rows) empty_main_only.insert(e);
    }
    sinks.insert(c.sink);
    lse_scales.insert(c.lse_scale);
    idx_rank3.insert(c.rank3_indices);
    clamps_main |= c.clamps_main();
    clamps_extra |= c.clamps_extra();
    lengths_extra_only |= c.lengths == dsv41::Lengths::kExtra && c.has_extra;
    if (c.main_lengths_given()) fixed_main.insert(c.main_lengths.begin(), c.main_lengths.end());
    if (c.extra_lengths_given()) fixed_extra.insert(c.extra_lengths.begin(), c.extra_lengths.end());
    forced |= c.num_splits.has_value() && *c.num_splits > 1;
    planned |= !c.num_splits;
    sweep_split |= c.sweep && c.chunks() > kMaxChunksPerBlock;
    sweep_single |= c.sweep && c.chunks() <= kMaxChunksPerBlock;
    half_masked |= c.masked_percent >= 50;
    padded_idx |= c.idx_pad > 0;
    empty_lse_half |= !c.empty_rows.empty() && c.lse_scale == 0.5;
  }
  for (const int h : dsv41::kHeads) {
    CHECK(heads_main_only.count(h) == 1);
    CHECK(heads_dual.count(h) == 1);
  }
  for (const int p : {1, 2, 32, 48, 53, 61, 64, 128}) {
    CHECK(main_pages.count(p) == 1);
    CHECK(extra_pages.count(p) == 1);
  }
  // The upstream dual-cache page pairs.
  for (const auto& pair : {std::pair{64, 64}, {32, 64}, {64, 32}, {61, 53}, {64, 2}, {48, 48}, {128, 128}}) CHECK(page_pairs.count(pair) == 1);
  CHECK(views.size() == 4);
  CHECK(extra_views.size() == 4);
  CHECK(main_padded.size() == 2);
  CHECK(extra_padded.size() == 2);
  CHECK(sinks.size() == 2);
  CHECK(idx_rank3.size() == 2);
  for (const double s : {1.0, 0.5, 2.0, std::log(2.0)}) {
    CHECK(std::any_of(lse_scales.begin(), lse_scales.end(), [s](double v) { return std::fabs(v - s) < 1e-12; }));
  }
  for (const EmptyRow e : {EmptyRow::kMain, EmptyRow::kExtra, EmptyRow::kBoth, EmptyRow::kAllMasked}) {
    CHECK(empty_rows_sink.count({e, false}) == 1);
    CHECK(empty_rows_sink.count({e, true}) == 1);
  }
  CHECK(empty_main_only.count(EmptyRow::kMain) == 1);
  CHECK(empty_main_only.count(EmptyRow::kAllMasked) == 1);
  CHECK(empty_lse_half);
  CHECK(clamps_main);
  CHECK(clamps_extra);
  CHECK(lengths_extra_only);
  for (const int len : {0, 1, 63, 65}) {
    CHECK(fixed_main.count(len) == 1);
    CHECK(fixed_extra.count(len) == 1);
  }
  CHECK(forced);
  CHECK(planned);
  CHECK(sweep_split);
  CHECK(sweep_single);
  CHECK(half_masked);
  CHECK(padded_idx);

  // Launches: the decode's own choice first; every variant the device has, forced ("default" on
  // sm_90a with its staged and with its compact body); sweeps every kept split count; enable_pdl
  // on, off and unset.
  std::set<int> pdl;
  for (const dsv41::Dsv41Case& c : m) {
    INFO(c.label());
    for (const bool sm90 : {false, true}) {
      const auto ls = dsv41::launches(c, sm90);
      REQUIRE(!ls.empty());
      CHECK(!ls[0].variant);
      CHECK(ls[0].num_splits == c.num_splits);
      std::map<dsv41::Variant, int> forced_variants;
      std::set<bool> bodies;
      for (const dsv41::Launch& l : ls) {
        if (l.variant) ++forced_variants[*l.variant];
        if (l.bulk_gather) {
          CHECK(l.variant == dsv41::Variant::kDefault);
          bodies.insert(*l.bulk_gather);
        }
        pdl.insert(l.enable_pdl ? int(*l.enable_pdl) : -1);
        if (l.num_splits) CHECK((c.chunks() + *l.num_splits - 1) / *l.num_splits <= 16);
      }
      CHECK(forced_variants[dsv41::Variant::kDefault] >= 1);
      CHECK(forced_variants.count(dsv41::Variant::kSm90) == (sm90 ? 1u : 0u));
      CHECK(bodies == (sm90 ? std::set<bool>{false, true} : std::set<bool>{}));
      if (c.sweep) {
        std::set<int> splits;
        for (const dsv41::Launch& l : ls) {
          if (l.num_splits) splits.insert(*l.num_splits);
        }
        for (int n = (c.chunks() + 15) / 16; n <= c.chunks(); ++n) {
          CHECK(splits.count(dsv41::normalised_splits(c.chunks(), n)) == 1);
        }
      }
    }
  }
  CHECK(pdl == std::set<int>{-1, 0, 1});
  CHECK(dsv41::normalised_splits(10, 3) == 3);  // cpb 4: 4 + 4 + 2
  CHECK(dsv41::normalised_splits(10, 4) == 4);  // cpb 3: 3 + 3 + 3 + 1
  CHECK(dsv41::normalised_splits(10, 6) == 5);  // cpb 2
  CHECK(dsv41::normalised_splits(40, 39) == 20);
  // The oracle (double, on the GPU machine's host) over every case: about 9 G multiply-adds.
  double gmacs = 0;
  for (const dsv41::Dsv41Case& c : m) gmacs += dsv41::oracle_gmacs(c);
  CHECK(gmacs < 16);
}

// Every launch the GPU suite makes of the matrix is a call the launcher accepts, on both targets,
// with the plan the suite expects: checked here on the host (plan_dsv41_decode, the launcher's checks
// without a driver) over stand-in addresses, so that a case the contract refuses fails in CI rather
// than on the GPU machine.
TEST_CASE("dsv41 conformance matrix: every launch passes the launcher's host checks", "[unit]") {
  namespace ds = kiln::dsv41;
  const auto at = [](int k) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(k + 1) << 40); };  // disjoint, aligned
  std::size_t calls = 0;
  for (const dsv41::Dsv41Case& c : dsv41::conformance_matrix()) {
    INFO(c.label());
    dsv41::CallBuffers b;
    b.main_cache = dsv41::cache_view(at(0), 528, c.page, 528LL * c.page + c.stride_pad, dsv41::pool_pages(c.page), c.view);
    if (c.has_extra) {
      b.extra_cache = dsv41::cache_view(at(1), 288, c.extra_page, 288LL * c.extra_page + c.extra_stride_pad, dsv41::pool_pages(c.extra_page),
                                        c.extra_view);
    }
    void** buffers[] = {&b.q, &b.indices, &b.extra_indices, &b.lengths, &b.extra_lengths, &b.sink, &b.out, &b.lse, &b.mid_out, &b.mid_lse};
    for (int k = 0; k < 10; ++k) *buffers[k] = at(2 + k);
    for (const bool sm90 : {true, false}) {
      const ds::Dsv41Device device{sm90 ? "sm_90a" : "sm_120a", sm90 ? 132 : 188, false};
      for (const dsv41::Launch& l : dsv41::launches(c, sm90)) {
        INFO(device.arch << " [" << l.name() << "]");
        b.splits = c.chunks();
        const dsv41::Call call = dsv41::make_call(c, l, b, c.lse_scale);
        ds::Dsv41Plan plan;
        REQUIRE_NOTHROW(plan = ds::plan_dsv41_decode(call.q, call.kv_cache, call.indices, call.output, call.out_lse, 0.044, call.opt, device));
        ++calls;
        const ds::Dsv41Variant want = l.variant ? (*l.variant == dsv41::Variant::kDefault ? ds::Dsv41Variant::kDefault : ds::Dsv41Variant::kSm90)
                                                : ds::choose_variant(device, c.tokens, c.heads, {plan.num_splits, plan.chunks_per_block});
        CHECK(plan.variant == want);
        CHECK(plan.head_tiles == (plan.variant == ds::Dsv41Variant::kSm90 && c.heads >= 32 ? 2 : 1));
        if (l.num_splits) CHECK(plan.num_splits == dsv41::normalised_splits(c.chunks(), *l.num_splits));
        CHECK(plan.num_splits <= c.chunks());
        CHECK(plan.chunks_per_block <= 16);
        if (plan.num_splits == 1) {  // an unsplit plan needs no scratch
          b.splits = 0;
          const dsv41::Call bare = dsv41::make_call(c, l, b, c.lse_scale);
          CHECK_NOTHROW(ds::plan_dsv41_decode(bare.q, bare.kv_cache, bare.indices, bare.output, bare.out_lse, 0.044, bare.opt, device));
        }
      }
      // Counts below ceil(chunks / 16) leave more than 16 chunks to a CTA: refused ("at most").
      for (int n = 1; n < (c.chunks() + 15) / 16; ++n) {
        b.splits = c.chunks();
        const dsv41::Call call = dsv41::make_call(c, dsv41::Launch{n, std::nullopt, std::nullopt}, b, c.lse_scale);
        try {
          ds::plan_dsv41_decode(call.q, call.kv_cache, call.indices, call.output, call.out_lse, 0.044, call.opt, device);
          FAIL_CHECK("num_splits " << n << " accepted");
        } catch (const kiln::Error& e) {
          CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
          CHECK_THAT(e.what(), Catch::Contains("at most"));
        }
      }
    }
  }
  CHECK(calls > 300);
}

// The GPU suites launch each sm90 case planned and forced onto the sm90 kernel (their scratch holds a
// split per chunk); on a 132-SM GPU some H > 64 launches must run unpaired and some as cluster pairs,
// or one of the two forms would go untested.
TEST_CASE("sparse and dsv41 matrices launch the sm90 kernel both unpaired and as pairs", "[unit]") {
  namespace sp = kiln::sparse;
  namespace d = kiln::dsv41;
  const kiln::ClusterResidency residency = kiln::testing::h200_residency(132);
  const sp::SparseDevice device{"sm_90a", 132, residency};
  int unpaired = 0, paired = 0;
  for (const sparse::SparseCase& c : sparse::conformance_matrix()) {
    if (c.heads <= 64) continue;
    const int chunks = c.chunks();
    const sp::SplitPlanResult plan = sp::resolve_plan(c.tokens, c.heads, c.topk, c.xtopk(), 132);
    const sp::SparseLaunch l = sp::plan_sparse_launch(device, c.tokens, c.heads, chunks, plan, true, sp::SparseKernel::kSm90, std::nullopt, chunks);
    ++(l.unpaired ? unpaired : paired);
  }
  CHECK(unpaired > 0);
  CHECK(paired > 0);
  const d::Dsv41Device target{"sm_90a", 132, false, residency};
  int d_unpaired = 0, d_paired = 0;
  for (const dsv41::Dsv41Case& c : dsv41::conformance_matrix()) {
    if (c.heads <= 64) continue;
    const int extra = c.has_extra ? c.extra_topk : 0, chunks = sp::num_chunks(c.topk, extra);
    const d::Dsv41Plan plan = d::resolve_dsv41_plan(c.tokens, c.heads, c.topk, extra, target, d::Dsv41Variant::kSm90, std::nullopt, 16, false);
    const d::Dsv41Plan runs = d::dsv41_launch_plan(target, c.tokens, c.heads, chunks, plan, true, std::nullopt, chunks, 16);
    const int deal = d::dsv41_cluster_size(target, c.tokens, c.heads, runs);
    ++(d::dsv41_unpaired(target, c.tokens, c.heads, runs, deal) ? d_unpaired : d_paired);
  }
  CHECK(d_unpaired > 0);
  CHECK(d_paired > 0);
}
