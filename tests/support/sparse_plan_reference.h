#pragma once
// The sparse decode planners written again from the spec's text (spec/sparse_nvfp4_decode.md,
// "Chunks, splits, head tiles"), sharing no code with runtime/sparse_nvfp4/planner.cpp: the tests
// check the launcher's returned plans against this.
#include <optional>

namespace kiln::testing {

struct SparsePlanRef {
  int head_tiles = 1;
  int num_splits = 1;
  int chunks_per_block = 1;
};

// The plan of a call with T tokens, H heads and the given topk / extra_topk on a device with `sms`
// SMs, with the same optional overrides as the call (head_tiles, num_splits) and cap (max_splits).
SparsePlanRef sparse_plan_reference(int tokens, int heads, int topk, int extra_topk, int sms,
                                    std::optional<int> num_splits = std::nullopt, int max_splits = 16,
                                    std::optional<int> head_tiles = std::nullopt);

}  // namespace kiln::testing
