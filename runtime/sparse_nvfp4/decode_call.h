#pragma once
// The format-independent half of a sparse MLA decode call, shared by the sparse decode families
// (sparse_nvfp4, sparse_dsv41): they take the same tensors, fill the same SparseNvfp4Params and
// merge a split plan with the same kernel; only the cache records, the head counts and the choice of
// decode kernel differ. Host only; nothing here allocates or formats unless it throws.
#include <cuda.h>

#include <optional>
#include <string_view>

#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/kernel_handle.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/launch_config.h"
#include "kiln/runtime/paged_cache_view.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::sparse {

// FlashInfer's keyword arguments common to the sparse decode entries. Optional tensors are absent
// when empty; every given one is checked.
struct SparseCallOptions {
  std::optional<TensorView> topk_length;        // int32 [>= T]: active prefix of each indices row
  std::optional<TensorView> attn_sink;          // fp32 [>= H]: natural-log sink logit per head
  std::optional<TensorView> extra_kv_cache;     // second pool; needs extra_indices
  std::optional<TensorView> extra_indices;      // int32 [T, extra_topk] or [T, 1, extra_topk]; needs extra_kv_cache
  std::optional<TensorView> extra_topk_length;  // int32 [>= T]; needs extra_indices
  std::optional<TensorView> mid_out;            // bf16 [T, H, S, 512], S >= num_splits: required when the plan splits
  std::optional<TensorView> mid_lse;            // fp32 [T, H, S], same S as mid_out
  double lse_scale = 1.0;                       // multiplies the base-2 LSE (ln 2 gives natural log)
  std::optional<int> num_splits;                // overrides plan_splits (normalised like a planned value)
  int max_splits = 16;                          // caps plan_splits
  std::optional<int> head_tiles;                // overrides the head-tile planner (each family's rule)
};

// The positional arguments of a call, with its options.
struct SparseCallArgs {
  const TensorView& q;
  const TensorView& kv_cache;
  const TensorView& indices;
  const TensorView& output;
  const TensorView& out_lse;
  double sm_scale;
  const SparseCallOptions& opt;
};

// A family's call arguments: the shared part, and its own options type for the family's own rules.
template <class Options>
struct SparseFamilyArgs : SparseCallArgs {
  const Options& opt;
  SparseFamilyArgs(const TensorView& q, const TensorView& kv, const TensorView& idx, const TensorView& out,
                   const TensorView& lse, double sm_scale, const Options& o)
      : SparseCallArgs{q, kv, idx, out, lse, sm_scale, o}, opt(o) {}
};

// What differs between the families' argument checks.
struct SparseCallFormat {
  // Throws for a head count H the family does not serve (q's shape is [T, H, 512] by then).
  void (*check_heads)(const TensorView& q, std::int64_t heads);
  // The main and the extra cache's views (each family's record format and accepted views).
  PagedCacheGeometry (*check_main_cache)(const TensorView& cache, std::string_view arg);
  PagedCacheGeometry (*check_extra_cache)(const TensorView& cache, std::string_view arg);
  // The fewest extra_indices slots per token.
  std::int64_t min_extra_topk;
};

// A call's shape once its tensors passed the checks.
struct SparseCall {
  std::int64_t tokens = 0;
  int heads = 0;
  int topk = 0;
  int extra_topk = 0;
  bool has_extra = false;
  PagedCacheGeometry main;
  PagedCacheGeometry extra;
  int split_stride = 0;  // S of mid_out/mid_lse, 0 when absent
};

// Every rule on q, the caches, indices, outputs, scales, lengths, sink, extra pool and mid_out /
// mid_lse shapes (in that order; the plan overrides and aliasing are checked by the callers after).
SparseCall check_sparse_tensors(const SparseCallArgs& a, const SparseCallFormat& format);

// No byte an output is written to may be read as an input or written as another output.
void check_sparse_aliasing(const SparseCallArgs& a, const SparseCall& c);

// Fails the call when mid_out/mid_lse cannot hold `num_splits` splits (T > 0: nothing is written at
// T == 0); `why` says what made the plan split.
void require_sparse_scratch(const SparseCallArgs& a, const SparseCall& c, int num_splits, const char* why);

// Fails a plan whose 16-head decode grid would not fit the driver's grid dimension.
void check_sparse_grid(const SparseCall& c, int num_splits);

// Every tensor of the call lives on the stream's device.
void check_sparse_devices(const StreamDevice& on, const SparseCallArgs& a);

// The kernels' parameter block for a resolved plan.
SparseNvfp4Params sparse_params(const SparseCallArgs& a, const SparseCall& c, int num_splits, int chunks_per_block);

// The sm90 decode's geometry for `heads` (the policy's), `cluster` dealt slices per head group and
// `smem_bytes` of dynamic shared memory: head-group pairs share a cluster unless `unpaired`.
LaunchConfig sparse_sm90_config(const SparseNvfp4Params& params, int heads, int cluster, bool unpaired, std::size_t smem_bytes);

// The decode launch (`decode`'s geometry; the module's kernel `entry`: kSparseSm90UnpairedEntry for
// an unpaired sm90 launch, kDsv41StagedEntry for the V4.1 default variant's staged body), then,
// when `params.split`, the merge (sparse_nvfp4_merge_kernel, the module of the handle's
// sparse_merge companion). With `pdl` both are programmatic dependents of
// the kernel before them in the stream: their blocks start during its tail and wait for it
// (griddepcontrol.wait) before reading any input.
void launch_sparse_decode(const KernelHandle& handle, LaunchConfig decode, const SparseNvfp4Params& params, bool pdl,
                          CUstream stream, int entry = 0);

// The target kiln compiles for `device` (cached per device: after the first query one atomic load,
// so device_arch's lock stays off the launch path).
enum class SparseTarget { kSm90a, kSm120a, kOther };
SparseTarget device_target(KernelService& service, int device);

}  // namespace kiln::sparse
