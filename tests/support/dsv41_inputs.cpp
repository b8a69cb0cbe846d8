#include "tests/support/dsv41_inputs.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "tests/support/nvfp4_reference.h"
#include "tests/support/rng.h"
#include "tests/support/parallel.h"

namespace kiln::testing::dsv41_matrix {

namespace {

namespace kt = kiln::testing;
constexpr int kDims = kDsv41Dims;

std::uint8_t finite_e4m3(Rng& rng) {
  for (;;) {
    const auto b = static_cast<std::uint8_t>(rng.next());
    if ((b & 0x7f) != 0x7f) return b;
  }
}

// A random main record: every finite E4M3 code; per 32 dims a UE8M0 scale of 2^-13 .. 2^-8 (the
// writer's range for |x| <= 1), 2^-22 .. 2^-14 (the other deployed floor), or an all-zero group.
void random_main_record(Rng& rng, std::uint8_t* codes, std::uint8_t* scales) {
  for (int d = 0; d < 512; ++d) codes[d] = finite_e4m3(rng);
  for (int g = 0; g < 16; ++g) {
    const int r = rng.below(100);
    if (r < 5) {
      scales[g] = 0x72;
      for (int d = 0; d < 32; ++d) codes[32 * g + d] = rng.below(2) ? 0x80 : 0x00;
    } else {
      scales[g] = static_cast<std::uint8_t>(r < 15 ? 105 + rng.below(9) : 114 + rng.below(6));
    }
  }
}

// A random extra record: any E2M1 pair; per 16 dims an E4M3 scale of 2^-9 .. 0.171875 (the writer's
// range for |x| <= 1; a fifth of them subnormal), or an all-zero group (scale 2^-9, codes +-0).
void random_extra_record(Rng& rng, std::uint8_t* codes, std::uint8_t* scales) {
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<std::uint8_t>(rng.next());
  for (int g = 0; g < 32; ++g) {
    const int r = rng.below(100);
    if (r < 5) {
      scales[g] = 0x01;
      for (int i = 0; i < 8; ++i) codes[8 * g + i] = static_cast<std::uint8_t>((rng.below(2) ? 0x08 : 0) | (rng.below(2) ? 0x80 : 0));
    } else {
      scales[g] = static_cast<std::uint8_t>(r < 25 ? 0x01 + rng.below(7) : 0x08 + rng.below(0x23 - 0x08 + 1));
    }
  }
}

}  // namespace

PoolImage make_pool_image(Dsv41Format format, int page_size, int stride_pad, const std::vector<bool>& live, std::uint64_t seed,
                          std::uint8_t pad_byte) {
  PoolImage p;
  p.format = format;
  p.page_size = page_size;
  p.page_stride = static_cast<long long>(page_size) * p.record() + stride_pad;
  p.pages = pool_pages(page_size);
  p.bytes.assign(static_cast<std::size_t>(p.pages * p.page_stride), kNanByte);
  for (long long pg = 0; pg < p.pages && stride_pad > 0; ++pg) {
    std::memset(&p.bytes[pg * p.page_stride + static_cast<long long>(page_size) * p.record()], pad_byte, stride_pad);
  }
  Rng rng(seed);
  for (long long s = 0; s < p.slots() && s < static_cast<long long>(live.size()); ++s) {
    if (!live[s]) continue;
    std::uint8_t* codes = &p.bytes[kt::dsv41_data_offset(format, p.page_stride, page_size, s)];
    std::uint8_t* scales = &p.bytes[kt::dsv41_scale_offset(format, p.page_stride, page_size, s)];
    if (format == Dsv41Format::kMain) random_main_record(rng, codes, scales);
    else random_extra_record(rng, codes, scales);
  }
  return p;
}

PoolImage restride(const PoolImage& from, int stride_pad, std::uint8_t pad_byte) {
  PoolImage p;
  p.format = from.format;
  p.page_size = from.page_size;
  p.pages = from.pages;
  const long long used = static_cast<long long>(from.page_size) * from.record();
  p.page_stride = used + stride_pad;
  p.bytes.assign(static_cast<std::size_t>(p.pages * p.page_stride), pad_byte);
  for (long long pg = 0; pg < p.pages; ++pg) std::memcpy(&p.bytes[pg * p.page_stride], &from.bytes[pg * from.page_stride], used);
  return p;
}

namespace {

bool empties_main(EmptyRow e) { return e == EmptyRow::kMain || e == EmptyRow::kBoth; }
bool empties_extra(EmptyRow e) { return e == EmptyRow::kExtra || e == EmptyRow::kBoth; }

// Given lengths of one section: the case's fixed ones, else random in [0, topk] with one token past
// topk and one negative; tokens with an empty row get 0 for an emptied section, topk when masked.
std::vector<std::int32_t> draw_lengths(Rng& rng, const Dsv41Case& c, bool extra) {
  const int topk = extra ? c.extra_topk : c.topk;
  const std::vector<int>& fixed = extra ? c.extra_lengths : c.main_lengths;
  std::vector<std::int32_t> len(c.tokens);
  for (int t = 0; t < c.tokens; ++t) len[t] = fixed.empty() ? rng.below(topk + 1) : fixed[t % fixed.size()];
  if (fixed.empty() && c.tokens > kLengthNegativeToken) {
    len[kLengthOverToken] = topk + 7;
    len[kLengthNegativeToken] = -3;
  }
  for (std::size_t t = 0; t < c.empty_rows.size() && t < len.size(); ++t) {
    const EmptyRow e = c.empty_rows[t];
    if (e == EmptyRow::kAllMasked) len[t] = topk;
    else if (extra ? empties_extra(e) : empties_main(e)) len[t] = 0;
  }
  return len;
}

// Slots of one section: in the active prefix, c.masked_percent negative (-1 mostly, INT_MIN and
// -12345 too), ~5% duplicates of the previous slot, the rest uniform over slots 1..; past the prefix
// and in row padding, slot 0 or kFarIndex. Tokens with an empty row get only negative slots where
// their section has no lengths to empty it.
std::vector<std::int32_t> draw_indices(Rng& rng, const Dsv41Case& c, bool extra, long long slots, const std::vector<std::int32_t>& len) {
  const int topk = extra ? c.extra_topk : c.topk;
  const int stride = extra ? topk : topk + c.idx_pad;
  const bool lengths_given = extra ? c.extra_lengths_given() : c.main_lengths_given();
  std::vector<std::int32_t> idx(static_cast<std::size_t>(c.tokens) * stride, kFarIndex);
  for (int t = 0; t < c.tokens; ++t) {
    std::int32_t* row = &idx[static_cast<std::size_t>(t) * stride];
    const int active = lengths_given ? std::clamp(len[t], 0, topk) : topk;
    bool all_negative = false;
    if (static_cast<std::size_t>(t) < c.empty_rows.size()) {
      const EmptyRow e = c.empty_rows[t];
      all_negative = e == EmptyRow::kAllMasked || (!lengths_given && (extra ? empties_extra(e) : empties_main(e)));
    }
    for (int j = 0; j < topk; ++j) {
      if (j >= active) {
        row[j] = (j % 2) ? 0 : kFarIndex;
        continue;
      }
      const int r = rng.below(100);
      std::int32_t v = 1 + static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(slots - 1));
      if (all_negative || r < c.masked_percent) v = r % 10 == 0 ? INT_MIN : r % 10 == 1 ? -12345 : -1;
      else if (r < c.masked_percent + 5 && j > 0 && row[j - 1] >= 0) v = row[j - 1];
      row[j] = v;
    }
  }
  return idx;
}

}  // namespace

HostCase::HostCase(const Dsv41Case& dc, std::uint64_t seed, int round_count) : c(dc) {
  Rng rng(seed);
  sink.resize(c.heads);
  for (float& s : sink) s = rng.uniform(-2.f, 4.f);
  const long long main_slots = pool_pages(c.page) * c.page;
  const long long extra_slots = c.has_extra ? pool_pages(c.extra_page) * c.extra_page : 0;
  std::vector<bool> main_live(main_slots, false), extra_live(extra_slots, false);
  for (int r = 0; r < round_count; ++r) {
    Inputs in;
    in.q.resize(static_cast<std::size_t>(c.tokens) * c.heads * kDims);
    for (auto& v : in.q) v = kt::float_to_bf16(rng.normal() * c.q_scale);
    in.len = c.main_lengths_given() ? draw_lengths(rng, c, false) : std::vector<std::int32_t>{};
    in.idx = draw_indices(rng, c, false, main_slots, in.len);
    if (c.has_extra) {
      in.xlen = c.extra_lengths_given() ? draw_lengths(rng, c, true) : std::vector<std::int32_t>{};
      in.xidx = draw_indices(rng, c, true, extra_slots, in.xlen);
    }
    rounds.push_back(std::move(in));
    for (int t = 0; t < c.tokens; ++t) {
      for (const std::int32_t s : kt::dsv41_valid_candidates(section(rounds.back(), false), t)) main_live[s] = true;
      if (c.has_extra) {
        for (const std::int32_t s : kt::dsv41_valid_candidates(section(rounds.back(), true), t)) extra_live[s] = true;
      }
    }
  }
  main = make_pool_image(Dsv41Format::kMain, c.page, c.stride_pad, main_live, seed * 31 + 1);
  if (c.has_extra) extra = make_pool_image(Dsv41Format::kExtra, c.extra_page, c.extra_stride_pad, extra_live, seed * 31 + 2);
}

Dsv41Section HostCase::section(const Inputs& in, bool is_extra) const {
  kt::Dsv41Section s;
  if (!is_extra) {
    s.cache = {Dsv41Format::kMain, main.bytes.data(), main.page_stride, c.page};
    s.indices = in.idx.data();
    s.row_stride = c.topk + c.idx_pad;
    s.topk = c.topk;
    s.lengths = in.len.empty() ? nullptr : in.len.data();
  } else {
    s.cache = {Dsv41Format::kExtra, extra.bytes.data(), extra.page_stride, c.extra_page};
    s.indices = in.xidx.data();
    s.row_stride = c.extra_topk;
    s.topk = c.extra_topk;
    s.lengths = in.xlen.empty() ? nullptr : in.xlen.data();
  }
  return s;
}

Reference run_oracle(const HostCase& h, const Inputs& in, double lse_scale) {
  const Dsv41Case& c = h.c;
  Reference ref;
  ref.out.assign(static_cast<std::size_t>(c.tokens) * c.heads * kDims, 0.f);
  ref.lse.assign(static_cast<std::size_t>(c.tokens) * c.heads, 0.f);
  ref.empty.assign(c.tokens, false);
  kt::Dsv41Problem pr;
  pr.tokens = c.tokens;
  pr.heads = c.heads;
  pr.q = in.q.data();
  pr.main = h.section(in, false);
  if (c.has_extra) pr.extra = h.section(in, true);
  pr.attn_sink = c.sink ? h.sink.data() : nullptr;
  pr.sm_scale = h.sm_scale;
  pr.lse_scale = lse_scale;
  for (int t = 0; t < c.tokens; ++t) {
    ref.empty[t] = kt::dsv41_valid_candidates(pr.main, t).empty() && (!c.has_extra || kt::dsv41_valid_candidates(pr.extra, t).empty());
  }
  kt::parallel_head_blocks(c.tokens, c.heads, [&](int t, int h0, int hn) {
    kt::Dsv41Problem s = pr;
    s.tokens = 1;
    s.heads = hn;
    s.q = pr.q + (static_cast<std::size_t>(t) * c.heads + h0) * kDims;
    for (kt::Dsv41Section* sec : {&s.main, &s.extra}) {
      if (sec->indices == nullptr) continue;
      sec->indices += t * sec->row_stride;
      if (sec->lengths) sec->lengths += t;
    }
    if (s.attn_sink) s.attn_sink += h0;
    kt::dsv41_reference(s, ref.out.data() + (static_cast<std::size_t>(t) * c.heads + h0) * kDims,
                        ref.lse.data() + static_cast<std::size_t>(t) * c.heads + h0);
  });
  return ref;
}


}  // namespace kiln::testing::dsv41_matrix
