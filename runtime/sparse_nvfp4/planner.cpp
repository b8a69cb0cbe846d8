#include "kiln/runtime/sparse_nvfp4/planner.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "kiln/runtime/validation.h"

namespace kiln::sparse {

namespace {

std::string num(int64_t v) { return fmt::format("{}", v); }

int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

void check_topk(int topk, int extra_topk) {
  if (topk < 1) check::fail_as("topk must be at least 1", "topk", ">= 1", num(topk));
  if (extra_topk < 0) check::fail("extra_topk", ">= 0", num(extra_topk));
}

void check_common(int tokens, int heads, int topk, int extra_topk, int sms) {
  if (tokens < 0) check::fail("tokens (T)", ">= 0", num(tokens));
  kHeadsRule.check("heads (H)", heads);
  check_topk(topk, extra_topk);
  if (sms < 1) check::fail("sms", ">= 1", num(sms));
}

}  // namespace

int num_chunks(int topk, int extra_topk) {
  check_topk(topk, extra_topk);
  return chunks_of(topk, extra_topk);
}

int min_splits_for_chunks(int chunks, int max_splits) {
  const int n = ceil_div(chunks, kSparseMaxChunksPerBlock);
  if (n > max_splits) {
    check::fail_as(fmt::format("{} chunks need at least {} splits (at most {} chunks per block), max_splits={}", chunks, n,
                               kSparseMaxChunksPerBlock, max_splits),
                   "max_splits",
                fmt::format(">= {} ({} chunks need that many splits of <= {} chunks)", n, chunks, kSparseMaxChunksPerBlock),
                num(max_splits));
  }
  return n;
}

int min_splits(int topk, int extra_topk, int max_splits) {
  if (max_splits < 1) check::fail("max_splits", ">= 1", num(max_splits));
  return min_splits_for_chunks(num_chunks(topk, extra_topk), max_splits);
}

int64_t scratch_bytes_for_chunks(int tokens, int heads, int chunks) {
  if (tokens < 0) check::fail("tokens (T)", ">= 0", num(tokens));
  if (heads < 1) check::fail("heads (H)", ">= 1", num(heads));
  const int64_t rows = int64_t(tokens) * heads;
  return rows * chunks * (512 * 2 + 4) + rows * 4 + 48;
}

int64_t scratch_bytes(int tokens, int heads, int topk, int extra_topk) {
  if (tokens < 0) check::fail("tokens (T)", ">= 0", num(tokens));
  if (heads < 1) check::fail("heads (H)", ">= 1", num(heads));
  return scratch_bytes_for_chunks(tokens, heads, num_chunks(topk, extra_topk));
}

int plan_head_tiles(int tokens, int heads, int topk, int extra_topk, int sms) {
  check_common(tokens, heads, topk, extra_topk, sms);
  const int chunks = num_chunks(topk, extra_topk);
  const int64_t ctas = int64_t(tokens) * heads / 16;
  if (heads % 32 != 0) return 1;
  if (ctas >= sms) {
    // Small dies: two-chunk work at many heads is latency-bound; keep the finer grid.
    if (sms < 64 && chunks <= 2 && heads > 32 && ctas > 2 * int64_t(sms)) return 1;
    return 2;
  }
  const int64_t third = sms / 3, two_thirds = 2 * sms / 3;
  if (heads == 32) return (ctas >= two_thirds || (chunks >= 8 && ctas >= third)) ? 2 : 1;
  if (heads == 64) return (chunks >= 8 && ctas >= third && ctas < two_thirds) ? 2 : 1;
  if (heads >= 96) return (chunks >= 16 && ctas >= third) ? 2 : 1;
  return 1;
}

SplitPlan plan_splits(int tokens, int heads, int topk, int extra_topk, int sms, int max_splits, int head_tiles) {
  check_common(tokens, heads, topk, extra_topk, sms);
  SparsePolicy{heads, head_tiles}.validate();
  const int chunks = num_chunks(topk, extra_topk);
  const int fewest = min_splits(topk, extra_topk, max_splits);
  const int64_t base = int64_t(tokens) * ceil_div(heads, 16 * head_tiles);
  int splits = fewest;
  if (chunks > 2 && max_splits > 1) {
    const bool small_die = sms < 64;
    const int64_t grid_cap = small_die ? sms / 3 : int64_t(sms) * 4 / 5;
    const int64_t stream_cap = small_die ? sms / 6 : int64_t(sms) * 4 / 5;
    const int min_cpb = small_die ? 2 : (base == 1 ? 1 : 2);
    if (2 * base <= grid_cap) {
      int want = fewest;
      while (2 * want <= max_splits && base * 2 * want <= grid_cap && int64_t(tokens) * 2 * want <= stream_cap &&
             ceil_div(chunks, 2 * want) >= min_cpb)
        want *= 2;
      splits = want;
    } else if (!small_die && base >= sms && chunks >= 16) {
      const int64_t tail = (2 * base) % sms;
      if (tail == 0 || 2 * tail >= sms) splits = std::max(splits, 2);
    }
  }
  const int cpb = ceil_div(chunks, splits);
  return SplitPlan{ceil_div(chunks, cpb), cpb};
}

SplitPlan resolve_splits_for_chunks(int chunks, int num_splits) {
  if (num_splits < 1) check::fail_as(fmt::format("num_splits must be positive, got {}", num_splits), "num_splits", ">= 1", num(num_splits));
  const int cpb = ceil_div(chunks, num_splits);
  if (cpb > kSparseMaxChunksPerBlock) {
    check::fail_as(fmt::format("num_splits={} leaves {} chunks per CTA; the index table holds at most {}", num_splits, cpb,
                               kSparseMaxChunksPerBlock),
                   "num_splits",
                fmt::format("at least {} splits so that each block handles <= {} of the {} chunks",
                            ceil_div(chunks, kSparseMaxChunksPerBlock), kSparseMaxChunksPerBlock, chunks),
                fmt::format("{} ({} chunks per block)", num_splits, cpb));
  }
  return SplitPlan{ceil_div(chunks, cpb), cpb};
}

SplitPlan resolve_splits(int topk, int extra_topk, int num_splits) {
  return resolve_splits_for_chunks(num_chunks(topk, extra_topk), num_splits);
}

}  // namespace kiln::sparse
