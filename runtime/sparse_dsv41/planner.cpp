#include "kiln/runtime/sparse_dsv41/planner.h"

#include <algorithm>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/validation.h"

namespace kiln::dsv41 {

namespace {

constexpr int kTwoTileHeads[] = {32, 48, 64, 80, 96, 112, 128};
constexpr int kMaxChunksPerBlock = 16;

std::string num(std::int64_t v) { return fmt::format("{}", v); }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

void check_counts(int topk, int extra_topk) {
  if (topk < 0) check::fail("topk", ">= 0", num(topk));
  if (extra_topk < 0) check::fail("extra_topk", ">= 0", num(extra_topk));
}

void check_sms(int sms) {
  if (sms < 1) check::fail_as(fmt::format("num_sms must be positive, got {}", sms), "num_sms", ">= 1", num(sms));
}

// The first split count, over chunks-per-block 1..16, that stays within [min_s, max_splits] and
// keeps base * s blocks under `cap`.
std::optional<std::int64_t> first_fitting(std::int64_t chunks, std::int64_t min_s, std::int64_t max_splits, std::int64_t base,
                                          std::int64_t cap) {
  for (std::int64_t cpb = 1; cpb <= kMaxChunksPerBlock; ++cpb) {
    const std::int64_t s = ceil_div(chunks, cpb);
    if (s >= min_s && s <= max_splits && base * s <= cap) return s;
  }
  return std::nullopt;
}

// GB10 (unified memory): double the splits while the grid stays under two thirds (one split) or
// half (more) of the SMs and each split keeps >= 2 chunks.
std::int64_t unified_splits(std::int64_t chunks, std::int64_t min_s, std::int64_t max_splits, std::int64_t base, std::int64_t sms) {
  std::int64_t want = min_s;
  while (2 * want <= max_splits && ceil_div(chunks, 2 * want) >= 2) {
    const std::int64_t cap = want == 1 ? sms * 2 / 3 : sms / 2;
    if (base * 2 * want > cap) break;
    want *= 2;
  }
  if (want == 1 && chunks >= 8 && sms < base && 2 * base <= sms * 8 / 3) want = 2;
  return want;
}

// Discrete GPUs: the first split count that fits 23/20 of the SMs; past a wave, the smallest count
// up to 3 whose last wave is >= 90% full; then the fitted cases of the upstream tables.
std::int64_t discrete_splits(std::int64_t chunks, std::int64_t min_s, std::int64_t max_splits, std::int64_t base, std::int64_t sms,
                             bool ragged) {
  std::int64_t s = min_s;
  const std::int64_t cap = sms * 23 / 20;
  if (const auto fit = first_fitting(chunks, min_s, max_splits, base, cap)) {
    s = *fit;
  } else if (base >= sms && chunks >= 8) {
    for (std::int64_t t = 1; t <= 3; ++t) {
      if (std::max(s, t) > max_splits) break;
      if (10 * base * t >= 9 * sms * ceil_div(base * t, sms)) {
        s = std::max(s, t);
        break;
      }
    }
  }
  if (sms / 4 <= base && base <= sms / 2 && (chunks == 6 || chunks >= 16) && min_s <= 2 && 2 <= max_splits) {
    s = 2;
  } else if (sms / 2 < base && base <= sms * 2 / 3 && chunks == 10 && max_splits >= 4) {
    s = 4;
  }
  if (ragged && chunks == 10 && sms / 4 <= base && base <= sms / 2 && max_splits >= 4 && 20 * base <= 7 * sms) s = 4;
  return s;
}

}  // namespace

std::span<const int> supported_heads() { return kDsv41Heads; }

std::span<const int> two_tile_heads() { return kTwoTileHeads; }

int num_chunks(int topk, int extra_topk) {
  check_counts(topk, extra_topk);
  return sparse::chunks_of(topk, extra_topk);
}

int plan_head_tiles(int tokens, int heads, int topk, int extra_topk, int sms) {
  (void)tokens, (void)topk, (void)extra_topk;  // upstream's signature; the rule reads H alone
  check_sms(sms);
  return std::find(std::begin(kTwoTileHeads), std::end(kTwoTileHeads), heads) != std::end(kTwoTileHeads) ? 2 : 1;
}

std::int64_t scratch_bytes(int tokens, int heads, int topk, int extra_topk) {
  return sparse::scratch_bytes_for_chunks(tokens, heads, num_chunks(topk, extra_topk));
}

SplitPlan plan_splits(int tokens, int heads, int topk, int extra_topk, int sms, const SplitOptions& o) {
  if (tokens < 0) check::fail("num_tokens", ">= 0", num(tokens));
  if (heads < 1) check::fail("num_heads", ">= 1", num(heads));
  check_sms(sms);
  if (o.head_tiles != 1 && o.head_tiles != 2) {
    check::fail_as(fmt::format("head_tiles must be 1 or 2, got {}", o.head_tiles), "head_tiles", "1 or 2", num(o.head_tiles));
  }
  const int chunks = num_chunks(topk, extra_topk);
  if (chunks < 1) {
    check::fail_as("the plan needs at least one candidate (topk + extra_topk >= 1)", "topk", "topk + extra_topk >= 1",
                   fmt::format("topk {} + extra_topk {}", topk, extra_topk));
  }
  const std::int64_t min_s = sparse::min_splits_for_chunks(chunks, o.max_splits);
  const std::int64_t base = std::int64_t(tokens) * ceil_div(heads, 16 * o.head_tiles);
  std::int64_t s = min_s;
  if (chunks == 2 && o.max_splits > 1 && !o.unified_memory && base * 10 <= sms) s = 2;
  if (chunks > 2 && o.max_splits > 1) {
    s = o.unified_memory ? unified_splits(chunks, min_s, o.max_splits, base, sms)
                         : discrete_splits(chunks, min_s, o.max_splits, base, sms, o.ragged);
  }
  const int cpb = static_cast<int>(ceil_div(chunks, s));
  return SplitPlan{static_cast<int>(ceil_div(chunks, cpb)), cpb};
}

SplitPlan resolve_splits(int topk, int extra_topk, int num_splits) {
  return sparse::resolve_splits_for_chunks(num_chunks(topk, extra_topk), num_splits);
}

}  // namespace kiln::dsv41
