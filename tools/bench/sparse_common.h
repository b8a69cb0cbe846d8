#pragma once
// The method `kiln bench sparse` (NVFP4) and `kiln bench sparse_dsv41` (DeepSeek-V4.1 caches) share,
// so that their rows compare: >= 4 GB pools of random finite records; per config, N launcher calls
// captured in one CUDA graph, each with its own random index sets over the whole pools, so that one
// replay gathers >= 1 GiB the 50 MB L2 cannot hold from the call before; Q, outputs and split scratch
// shared by the calls (an engine's are L2-hot too); outputs poisoned before the warm-up replay and
// checked finite after it; per-call time = median replay / N.
#include <cuda.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/sparse_nvfp4/decode_call.h"
#include "kiln/runtime/tensor_view.h"
#include "tools/bench/ceilings.h"

namespace kiln::tools {

inline constexpr std::size_t kSparsePoolBytes = 4608 * kBenchMiB;  // per pool: >= 4 GB of candidates
inline constexpr int kSparseMinCalls = 4;                          // distinct index sets per graph, at least
inline constexpr int kSparseMaxCalls = 1024;
inline constexpr double kSparseSmScale = 0.044194173824159216;     // 512^-0.5, DeepSeek V4's

// One decode call's shape: T tokens, H heads, topk main and extra_topk extra candidates.
struct SparseShape {
  int tokens = 1, heads = 64, topk = 512, extra_topk = 0;
  bool has_extra() const { return extra_topk > 0; }
  // "T=64 H=128 topk=2048", "T=8 H=64 topk=128+512": as the sweep prints it and --only takes it.
  std::string name() const;
};

// "2048" or "128+512": the main candidates, then the extra ones where there are.
std::string sparse_candidates(int topk, int extra_topk);

// The grid of the FlashMLA sparse anchors: T in {1, 8, 64, 128, 512} x H in {64, 128} x the
// (topk, extra_topk) `sets`, in this order; `quick`: T in {1, 64} at H 128 with the first two sets.
std::vector<SparseShape> sparse_anchor_grid(bool quick, const std::vector<std::pair<int, int>>& sets);

// Keeps the config of `grid` named `only` (every one when it is empty); throws invalid_argument,
// suggesting `example`, when none is.
template <typename Config>
void sparse_keep_only(std::vector<Config>& grid, const std::string& only, std::string_view example) {
  if (only.empty()) return;
  std::erase_if(grid, [&](const Config& c) { return c.name() != only; });
  if (grid.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--only \"{}\" names no config of the grid; use a name as the sweep prints it, e.g. \"{}\"", only, example));
  }
}

// Fills `pool` with pages of `page_bytes` that `make_page` writes from `rng`: 24 MiB of distinct
// pages made on the host, replicated over the pool by doubling device copies. `what` names the pool
// in driver errors.
void fill_sparse_pool(const BenchDeviceMemory& pool, std::size_t page_bytes, BenchRng rng,
                      const std::function<void(std::uint8_t* page, BenchRng& rng)>& make_page, CUstream stream, const std::string& what);

// What time_sparse_graph measured of a config.
struct SparseGraphTimes : BenchReplayTimes {
  int calls = 0;                       // launcher calls per graph
  double gathered_mib_per_replay = 0;
  std::size_t bad_outputs = 0;         // NaN/Inf outputs or LSE after the warm-up replay
};

// A config's times with the plan its calls ran.
template <typename Plan>
struct SparseTiming : SparseGraphTimes {
  Plan plan;
};

// The split stride S of a bench call's mid_out / mid_lse: one split per chunk, as upstream's
// scratch_bytes sizes a caller's workspace (at least the plan's `planned_splits`).
int bench_scratch_splits(const SparseShape& c, int planned_splits);

// One launcher call of a timed graph; `opt` (time_sparse_graph's) carries the call's extra indices.
using SparseBenchCall = std::function<void(const TensorView& q, const TensorView& indices, const TensorView& output, const TensorView& out_lse)>;

// Times config `c` as both benches do. N = clamp(ceil(1 GiB / gathered_bytes), kSparseMinCalls,
// kSparseMaxCalls) calls, each with index sets of its own: main [T, topk] uniform over `main_slots`,
// extra [T, extra_topk] over `extra_slots`. Q, output, out_lse and the split scratch for `splits`
// are shared; `opt.mid_out` and `opt.mid_lse` are pointed at the scratch and `opt.extra_indices` at
// each call's extra set (views valid during this call only). `where` names the config in errors.
SparseGraphTimes time_sparse_graph(const SparseShape& c, double gathered_bytes, std::int64_t main_slots, std::int64_t extra_slots,
                                   int splits, sparse::SparseCallOptions& opt, const SparseBenchCall& launch, BenchRng& rng,
                                   CUstream stream, const std::string& where);

// The report's method.timing line for time_sparse_graph, over the bench's `pools` ("pool", "pools").
std::string sparse_timing_method(std::string_view pools);

// The fields every sparse bench row has: the config, the times per call, the gathered bandwidth and
// the MMA rate against the run's ceilings, the plan and the size of the graph.
template <typename Plan>
nlohmann::json sparse_row(const SparseShape& c, double gathered_bytes, double flop, const SparseTiming<Plan>& t,
                          const BenchCeilings& ceilings) {
  const double gb_s = gathered_bytes / (t.us * 1e-6) * 1e-9;
  const double tflop_s = flop / (t.us * 1e-6) * 1e-12;
  nlohmann::json r = {{"T", c.tokens},
                      {"H", c.heads},
                      {"topk", c.topk},
                      {"extra_topk", c.extra_topk},
                      {"us_per_call", t.us},
                      {"us_min", t.us_min},
                      {"us_max", t.us_max},
                      {"gathered_gb_s", gb_s},
                      {"pct_copy", 100 * gb_s * 1e-3 / ceilings.copy_tb_s()},
                      {"tflop_s", tflop_s},
                      {"pct_mma_sync_peak", 100 * tflop_s / ceilings.mma_tflop_s()},
                      {"gathered_bytes_per_call", gathered_bytes},
                      {"flop_per_call", flop},
                      {"head_tiles", t.plan.head_tiles},
                      {"num_splits", t.plan.num_splits},
                      {"chunks_per_block", t.plan.chunks_per_block},
                      {"calls_per_graph", t.calls},
                      {"replays_timed", t.replays},
                      {"gathered_mib_per_replay", t.gathered_mib_per_replay}};
  if (ceilings.wgmma_tflop_s() > 0) r["pct_wgmma_peak"] = 100 * tflop_s / ceilings.wgmma_tflop_s();
  return r;
}

}  // namespace kiln::tools
