#pragma once
// The sparse NVFP4 decode conformance matrix (runtime/sparse_nvfp4/README.md, "Conformance"): the
// cases the GPU suite runs against the fp32 oracle. Host-only, so that the unit suite can check on
// every CI run that the matrix still covers every value of every axis the contract lists.
#include <sstream>
#include <string>
#include <vector>

#include "kiln/runtime/sparse_nvfp4/planner.h"

namespace kiln::testing::sparse_matrix {

enum class Layout { kCompact, kHnd, kNhd };  // [P, page, 384], [P, 1, page, 384], [P, page, 1, 384]
enum class Sink { kOff, kOn, kDominated };    // kDominated: every 4th head's sink is 40 (sink-dominated rows)
enum class Lengths { kNone, kMain, kExtra, kBoth };

const char* layout_name(Layout l);
const char* sink_name(Sink s);
const char* lengths_name(Lengths l);

struct SparseCase {
  int tokens = 4;
  int heads = 16;
  int topk = 64;
  int page = 64;
  Layout layout = Layout::kCompact;
  bool has_extra = false;
  int extra_topk = 0;
  int extra_page = 0;
  Layout extra_layout = Layout::kCompact;
  Sink sink = Sink::kOff;
  Lengths lengths = Lengths::kNone;
  bool ln2 = false;            // lse_scale = ln 2 (natural-log LSE) instead of 1
  bool sweep = false;          // every forced num_splits 1..max for each valid head_tiles
  bool rank3_indices = false;  // [T, 1, topk] instead of [T, topk]
  int idx_pad = 0;             // indices row stride = topk + idx_pad
  float q_scale = 1.f;
  bool large = false;          // both pools from the magnitude-30 data

  int chunks() const { return kiln::sparse::num_chunks(topk, has_extra ? extra_topk : 0); }
  int xtopk() const { return has_extra ? extra_topk : 0; }
  std::string label() const {
    std::ostringstream s;
    s << "T" << tokens << " H" << heads << " topk " << topk << " p" << page << " " << layout_name(layout);
    if (has_extra) s << " + extra " << extra_topk << " p" << extra_page << " " << layout_name(extra_layout);
    s << " sink " << sink_name(sink) << " len " << lengths_name(lengths) << " lse " << (ln2 ? "ln2" : "1")
      << (rank3_indices ? " idx3" : "") << (idx_pad ? " idxpad" : "") << (q_scale != 1.f ? " q*2" : "") << (large ? " large" : "");
    return s.str();
  }
};

SparseCase main_only(int t, int h, int topk, int page, Layout layout, Sink sink, Lengths len, bool ln2, bool sweep = false);
SparseCase with_extra(int t, int h, int topk, int extra_topk, int page, int extra_page, Layout layout, Layout extra_layout, Sink sink,
                      Lengths len, bool ln2, bool sweep = false);

inline constexpr Layout kC = Layout::kCompact, kH = Layout::kHnd, kN = Layout::kNhd;
inline constexpr Sink kOff = Sink::kOff, kOn = Sink::kOn, kDom = Sink::kDominated;
inline constexpr Lengths kNoLen = Lengths::kNone, kMainLen = Lengths::kMain, kExtraLen = Lengths::kExtra, kBothLen = Lengths::kBoth;
inline constexpr bool kLn2Lse = true, kUnitLse = false, kSweep = true;

// The matrix: every topk with and without the extra pool, every head count, page size and layout.
std::vector<SparseCase> conformance_matrix();

// The oracle's cost of one case: T * H * (topk + extra_topk) * 1024 multiply-adds, in G.
double oracle_gmacs(const SparseCase& c);

}  // namespace kiln::testing::sparse_matrix
