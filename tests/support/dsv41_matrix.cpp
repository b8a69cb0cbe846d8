#include "tests/support/dsv41_matrix.h"

#include <algorithm>
#include <sstream>

namespace kiln::testing::dsv41_matrix {

const char* view_name(View v) {
  switch (v) {
    case View::k2d: return "2-D";
    case View::k3d: return "3-D";
    case View::kHnd: return "HND";
    case View::kNhd: return "NHD";
  }
  return "?";
}

const char* lengths_name(Lengths l) {
  return l == Lengths::kNone ? "none" : l == Lengths::kMain ? "main" : l == Lengths::kExtra ? "extra" : "both";
}

const char* empty_row_name(EmptyRow e) {
  switch (e) {
    case EmptyRow::kMain: return "main-empty";
    case EmptyRow::kExtra: return "extra-empty";
    case EmptyRow::kBoth: return "both-empty";
    case EmptyRow::kAllMasked: return "all-masked";
  }
  return "?";
}

const char* variant_name(Variant v) { return v == Variant::kDefault ? "default" : "sm90"; }

int Dsv41Case::chunks() const { return (topk + 63) / 64 + (xtopk() + 63) / 64; }

bool Dsv41Case::main_lengths_given() const { return lengths == Lengths::kMain || lengths == Lengths::kBoth; }

bool Dsv41Case::extra_lengths_given() const {
  return has_extra && (lengths == Lengths::kExtra || lengths == Lengths::kBoth);
}

namespace {
bool clamps(const std::vector<int>& fixed, int topk, int tokens) {
  if (fixed.empty()) return tokens > kLengthNegativeToken;
  bool over = false, negative = false;
  for (int t = 0; t < tokens; ++t) {
    over |= fixed[t % fixed.size()] > topk;
    negative |= fixed[t % fixed.size()] < 0;
  }
  return over && negative;
}
}  // namespace

bool Dsv41Case::clamps_main() const { return main_lengths_given() && clamps(main_lengths, topk, tokens); }

bool Dsv41Case::clamps_extra() const { return extra_lengths_given() && clamps(extra_lengths, extra_topk, tokens); }

std::string Dsv41Case::label() const {
  std::ostringstream s;
  s << "T" << tokens << " H" << heads << " topk " << topk << " p" << page << " " << view_name(view);
  if (stride_pad) s << "+" << stride_pad;
  if (has_extra) {
    s << " + extra " << extra_topk << " p" << extra_page << " " << view_name(extra_view);
    if (extra_stride_pad) s << "+" << extra_stride_pad;
  }
  s << " sink " << (sink ? "on" : "off") << " len " << lengths_name(lengths);
  if (!main_lengths.empty() || !extra_lengths.empty()) s << " (fixed)";
  for (const EmptyRow e : empty_rows) s << " " << empty_row_name(e);
  if (masked_percent != 8) s << " masked " << masked_percent << "%";
  s << " lse " << lse_scale;
  if (num_splits) s << " splits=" << *num_splits;
  if (sweep) s << " sweep";
  if (rank3_indices) s << " idx3";
  if (idx_pad) s << " idxpad";
  if (q_scale != 1.0f) s << " q*" << q_scale;
  return s.str();
}

std::string Launch::name() const {
  std::ostringstream s;
  s << (num_splits ? "splits=" + std::to_string(*num_splits) : std::string("planned")) << " variant "
    << (variant ? variant_name(*variant) : "auto") << " pdl " << (enable_pdl ? (*enable_pdl ? "on" : "off") : "unset");
  if (cluster) s << " cluster " << (*cluster ? "forced" : "off");
  if (bulk_gather) s << (*bulk_gather ? " staged" : " compact");
  return s.str();
}

int normalised_splits(int chunks, int num_splits) {
  const int cpb = (chunks + num_splits - 1) / num_splits;
  return (chunks + cpb - 1) / cpb;
}

namespace {

constexpr View k2 = View::k2d, k3 = View::k3d, kH = View::kHnd, kN = View::kNhd;
constexpr double kLn2 = 0.69314718055994531;

Dsv41Case main_case(int t, int h, int topk, int page, View view, int pad) {
  Dsv41Case c;
  c.tokens = t;
  c.heads = h;
  c.topk = topk;
  c.page = page;
  c.view = view;
  c.stride_pad = pad;
  return c;
}

Dsv41Case dual_case(int t, int h, int topk, int xtopk, int page, int xpage, View view, View xview, int pad, int xpad) {
  Dsv41Case c = main_case(t, h, topk, page, view, pad);
  c.has_extra = true;
  c.extra_topk = xtopk;
  c.extra_page = xpage;
  c.extra_view = xview;
  c.extra_stride_pad = xpad;
  return c;
}

}  // namespace

// Oracle cost about 9 G multiply-adds in all (the unit suite bounds it).
std::vector<Dsv41Case> conformance_matrix() {
  std::vector<Dsv41Case> m;
  auto add = [&m](Dsv41Case c, auto&& edit) {
    edit(c);
    m.push_back(std::move(c));
  };
  // Main cache only: every head count, the upstream page sizes, every view, padded strides.
  add(main_case(8, 8, 128, 61, kH, 0), [](Dsv41Case& c) { c.sink = true; c.lengths = Lengths::kMain; });
  add(main_case(8, 16, 128, 64, kN, 128), [](Dsv41Case& c) { c.lse_scale = 0.5; });
  add(main_case(8, 32, 128, 61, k3, 0), [](Dsv41Case& c) { c.sink = true; c.lengths = Lengths::kMain; c.lse_scale = 2; });
  add(main_case(8, 64, 128, 64, k2, 16), [](Dsv41Case& c) { c.sweep = true; });
  add(main_case(8, 128, 128, 61, kH, 48), [](Dsv41Case& c) { c.sink = true; c.lse_scale = kLn2; });
  add(main_case(6, 48, 512, 1, k3, 16), [](Dsv41Case& c) { c.sink = true; c.lengths = Lengths::kMain; c.num_splits = 3; });
  add(main_case(5, 80, 65, 2, kN, 0), [](Dsv41Case& c) { c.rank3_indices = true; });
  add(main_case(4, 96, 2048, 128, k2, 0), [](Dsv41Case& c) { c.sink = true; c.lengths = Lengths::kMain; c.sweep = true; });
  add(main_case(3, 112, 1, 53, kH, 32), [](Dsv41Case& c) { c.sink = true; c.q_scale = 2; });
  add(main_case(1, 64, 2048, 48, kN, 0), [](Dsv41Case& c) { c.sink = true; });  // one decode step: split plans
  add(main_case(32, 128, 128, 64, kH, 0), [](Dsv41Case& c) { c.idx_pad = 8; });  // enough CTAs for one wave
  add(main_case(6, 64, 128, 32, k3, 0), [](Dsv41Case& c) {
    c.sink = true;
    c.lengths = Lengths::kMain;
    c.empty_rows = {EmptyRow::kBoth, EmptyRow::kAllMasked, EmptyRow::kMain};
    c.lse_scale = 0.5;
  });
  add(main_case(4, 64, 512, 53, k2, 0), [](Dsv41Case& c) {
    c.empty_rows = {EmptyRow::kAllMasked, EmptyRow::kMain};
    c.lse_scale = 0.5;
  });

  // Both caches: the upstream page pairs at H = 8 and 64 (T = 8, 128 + 512 candidates, ragged
  // lengths in both sections), each pair in other views and paddings.
  struct Pair {
    int page, xpage;
    View view, xview;
    int pad, xpad;
  };
  const Pair pairs[] = {{64, 64, kH, kN, 0, 0},  {32, 64, kN, k3, 16, 0},   {64, 32, k3, k2, 0, 128}, {61, 53, k2, kH, 432, 16},
                        {64, 2, kH, k2, 0, 0},   {48, 48, kN, kH, 128, 48}, {128, 128, k3, kN, 0, 0}};
  const double lse_scales[] = {1.0, 0.5, 2.0, kLn2};
  for (const int h : {8, 64}) {
    int i = 0;
    for (const Pair& p : pairs) {
      const bool swap = h == 64;  // H = 64 sees each pair in the other cache's views
      add(dual_case(8, h, 128, 512, p.page, p.xpage, swap ? p.xview : p.view, swap ? p.view : p.xview, p.pad, p.xpad),
          [&](Dsv41Case& c) {
            c.sink = h == 8 || i % 2 == 0;
            c.lengths = Lengths::kBoth;
            c.lse_scale = lse_scales[(i + (h == 64)) % 4];
            c.rank3_indices = i % 3 == 1;
          });
      ++i;
    }
  }
  // Every other head count with both caches, other candidate counts and page sizes 1, 2, 53, 61.
  add(dual_case(6, 16, 64, 1, 1, 2, k3, k2, 0, 0), [](Dsv41Case& c) { c.lengths = Lengths::kExtra; c.lse_scale = 2; });
  add(dual_case(5, 32, 512, 128, 53, 61, kH, kN, 16, 16), [](Dsv41Case& c) { c.lengths = Lengths::kMain; c.sweep = true; });
  add(dual_case(6, 48, 65, 65, 2, 1, kN, k3, 0, 0), [](Dsv41Case& c) { c.sink = true; c.lengths = Lengths::kBoth; c.q_scale = 0.25f; });
  add(dual_case(4, 80, 1, 2048, 128, 48, k2, kH, 0, 32), [](Dsv41Case& c) { c.sink = true; c.sweep = true; });
  add(dual_case(3, 96, 2048, 512, 64, 32, kH, kH, 0, 0), [](Dsv41Case& c) { c.num_splits = 5; c.idx_pad = 8; });
  add(dual_case(4, 112, 128, 512, 61, 53, kN, k2, 0, 0),
      [](Dsv41Case& c) { c.sink = true; c.lengths = Lengths::kBoth; c.lse_scale = kLn2; });
  add(dual_case(2, 128, 512, 2048, 32, 64, k3, kN, 0, 0), [](Dsv41Case& c) { c.lengths = Lengths::kExtra; c.sweep = true; });
  // Lengths 0, 1, 63 and 65 in both sections, with and without a sink.
  add(dual_case(4, 64, 128, 512, 64, 2, kH, kH, 0, 0), [](Dsv41Case& c) {
    c.lengths = Lengths::kBoth;
    c.main_lengths = {0, 1, 63, 65};
    c.extra_lengths = {65, 63, 1, 0};
  });
  add(dual_case(4, 64, 128, 512, 61, 53, kN, k3, 0, 0), [](Dsv41Case& c) {
    c.sink = true;
    c.lengths = Lengths::kBoth;
    c.main_lengths = {0, 1, 63, 65};
    c.extra_lengths = {1, 0, 65, 63};
  });
  // Empty rows of every kind, with and without a sink, lse_scale 0.5.
  add(dual_case(6, 64, 128, 512, 64, 32, kH, kN, 0, 0), [](Dsv41Case& c) {
    c.sink = true;
    c.lengths = Lengths::kBoth;
    c.empty_rows = {EmptyRow::kMain, EmptyRow::kExtra, EmptyRow::kBoth, EmptyRow::kAllMasked};
    c.lse_scale = 0.5;
  });
  add(dual_case(4, 16, 128, 512, 32, 64, k2, k3, 0, 0), [](Dsv41Case& c) {
    c.empty_rows = {EmptyRow::kMain, EmptyRow::kExtra, EmptyRow::kBoth, EmptyRow::kAllMasked};
    c.lse_scale = 0.5;
  });
  // Half the slots masked, lengths topk - 8 (and clamped ones), a sink.
  add(dual_case(4, 64, 128, 512, 64, 64, kH, kH, 0, 0), [](Dsv41Case& c) {
    c.sink = true;
    c.masked_percent = 50;
    c.lengths = Lengths::kBoth;
    c.main_lengths = {120, 120, 200, -1};
    c.extra_lengths = {504, -9, 504, 600};
  });
  // A decode step (T = 1) and a batch of 64 with both caches: split plans and one full wave.
  add(dual_case(1, 128, 128, 512, 64, 2, kH, k2, 0, 0), [](Dsv41Case& c) { c.sink = true; });
  add(dual_case(64, 16, 128, 512, 64, 64, kN, kN, 0, 0), [](Dsv41Case& c) { c.lengths = Lengths::kBoth; });
  return m;
}

std::vector<Launch> forced_variants(std::optional<int> num_splits, bool sm90) {
  // On sm_90a "default" runs with each of its bodies, whichever dsv41_bulk_gather would pick.
  if (!sm90) return {Launch{num_splits, Variant::kDefault, std::nullopt}};
  return {Launch{num_splits, Variant::kDefault, std::nullopt, std::nullopt, true}, Launch{num_splits, Variant::kSm90, std::nullopt},
          Launch{num_splits, Variant::kDefault, std::nullopt, std::nullopt, false}};
}

std::vector<Launch> launches(const Dsv41Case& c, bool sm90) {
  const auto forced = [&](std::optional<int> n, std::vector<Launch>& to) {
    std::vector<Launch> v = forced_variants(n, sm90);
    // "sm90" also with its split dealt to a cluster, right after the plain "sm90" launch.
    if (sm90) v.insert(v.begin() + 2, Launch{n, Variant::kSm90, std::nullopt, true});
    to.insert(to.end(), v.begin(), v.end());
  };
  std::vector<Launch> out = {Launch{c.num_splits, std::nullopt, std::nullopt, std::nullopt}};
  forced(c.num_splits, out);
  if (c.sweep) {
    const int chunks = c.chunks();
    for (int n = (chunks + 15) / 16; n <= chunks; ++n) {
      if (normalised_splits(chunks, n) == n) forced(n, out);
    }
  }
  // enable_pdl must not change a bit: on, off and unset in turn (the decode's own choice stays unset).
  for (std::size_t i = 1; i < out.size(); ++i) {
    if (i % 3 == 1) out[i].enable_pdl = true;
    else if (i % 3 == 2) out[i].enable_pdl = false;
  }
  return out;
}

long long pool_pages(int page) { return std::max<long long>(8, (4096 + page - 1) / page); }

kiln::TensorView cache_view(void* base, int record, int page, long long page_stride, long long pages, View v) {
  kiln::TensorView t;
  t.data = base;
  t.dtype = kiln::DType::kU8;
  const std::int64_t rec = record, page_bytes = static_cast<std::int64_t>(record) * page;
  switch (v) {
    case View::k2d:
      t.rank = 2;
      t.shape = {pages, page_bytes};
      t.strides = {page_stride, 1};
      break;
    case View::k3d:
      t.rank = 3;
      t.shape = {pages, page, rec};
      t.strides = {page_stride, rec, 1};
      break;
    case View::kHnd:
      t.rank = 4;
      t.shape = {pages, 1, page, rec};
      t.strides = {page_stride, page_bytes, rec, 1};
      break;
    case View::kNhd:
      t.rank = 4;
      t.shape = {pages, page, 1, rec};
      t.strides = {page_stride, rec, rec, 1};
      break;
  }
  return t;
}

Call make_call(const Dsv41Case& c, const Launch& l, const CallBuffers& b, double lse_scale) {
  using kiln::DType;
  using kiln::TensorView;
  constexpr std::int64_t kDims = 512;
  Call call;
  call.q = TensorView::contiguous(b.q, DType::kBf16, {c.tokens, c.heads, kDims});
  call.kv_cache = b.main_cache;
  call.indices.data = b.indices;
  call.indices.dtype = DType::kI32;
  const std::int64_t stride = c.topk + c.idx_pad;
  if (c.rank3_indices) {
    call.indices.rank = 3;
    call.indices.shape = {c.tokens, 1, c.topk};
    call.indices.strides = {stride, stride, 1};
  } else {
    call.indices.rank = 2;
    call.indices.shape = {c.tokens, c.topk};
    call.indices.strides = {stride, 1};
  }
  call.output = TensorView::contiguous(b.out, DType::kBf16, {c.tokens, c.heads, kDims});
  call.out_lse = TensorView::contiguous(b.lse, DType::kF32, {c.tokens, c.heads});
  kiln::dsv41::Dsv41Options& o = call.opt;
  if (c.main_lengths_given()) o.topk_length = TensorView::contiguous(b.lengths, DType::kI32, {c.tokens});
  if (c.sink) o.attn_sink = TensorView::contiguous(b.sink, DType::kF32, {c.heads});
  if (c.has_extra) {
    o.extra_kv_cache = b.extra_cache;
    o.extra_indices = TensorView::contiguous(b.extra_indices, DType::kI32, {c.tokens, c.extra_topk});
    if (c.extra_lengths_given()) o.extra_topk_length = TensorView::contiguous(b.extra_lengths, DType::kI32, {c.tokens});
  }
  if (b.splits > 0) {
    o.mid_out = TensorView::contiguous(b.mid_out, DType::kBf16, {c.tokens, c.heads, b.splits, kDims});
    o.mid_lse = TensorView::contiguous(b.mid_lse, DType::kF32, {c.tokens, c.heads, b.splits});
  }
  o.lse_scale = lse_scale;
  o.num_splits = l.num_splits;
  if (l.variant) o.variant = variant_name(*l.variant);
  o.enable_pdl = l.enable_pdl;
  o.cluster = l.cluster;
  o.bulk_gather = l.bulk_gather;
  return call;
}

double oracle_gmacs(const Dsv41Case& c) { return static_cast<double>(c.tokens) * c.heads * (c.topk + c.xtopk()) * 1024 * 1e-9; }

}  // namespace kiln::testing::dsv41_matrix
