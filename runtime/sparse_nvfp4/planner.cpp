#include "runtime/sparse_nvfp4/planner.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "jit/error.h"
#include "kernel_templates/sparse_nvfp4/params.cuh"

namespace kiln::sparse {

namespace {

[[noreturn]] void bad(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

void check_topk(int topk, int extra_topk) {
  if (topk < 1) bad(fmt::format("topk: expected >= 1, given {}", topk));
  if (extra_topk < 0) bad(fmt::format("extra_topk: expected >= 0, given {}", extra_topk));
}

void check_common(int tokens, int heads, int topk, int extra_topk, int sms) {
  if (tokens < 0) bad(fmt::format("tokens (T): expected >= 0, given {}", tokens));
  if (heads < 8 || heads > 128 || heads % 8 != 0)
    bad(fmt::format("heads (H): expected a multiple of 8 in [8, 128], given {}", heads));
  check_topk(topk, extra_topk);
  if (sms < 1) bad(fmt::format("sms: expected >= 1, given {}", sms));
}

}  // namespace

int num_chunks(int topk, int extra_topk) {
  check_topk(topk, extra_topk);
  return ceil_div(topk, kSparseChunk) + ceil_div(extra_topk, kSparseChunk);
}

int64_t scratch_bytes(int tokens, int heads, int topk, int extra_topk) {
  if (tokens < 0) bad(fmt::format("tokens (T): expected >= 0, given {}", tokens));
  if (heads < 1) bad(fmt::format("heads (H): expected >= 1, given {}", heads));
  const int64_t rows = int64_t(tokens) * heads;
  return rows * num_chunks(topk, extra_topk) * (512 * 2 + 4) + rows * 4 + 48;
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
  if (max_splits < 1) bad(fmt::format("max_splits: expected >= 1, given {}", max_splits));
  if (head_tiles != 1 && head_tiles != 2) bad(fmt::format("head_tiles: expected 1 or 2, given {}", head_tiles));
  if (head_tiles == 2 && heads % 32 != 0)
    bad(fmt::format("head_tiles: 2 needs heads % 32 == 0, given heads {}", heads));
  const int chunks = num_chunks(topk, extra_topk);
  const int min_splits = ceil_div(chunks, kSparseMaxChunksPerBlock);
  if (min_splits > max_splits)
    bad(fmt::format("max_splits: {} chunks need at least {} splits (<= {} chunks per block), given max_splits {}",
                    chunks, min_splits, kSparseMaxChunksPerBlock, max_splits));
  const int64_t base = int64_t(tokens) * ceil_div(heads, 16 * head_tiles);
  int splits = min_splits;
  if (chunks > 2 && max_splits > 1) {
    const bool small_die = sms < 64;
    const int64_t grid_cap = small_die ? sms / 3 : int64_t(sms) * 4 / 5;
    const int64_t stream_cap = small_die ? sms / 6 : int64_t(sms) * 4 / 5;
    const int min_cpb = small_die ? 2 : (base == 1 ? 1 : 2);
    if (2 * base <= grid_cap) {
      int want = min_splits;
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

SplitPlan resolve_splits(int topk, int extra_topk, int num_splits) {
  const int chunks = num_chunks(topk, extra_topk);
  if (num_splits < 1) bad(fmt::format("num_splits: expected >= 1, given {}", num_splits));
  const int cpb = ceil_div(chunks, num_splits);
  if (cpb > kSparseMaxChunksPerBlock)
    bad(fmt::format("num_splits: {} splits leave {} chunks per block (at most {}) for {} chunks; use >= {}",
                    num_splits, cpb, kSparseMaxChunksPerBlock, chunks, ceil_div(chunks, kSparseMaxChunksPerBlock)));
  return SplitPlan{ceil_div(chunks, cpb), cpb};
}

}  // namespace kiln::sparse
