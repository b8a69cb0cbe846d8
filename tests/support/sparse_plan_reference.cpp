#include "tests/support/sparse_plan_reference.h"

#include <algorithm>
#include <stdexcept>

namespace kiln::testing {

namespace {

long long up(long long a, long long b) { return (a + b - 1) / b; }

int head_tiles_rule(long long tokens, int heads, long long chunks, long long sms) {
  if (heads % 32 != 0) return 1;
  const long long ctas = tokens * heads / 16;
  if (ctas >= sms) {
    const bool small_die = sms < 64;
    return (small_die && chunks <= 2 && heads > 32 && ctas > 2 * sms) ? 1 : 2;
  }
  const long long third = sms / 3, two_thirds = 2 * sms / 3;
  switch (heads) {
    case 32: return (ctas >= two_thirds || (chunks >= 8 && ctas >= third)) ? 2 : 1;
    case 64: return (chunks >= 8 && ctas >= third && ctas < two_thirds) ? 2 : 1;
    default: return (heads >= 96 && chunks >= 16 && ctas >= third) ? 2 : 1;
  }
}

long long splits_rule(long long tokens, int heads, long long chunks, long long sms, int max_splits, int head_tiles) {
  const long long fewest = up(chunks, 16);
  if (fewest > max_splits) throw std::invalid_argument("the spec rejects this call: max_splits below ceil(chunks / 16)");
  const long long base = tokens * up(heads, 16 * head_tiles);
  long long splits = fewest;
  if (chunks <= 2 || max_splits <= 1) return splits;
  const bool small_die = sms < 64;
  const long long grid_cap = small_die ? sms / 3 : sms * 4 / 5;
  const long long stream_cap = small_die ? sms / 6 : sms * 4 / 5;
  const long long min_cpb = small_die ? 2 : (base == 1 ? 1 : 2);
  if (2 * base <= grid_cap) {
    long long want = fewest;
    for (;;) {
      const long long twice = 2 * want;
      if (twice > max_splits || base * twice > grid_cap || tokens * twice > stream_cap || up(chunks, twice) < min_cpb) break;
      want = twice;
    }
    splits = want;
  } else if (!small_die && base >= sms && chunks >= 16) {
    const long long tail = (2 * base) % sms;
    if (tail == 0 || 2 * tail >= sms) splits = std::max<long long>(splits, 2);
  }
  return splits;
}

}  // namespace

SparsePlanRef sparse_plan_reference(int tokens, int heads, int topk, int extra_topk, int sms, std::optional<int> num_splits,
                                    int max_splits, std::optional<int> head_tiles) {
  const long long chunks = up(topk, 64) + up(extra_topk, 64);
  SparsePlanRef r;
  r.head_tiles = head_tiles ? *head_tiles : head_tiles_rule(tokens, heads, chunks, sms);
  const long long splits = num_splits ? *num_splits : splits_rule(tokens, heads, chunks, sms, max_splits, r.head_tiles);
  const long long cpb = up(chunks, splits);  // both the planned and an explicit count normalise this way
  r.chunks_per_block = static_cast<int>(cpb);
  r.num_splits = static_cast<int>(up(chunks, cpb));
  return r;
}

}  // namespace kiln::testing
