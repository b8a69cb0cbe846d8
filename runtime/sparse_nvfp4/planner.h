#pragma once
// Pure host planners of the sparse NVFP4 MLA decode (runtime/sparse_nvfp4/README.md, "Chunks, splits,
// head tiles"). No CUDA calls; invalid input throws kiln::Error(kInvalidArgument) naming the argument.
// `sms` is the device's SM count (DeviceLimits::sm_count).
#include <cstdint>

namespace kiln::sparse {

struct SplitPlan {
  int num_splits = 1;
  int chunks_per_block = 1;
  bool operator==(const SplitPlan&) const = default;
};

// 64-slot chunks of the main plus the extra section.
int num_chunks(int topk, int extra_topk);

// The rules below are stated on a chunk count, so that every sparse decode family (each with its
// own rule for which topk it takes) shares them.
// ceil(topk / 64) + ceil(extra_topk / 64), for counts already checked (>= 0).
constexpr int chunks_of(int topk, int extra_topk) {
  return static_cast<int>((static_cast<long long>(topk) + 63) / 64 + (static_cast<long long>(extra_topk) + 63) / 64);
}
// The fewest splits that keep every block at <= 16 of `chunks`; throws naming max_splits (the
// message starts "<chunks> chunks need at least <n> splits (at most 16 chunks per block),
// max_splits=<m>") when that exceeds `max_splits`.
int min_splits_for_chunks(int chunks, int max_splits);
// T*H*chunks*(512*2 + 4) + T*H*4 + 48 bytes.
int64_t scratch_bytes_for_chunks(int tokens, int heads, int chunks);
// An explicit num_splits over `chunks`: >= 1 ("num_splits must be positive"), cpb = ceil(chunks /
// num_splits) <= 16 ("... at most 16"); returns {ceil(chunks / cpb), cpb}.
SplitPlan resolve_splits_for_chunks(int chunks, int num_splits);

// The fewest splits that keep every block at <= 16 chunks; throws (naming max_splits) when that
// exceeds `max_splits`.
int min_splits(int topk, int extra_topk, int max_splits);

// Scratch for a plan that may split every chunk: T*H*chunks*(512*2 + 4) + T*H*4 + 48 bytes.
int64_t scratch_bytes(int tokens, int heads, int topk, int extra_topk);

// 1 (16 heads per block) or 2 (32 heads share one gather).
int plan_head_tiles(int tokens, int heads, int topk, int extra_topk, int sms);

SplitPlan plan_splits(int tokens, int heads, int topk, int extra_topk, int sms, int max_splits = 16,
                      int head_tiles = 1);

// An explicit num_splits normalised like a planned one: cpb = ceil(chunks / num_splits) (must be
// <= 16), splits = ceil(chunks / cpb).
SplitPlan resolve_splits(int topk, int extra_topk, int num_splits);

}  // namespace kiln::sparse
