#include "tests/support/sparse_matrix.h"

namespace kiln::testing::sparse_matrix {

const char* layout_name(Layout l) { return l == Layout::kCompact ? "compact" : l == Layout::kHnd ? "HND" : "NHD"; }
const char* sink_name(Sink s) { return s == Sink::kOff ? "off" : s == Sink::kOn ? "on" : "dominated"; }
const char* lengths_name(Lengths l) {
  return l == Lengths::kNone ? "none" : l == Lengths::kMain ? "main" : l == Lengths::kExtra ? "extra" : "both";
}


SparseCase main_only(int t, int h, int topk, int page, Layout layout, Sink sink, Lengths len, bool ln2, bool sweep) {
  SparseCase c;
  c.tokens = t;
  c.heads = h;
  c.topk = topk;
  c.page = page;
  c.layout = layout;
  c.sink = sink;
  c.lengths = len;
  c.ln2 = ln2;
  c.sweep = sweep;
  return c;
}

SparseCase with_extra(int t, int h, int topk, int extra_topk, int page, int extra_page, Layout layout, Layout extra_layout, Sink sink,
                      Lengths len, bool ln2, bool sweep) {
  SparseCase c = main_only(t, h, topk, page, layout, sink, len, ln2, sweep);
  c.has_extra = true;
  c.extra_topk = extra_topk;
  c.extra_page = extra_page;
  c.extra_layout = extra_layout;
  return c;
}

// Oracle cost T * H * (topk + extra) * 1024 MACs, kept <= ~0.7 G per case (~6 G in all).
std::vector<SparseCase> conformance_matrix() {
  std::vector<SparseCase> m = {
      // Main pool only: every topk, every head count, every main page size and layout.
      main_only(6, 8, 1, 64, kC, kOff, kNoLen, kUnitLse),
      main_only(6, 16, 64, 32, kN, kOn, kMainLen, kLn2Lse),
      main_only(6, 32, 65, 128, kH, kDom, kMainLen, kUnitLse, kSweep),
      main_only(5, 48, 128, 64, kN, kOn, kNoLen, kLn2Lse),
      main_only(4, 64, 512, 32, kC, kOff, kMainLen, kUnitLse, kSweep),
      main_only(3, 96, 2048, 128, kC, kOn, kMainLen, kLn2Lse, kSweep),
      main_only(2, 128, 2048, 64, kH, kDom, kNoLen, kUnitLse),
      main_only(8, 8, 2048, 32, kH, kOn, kMainLen, kUnitLse, kSweep),
      main_only(6, 128, 65, 128, kN, kOff, kMainLen, kLn2Lse),
      // Enough CTAs for the planners' full-wave branches (head_tiles 2 at H = 128, one split).
      main_only(32, 128, 128, 64, kC, kOn, kNoLen, kUnitLse),
      main_only(64, 16, 512, 128, kH, kOff, kMainLen, kLn2Lse),
      // T = 1 as a decode step runs it: few CTAs, split plans whose chunks a cluster shares.
      main_only(1, 64, 2048, 64, kC, kOn, kNoLen, kUnitLse),
      // Extra pool: every topk with it, every (main page, extra page) pair, every extra layout.
      with_extra(6, 8, 64, 1, 32, 2, kC, kH, kOn, kBothLen, kLn2Lse, kSweep),
      with_extra(6, 16, 1, 64, 64, 32, kH, kN, kDom, kExtraLen, kUnitLse),
      with_extra(5, 32, 128, 512, 128, 64, kN, kC, kOn, kBothLen, kLn2Lse, kSweep),
      with_extra(4, 48, 512, 128, 32, 64, kC, kN, kOff, kMainLen, kUnitLse, kSweep),
      with_extra(3, 64, 2048, 512, 64, 2, kH, kC, kOn, kBothLen, kLn2Lse, kSweep),
      with_extra(4, 96, 65, 65, 128, 32, kC, kH, kDom, kBothLen, kUnitLse),
      with_extra(2, 128, 512, 2048, 32, 32, kN, kN, kOn, kExtraLen, kLn2Lse, kSweep),
      with_extra(6, 32, 2048, 64, 128, 2, kH, kH, kOff, kMainLen, kUnitLse),
      with_extra(4, 64, 1, 2048, 64, 64, kN, kC, kOn, kExtraLen, kLn2Lse),
      with_extra(8, 16, 128, 128, 32, 2, kC, kC, kOn, kNoLen, kUnitLse),
      with_extra(1, 128, 512, 128, 64, 64, kN, kH, kOn, kNoLen, kUnitLse),
  };
  // Index-tensor variety at no cost: [T, 1, topk] on some, padded rows (stride > topk) on others;
  // queries at twice the scale on a few (sharper softmax).
  for (std::size_t i = 0; i < m.size(); ++i) {
    m[i].rank3_indices = i % 3 == 1;
    m[i].idx_pad = i % 4 == 2 ? 8 : 0;
    m[i].q_scale = i % 7 == 3 ? 2.f : 1.f;
  }
  return m;
}

double oracle_gmacs(const SparseCase& c) { return static_cast<double>(c.tokens) * c.heads * (c.topk + c.xtopk()) * 1024 * 1e-9; }

}  // namespace kiln::testing::sparse_matrix
