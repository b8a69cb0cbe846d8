// The GPU suites' conformance matrices (tests/support/mla_matrix, sparse_matrix) against the axes
// each family's contract lists (runtime/*/README.md): host-only, so CI checks on every run that a
// trimmed table still touches every value, although the launches themselves need a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <utility>

#include "tests/support/mla_matrix.h"
#include "tests/support/sparse_matrix.h"

namespace mla = kiln::testing::mla_matrix;
namespace sparse = kiln::testing::sparse_matrix;

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
