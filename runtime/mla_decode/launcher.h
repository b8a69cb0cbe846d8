#pragma once
// Engine API of paged MLA decode: the C++ form of FlashInfer's
// prims_ts_batch_decode_with_kv_cache_mla (contract: runtime/mla_decode/README.md), plus the workspace-size
// helper and the warm function a server calls before CUDA graph capture.
//
// Typical server flow:
//   1. at start-up, warm_mla(...) every policy it will serve (or `kiln warm --manifest`);
//   2. size one workspace per in-flight launch / captured graph with mla_workspace_size(..., batch);
//   3. capture prims_ts_batch_decode_with_kv_cache_mla(..., out, ..., stream) calls: a warm key costs
//      one hash lookup and one or two kernel launches; nothing is allocated, formatted or read back.
//
// Every function takes the KernelService to use as its last argument (the process-wide one by default).
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::mla {

// Paged MLA decode over a FlashInfer-layout paged cache (576 = 512 latent + 64 RoPE per row).
//
// Shapes (B = batch, H = heads, SQ = query rows per request in fixed mode):
//   query            fixed [B, SQ, H, 576] or packed [total_q, H, 576]; bf16, or e4m3 with an e4m3 cache.
//                    DLPack 0.6 has no fp8 code: build fp8 views with TensorView directly (or set
//                    dtype = DType::kE4m3 on the uint8 view from_dlpack returns).
//   kv_cache         [num_pages, page_size, 576] or [num_pages, 1, page_size, 576]; same dtype as query;
//                    page_size 16, 32, 64 or 128.
//   workspace_buffer uint8/int8, contiguous, 32-byte aligned, >= mla_workspace_size(...) bytes; no
//                    zeroing needed; exclusive to one in-flight launch or captured graph.
//   block_tables     int32 [B, max_pages], inner stride 1, row stride >= max_pages,
//                    max_pages >= ceil(max_seq_len / page_size).
//   seq_lens         int32 [B], contiguous, values 1..max_seq_len (not checked: no device reads).
//   qo_indptr        int32 [B + 1]; present = packed mode. Values (0, non-decreasing, deltas <=
//                    max_seq_len_q, last = total_q) are the caller's contract, never read on the host.
//   max_seq_len_q    required in packed mode; in fixed mode optional and must equal SQ.
//   out              [B, SQ, H, 512] or [total_q, H, 512], dtype out_dtype, contiguous, 16-byte aligned,
//                    disjoint from every input. Pass it: when absent the call allocates the output
//                    with cuMemAlloc on the current context, which is NOT graph-safe (refused while
//                    `stream` is capturing), and the caller owns the returned view's memory and must
//                    release it with cuMemFree. An empty output (total_q == 0 or B == 0) allocates
//                    nothing and has a null data pointer.
//   bmm1_scale       softmax scale on q.k (natural-exponent domain), finite and > 0 as float32.
//   bmm2_scale       output scale, finite and > 0 as float32. FP8 dequant scales fold into both.
//
// kv_lora_rank must be 512 and qk_rope_head_dim 64 (others: kiln::Error kUnsupported).
// Returns the output view (`out` itself when given). Every argument is checked on the host before
// any driver call; a violation throws kiln::Error (kInvalidArgument or kUnsupported) naming the
// argument, what was expected and what was given. A launch with no query rows (packed total_q == 0,
// or B == 0) returns without touching the driver. A launch whose key is not warm compiles and
// loads it, except while `stream` is capturing (then kNotWarm naming the key).
// `kernel` (the policy's "kernel" field) forces a kernel variant, e.g. for tests and benchmarks;
// the workspace must then be sized for that policy (mla_workspace_size(policy, batch)). `precision`
// (the policy's "precision" field) picks the numerics of P on bf16 pages: kExact (the default,
// within the contract's tolerances on every input) or kBf16 (one bf16 P, FlashMLA's numerics, faster
// where the tensor cores limit); fp8 pages take kExact only.
TensorView prims_ts_batch_decode_with_kv_cache_mla(
    const TensorView& query, const TensorView& kv_cache, const TensorView& workspace_buffer, int kv_lora_rank,
    int qk_rope_head_dim, const TensorView& block_tables, const TensorView& seq_lens, long long max_seq_len,
    const std::optional<TensorView>& qo_indptr, std::optional<int> max_seq_len_q, const std::optional<TensorView>& out,
    double bmm1_scale, double bmm2_scale, MaskType mask, DType out_dtype, CUstream stream,
    KernelService& service = KernelService::global(), MlaKernel kernel = MlaKernel::kAuto,
    MlaPrecision precision = MlaPrecision::kExact);

// Workspace bytes for one launch of the policy at `batch` requests: exactly the semantic-key
// arguments plus batch. 0 means the kernel never splits KV for this policy and any (even empty)
// workspace will do. dtype: kBf16 or kE4m3 (q and cache). Independent of the device (the bound on
// parts assumes the largest SM count) and of the lengths, so a CPU-only process can size buffers;
// it grows with batch (one split record and one partial slot per request, plus one per part).
std::size_t mla_workspace_size(int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed,
                               DType dtype, DType out_dtype, MaskType mask, int batch);
std::size_t mla_workspace_size(const MlaDecodePolicy& policy, int batch);

// Compiles (or loads from the cache) and loads the policy's module on each device, with function
// attributes set, so that later launches (and graph capture) only look up a handle.
void warm_mla(int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed, DType dtype,
              DType out_dtype, MaskType mask, const std::vector<int>& devices,
              KernelService& service = KernelService::global());
void warm_mla(const MlaDecodePolicy& policy, const std::vector<int>& devices,
              KernelService& service = KernelService::global());

// What validation resolved from the arguments (for tests and debugging tools).
struct MlaProblem {
  MlaDecodePolicy policy;
  int batch = 0;
  long long total_q = 0;            // query tokens: B * SQ (fixed) or query.size(0) (packed)
  std::size_t workspace_bytes = 0;  // mla_workspace_size(policy, batch)
  TensorView out;                   // `out` when given, else its expected shape with a null pointer
};

// Every host check the launcher performs, and nothing else: no driver, no allocation on success.
MlaProblem validate_mla_arguments(const TensorView& query, const TensorView& kv_cache,
                                  const TensorView& workspace_buffer, int kv_lora_rank, int qk_rope_head_dim,
                                  const TensorView& block_tables, const TensorView& seq_lens, long long max_seq_len,
                                  const std::optional<TensorView>& qo_indptr, std::optional<int> max_seq_len_q,
                                  const std::optional<TensorView>& out, double bmm1_scale, double bmm2_scale,
                                  MaskType mask, DType out_dtype, MlaKernel kernel = MlaKernel::kAuto,
                                  MlaPrecision precision = MlaPrecision::kExact);

}  // namespace kiln::mla
