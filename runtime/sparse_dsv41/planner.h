#pragma once
// Pure host planners of the sparse DeepSeek-V4.1 MLA decode (runtime/sparse_dsv41/README.md,
// "Chunks, splits, head tiles"): FlashInfer's companion functions of
// cake_sparse_mla_sm120_dsv41_mixed_decode, rule for rule. No CUDA calls; invalid input throws
// kiln::Error(kInvalidArgument) naming the argument. `sms` is the device's SM count.
#include <cstdint>
#include <span>

#include "kiln/runtime/sparse_nvfp4/planner.h"

namespace kiln::dsv41 {

using sparse::SplitPlan;

// Record geometry and planner constants, as format_info() reports them.
struct Dsv41FormatInfo {
  int query_dim = 512, value_dim = 512;
  int main_bytes_per_token = 528, main_data_bytes = 512, main_scale_bytes = 16, main_scale_group = 32;
  int extra_bytes_per_token = 288, extra_data_bytes = 256, extra_scale_bytes = 32, extra_scale_group = 16;
  int chunk_width = 64, extra_chunk_width = 64;
  int heads_per_block = 16, max_chunks_per_block = 16;
};
inline constexpr Dsv41FormatInfo kDsv41FormatInfo{};

// (8, 16, 32, 48, 64, 80, 96, 112, 128).
std::span<const int> supported_heads();
// The head counts whose CTA serves two 16-head tiles from one gather: (32, 48, ..., 128).
std::span<const int> two_tile_heads();

// ceil(topk / 64) + ceil(extra_topk / 64); a zero count adds nothing (both must be >= 0).
int num_chunks(int topk, int extra_topk = 0);

// 2 when H is one of two_tile_heads(), else 1 (T and topk do not enter). Throws for sms < 1.
int plan_head_tiles(int tokens, int heads, int topk, int extra_topk, int sms);

// T*H*chunks*(512*2 + 4) + T*H*4 + 48: bf16 partials and fp32 LSEs for every plan, an fp32 [T, H]
// LSE and 3 x 16 bytes of alignment slack.
std::int64_t scratch_bytes(int tokens, int heads, int topk, int extra_topk = 0);

struct SplitOptions {
  int max_splits = 16;
  int head_tiles = 1;           // 1 or 2
  bool unified_memory = false;  // the device shares host memory (GB10, CC 12.1): a policy of its own
  bool ragged = false;          // the call passes topk_length or extra_topk_length
};

// (num_splits, chunks_per_block) for one decode call.
SplitPlan plan_splits(int tokens, int heads, int topk, int extra_topk, int sms, const SplitOptions& options = {});

// An explicit num_splits: >= 1, and cpb = ceil(chunks / num_splits) <= 16 (max_splits not consulted).
SplitPlan resolve_splits(int topk, int extra_topk, int num_splits);

}  // namespace kiln::dsv41
