#include "kiln/runtime/mla_decode/launcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kiln/jit/error.h"
#include "kiln/kernel_templates/mla_decode/params.cuh"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/mla_decode/planner.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/validation.h"

namespace kiln::mla {

namespace {

constexpr std::int64_t kInt32Max = INT32_MAX;

std::string num(std::int64_t v) { return fmt::format("{}", v); }

// Query and cache must be the same element type; a uint8 view is the usual sign of an fp8 tensor
// that came through DLPack 0.6 (no fp8 code), so say how to fix it.
void check_input_dtype(const TensorView& t, std::string_view arg) {
  if (t.dtype == DType::kBf16 || t.dtype == DType::kE4m3) return;
  if (t.dtype == DType::kU8 || t.dtype == DType::kI8) {
    check::fail(arg,
                "dtype bfloat16 or float8_e4m3fn (DLPack 0.6 has no fp8 code: set TensorView::dtype = DType::kE4m3 "
                "on an fp8 tensor's view)",
                dtype_name(t.dtype));
  }
  check::fail(arg, "dtype bfloat16 or float8_e4m3fn", dtype_name(t.dtype));
}

void check_index_vector(const TensorView& t, std::string_view arg, std::int64_t size) {
  check::dtype(t, arg, {DType::kI32});
  check::rank(t, arg, {1});
  check::dim(t, arg, 0, size);
  check::contiguous(t, arg);
  check::aligned(t, arg, 4);
  check::not_null(t, arg);
}

}  // namespace

std::size_t mla_workspace_size(const MlaDecodePolicy& policy, int batch) {
  policy.validate();
  kBatchRule.check("batch", batch);
  if (batch == 0) return 0;
  return workspace_size(policy, batch);
}

std::size_t mla_workspace_size(int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed,
                               DType dtype, DType out_dtype, MaskType mask, int batch) {
  return mla_workspace_size(MlaDecodePolicy{heads, page_size, max_seq_len, max_seq_len_q, packed, dtype, out_dtype, mask},
                            batch);
}

void warm_mla(const MlaDecodePolicy& policy, const std::vector<int>& devices, KernelService& service) {
  warm_policy(service, policy, devices);
}

void warm_mla(int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed, DType dtype,
              DType out_dtype, MaskType mask, const std::vector<int>& devices, KernelService& service) {
  warm_mla(MlaDecodePolicy{heads, page_size, max_seq_len, max_seq_len_q, packed, dtype, out_dtype, mask}, devices,
           service);
}

MlaProblem validate_mla_arguments(const TensorView& query, const TensorView& kv_cache,
                                  const TensorView& workspace_buffer, int kv_lora_rank, int qk_rope_head_dim,
                                  const TensorView& block_tables, const TensorView& seq_lens, long long max_seq_len,
                                  const std::optional<TensorView>& qo_indptr, std::optional<int> max_seq_len_q,
                                  const std::optional<TensorView>& out, double bmm1_scale, double bmm2_scale,
                                  MaskType mask, DType out_dtype, MlaKernel kernel, MlaPrecision precision) {
  // Every check below formats only when it fails: the success path allocates nothing.
  constexpr std::string_view kDimsPhrase = "MLA decode currently requires kv_lora_rank=512 and qk_rope_head_dim=64";
  if (kv_lora_rank != kMlaDimV) check::unsupported_as(kDimsPhrase, "kv_lora_rank", "512", num(kv_lora_rank));
  if (qk_rope_head_dim != kMlaDimQk - kMlaDimV) {
    check::unsupported_as(kDimsPhrase, "qk_rope_head_dim", "64", num(qk_rope_head_dim));
  }
  check::positive_finite(bmm1_scale, "bmm1_scale");
  check::positive_finite(bmm2_scale, "bmm2_scale");
  if (mask != MaskType::kDense && mask != MaskType::kCausal) {
    check::fail("mask_type", "MaskType::kDense or MaskType::kCausal", num(static_cast<int>(mask)));
  }
  if (out_dtype != DType::kBf16) {
    check::unsupported_as("MLA decode currently supports BF16 output only", "out_dtype", "bfloat16", dtype_name(out_dtype));
  }
  kMaxSeqLenRule.check("max_seq_len", max_seq_len);
  const bool packed = qo_indptr.has_value();

  // query: [B, SQ, H, 576] or [total_q, H, 576].
  check_input_dtype(query, "query");
  if (packed) {
    if (query.rank != 3) check::fail_as("query must have shape [total_q, H, 576]", "query", "rank 3 [total_q, H, 576] in packed mode (qo_indptr given)",
                                     fmt::format("rank {} (shape {})", query.rank, query.shape_string()));
  } else if (query.rank != 4) {
    check::fail_as("query must have shape [B, SQ, H, 576]", "query", "rank 4 [B, SQ, H, 576] in fixed mode (no qo_indptr)",
                fmt::format("rank {} (shape {})", query.rank, query.shape_string()));
  }
  if (query.size(-1) != kMlaDimQk) {
    check::fail_as(fmt::format("query last dimension must be {}, got {}", kMlaDimQk, query.size(-1)), "query",
                   fmt::format("size {} in dimension -1", kMlaDimQk), fmt::format("shape {}", query.shape_string()));
  }
  check::contiguous(query, "query");
  check::aligned(query, "query", 16);
  check::not_null(query, "query");
  const std::int64_t heads = query.size(-2);
  if (!kHeadsRule.valid(heads)) {
    check::fail("query", "heads (dimension -2) in 1..128", fmt::format("shape {}", query.shape_string()));
  }
  if (!kHeadsRule.supported(heads)) {
    check::unsupported("query", "heads (dimension -2) 1..128", fmt::format("{} heads", heads));
  }

  // kv_cache: [pages, page_size, 576] or [pages, 1, page_size, 576].
  if (kv_cache.dtype != query.dtype) {
    check::fail_as("MLA decode requires query and KV cache to use the same dtype", "kv_cache",
                   fmt::format("dtype {} (the query's dtype)", dtype_name(query.dtype)), dtype_name(kv_cache.dtype));
  }
  check::rank(kv_cache, "kv_cache", {3, 4});
  if (kv_cache.rank == 4 && kv_cache.size(1) != 1) {
    check::fail("kv_cache", "size 1 in dimension 1 of the rank-4 layout [num_pages, 1, page_size, 576]",
                fmt::format("shape {}", kv_cache.shape_string()));
  }
  check::dim(kv_cache, "kv_cache", -1, kMlaDimQk);
  const std::int64_t page_size = kv_cache.size(-2);
  if (!kPageSizeRule.supported(page_size)) {
    check::unsupported("kv_cache", "page_size (dimension -2) 16, 32, 64 or 128", fmt::format("page_size {}", page_size));
  }
  check::contiguous(kv_cache, "kv_cache");
  check::aligned(kv_cache, "kv_cache", 16);
  check::not_null(kv_cache, "kv_cache");

  // Batch: the query's leading dimension in fixed mode; seq_lens' length in packed mode.
  check::rank(seq_lens, "seq_lens", {1});
  const std::int64_t batch = packed ? seq_lens.size(0) : query.size(0);
  check_index_vector(seq_lens, "seq_lens", batch);

  // block_tables: int32 [B, max_pages], inner stride 1, rows may be padded.
  check::dtype(block_tables, "block_tables", {DType::kI32});
  check::rank(block_tables, "block_tables", {2});
  if (block_tables.size(0) != batch) {
    check::fail_as(fmt::format("block_tables must have one row per request: expected {}, got {}", batch,
                               block_tables.size(0)),
                   "block_tables", fmt::format("size {} in dimension 0", batch),
                   fmt::format("shape {}", block_tables.shape_string()));
  }
  const std::int64_t max_pages = block_tables.size(1);
  if (block_tables.size(1) > 1 && block_tables.stride(1) != 1) {
    check::fail_as("block_tables must be contiguous within each row", "block_tables", "stride(1) == 1",
                   num(block_tables.stride(1)));
  }
  if (batch > 1 && block_tables.stride(0) < max_pages) {
    check::fail_as("block_tables rows must not overlap", "block_tables", fmt::format("row stride >= max_pages = {}", max_pages),
                fmt::format("row stride {}", block_tables.stride(0)));
  }
  const std::int64_t pages_needed = (max_seq_len + page_size - 1) / page_size;
  if (max_pages < pages_needed) {
    check::fail_as(fmt::format("block_tables must have at least ceil(max_seq_len / page_size) columns ({}), got {}",
                               pages_needed, max_pages),
                   "block_tables",
                fmt::format("max_pages (dimension 1) >= ceil(max_seq_len / page_size) = ceil({} / {}) = {}", max_seq_len,
                            page_size, pages_needed),
                fmt::format("shape {}", block_tables.shape_string()));
  }
  if (block_tables.numel() > kInt32Max) {
    check::fail("block_tables", "at most 2^31 - 1 elements (int32 indexing)",
                fmt::format("shape {} = {} elements", block_tables.shape_string(), block_tables.numel()));
  }
  check::aligned(block_tables, "block_tables", 4);
  check::not_null(block_tables, "block_tables");

  // Query length bound (SQ) and token count.
  std::int64_t sq = 0;
  std::int64_t total_q = 0;
  if (packed) {
    if (!max_seq_len_q) {
      check::fail_as("max_seq_len_q is required when qo_indptr selects packed query", "max_seq_len_q",
                     "a value: it is required in packed mode (qo_indptr given)", "none");
    }
    sq = *max_seq_len_q;
    kMaxSeqLenQRule.check("max_seq_len_q", sq);
    if (qo_indptr->rank == 1 && qo_indptr->size(0) != batch + 1) {
      check::fail_as(fmt::format("qo_indptr must contain batch_size + 1 cumulative offsets: expected {}, got {}",
                                 batch + 1, qo_indptr->size(0)),
                     "qo_indptr", fmt::format("size {} in dimension 0", batch + 1),
                     fmt::format("shape {}", qo_indptr->shape_string()));
    }
    check_index_vector(*qo_indptr, "qo_indptr", batch + 1);
    total_q = query.size(0);
    if (total_q > batch * sq) {
      check::fail("query", fmt::format("at most B * max_seq_len_q = {} * {} = {} tokens (every qo_indptr delta is <= "
                                        "max_seq_len_q)", batch, sq, batch * sq),
                  fmt::format("{} tokens (shape {})", total_q, query.shape_string()));
    }
  } else {
    sq = query.size(1);
    if (!kMaxSeqLenQRule.valid(sq)) {
      check::fail("query", "SQ (dimension 1) in 1..64", fmt::format("shape {}", query.shape_string()));
    }
    if (!kMaxSeqLenQRule.supported(sq)) check::unsupported("query", "SQ (dimension 1) 1..64", fmt::format("SQ {}", sq));
    if (max_seq_len_q && *max_seq_len_q != sq) {
      check::fail_as(fmt::format("fixed query length must equal max_seq_len_q: got SQ={} and max_seq_len_q={}", sq,
                                 *max_seq_len_q),
                     "max_seq_len_q", fmt::format("SQ = query.size(1) = {} in fixed mode (or no value)", sq),
                  num(*max_seq_len_q));
    }
    total_q = batch * sq;
  }
  if (batch * sq * heads > kInt32Max) {
    check::fail("query", "B * max_seq_len_q * H <= 2^31 - 1 (int32 row indexing)",
                fmt::format("{} * {} * {} = {}", batch, sq, heads, batch * sq * heads));
  }
  kBatchRule.check(packed ? "seq_lens" : "query", batch);

  MlaProblem problem;
  problem.policy = MlaDecodePolicy{static_cast<int>(heads), static_cast<int>(page_size), max_seq_len, static_cast<int>(sq),
                                   packed,  query.dtype, out_dtype, mask, kernel, precision};
  problem.policy.validate();  // the family's rules; the checks above only name the argument they came from
  problem.batch = static_cast<int>(batch);
  problem.total_q = total_q;
  problem.workspace_bytes =
      batch == 0 ? 0 : workspace_layout(problem.policy, problem.batch, PolicyCheck::kValidated).total_bytes;

  // out: [B, SQ, H, 512] or [total_q, H, 512], disjoint from every input.
  if (out) {
    const TensorView& o = *out;
    if (o.dtype != out_dtype) {
      check::fail("out", fmt::format("dtype {} (out_dtype)", dtype_name(out_dtype)), dtype_name(o.dtype));
    }
    const bool shape_ok = packed ? (o.rank == 3 && o.size(0) == total_q && o.size(1) == heads && o.size(2) == kMlaDimV)
                                 : (o.rank == 4 && o.size(0) == batch && o.size(1) == sq && o.size(2) == heads &&
                                    o.size(3) == kMlaDimV);
    if (!shape_ok) {
      check::fail("out",
                  packed ? fmt::format("shape [total_q, H, 512] = [{}, {}, 512]", total_q, heads)
                         : fmt::format("shape [B, SQ, H, 512] = [{}, {}, {}, 512]", batch, sq, heads),
                  fmt::format("shape {}", o.shape_string()));
    }
    check::contiguous(o, "out");
    check::aligned(o, "out", 16);
    check::not_null(o, "out");
    check::disjoint(o, "out", query, "query");
    check::disjoint(o, "out", kv_cache, "kv_cache");
    check::disjoint(o, "out", block_tables, "block_tables");
    check::disjoint(o, "out", seq_lens, "seq_lens");
    if (packed) check::disjoint(o, "out", *qo_indptr, "qo_indptr");
    problem.out = o;
  } else {
    // Views have a fixed-size shape array, so describing the expected output allocates nothing.
    problem.out = packed ? TensorView::contiguous(nullptr, out_dtype, {total_q, heads, kMlaDimV})
                         : TensorView::contiguous(nullptr, out_dtype, {batch, sq, heads, kMlaDimV});
  }

  // workspace_buffer: bytes, 32-byte aligned, large enough, overlapping nothing.
  check::dtype(workspace_buffer, "workspace_buffer", {DType::kU8, DType::kI8});
  check::contiguous(workspace_buffer, "workspace_buffer");
  check::aligned(workspace_buffer, "workspace_buffer", 32);
  if (static_cast<std::uint64_t>(workspace_buffer.numel()) < problem.workspace_bytes) {
    check::fail("workspace_buffer",
                fmt::format("at least mla_workspace_size(...) = {} bytes for heads {}, max_seq_len_q {}, batch {}",
                            problem.workspace_bytes, heads, sq, batch),
                fmt::format("{} bytes", workspace_buffer.numel()));
  }
  if (problem.workspace_bytes > 0) check::not_null(workspace_buffer, "workspace_buffer");
  check::disjoint(workspace_buffer, "workspace_buffer", query, "query");
  check::disjoint(workspace_buffer, "workspace_buffer", kv_cache, "kv_cache");
  check::disjoint(workspace_buffer, "workspace_buffer", block_tables, "block_tables");
  check::disjoint(workspace_buffer, "workspace_buffer", seq_lens, "seq_lens");
  if (packed) check::disjoint(workspace_buffer, "workspace_buffer", *qo_indptr, "qo_indptr");
  if (out) check::disjoint(workspace_buffer, "workspace_buffer", *out, "out");
  return problem;
}

namespace {

// The cache as the 3-D tensor {576, page_size, pages} of bf16, boxes of 64 columns x min(64,
// page_size) tokens in the 128-byte swizzle the kernel's shared tiles use. Host-only work (no device
// call), so it is safe while a stream captures.
void encode_kv_map(const TensorView& kv_cache, int page_size, MlaDecodeParams& params) {
  // TMA reads the map from any 64-byte-aligned address (cuda.h over-aligns its own type to 128).
  static_assert(sizeof(CUtensorMap) == sizeof(MlaTensorMap) && alignof(MlaTensorMap) >= 64,
                "MlaTensorMap must hold a CUtensorMap");
  const std::int64_t pages = kv_cache.size(0);
  if (pages > kInt32Max) check::fail("kv_cache", "at most 2^31 - 1 pages (TMA coordinates)", num(pages));
  const cuuint64_t dims[3] = {kMlaDimQk, static_cast<cuuint64_t>(page_size), static_cast<cuuint64_t>(pages)};
  const cuuint64_t strides[2] = {kMlaDimQk * 2, static_cast<cuuint64_t>(page_size) * kMlaDimQk * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(std::min(page_size, kMlaWgTileTokens)), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  CUtensorMap map;
  const Driver& d = Driver::get();
  d.check(d.cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, kv_cache.data, dims, strides, box, unit,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled(kv_cache)");
  std::memcpy(&params.kv_map, &map, sizeof(map));
  params.kv_pages = static_cast<int>(pages);
}

}  // namespace

TensorView prims_ts_batch_decode_with_kv_cache_mla(
    const TensorView& query, const TensorView& kv_cache, const TensorView& workspace_buffer, int kv_lora_rank,
    int qk_rope_head_dim, const TensorView& block_tables, const TensorView& seq_lens, long long max_seq_len,
    const std::optional<TensorView>& qo_indptr, std::optional<int> max_seq_len_q, const std::optional<TensorView>& out,
    double bmm1_scale, double bmm2_scale, MaskType mask, DType out_dtype, CUstream stream, KernelService& service,
    MlaKernel kernel, MlaPrecision precision) {
  MlaProblem problem = validate_mla_arguments(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim,
                                              block_tables, seq_lens, max_seq_len, qo_indptr, max_seq_len_q, out,
                                              bmm1_scale, bmm2_scale, mask, out_dtype, kernel, precision);
  // No query rows: nothing to compute and nothing to allocate, so no driver is needed either.
  if (problem.total_q == 0) return problem.out;

  const StreamDevice on(stream);
  for (const auto& [view, arg] : {std::pair{&query, "query"}, {&kv_cache, "kv_cache"}, {&workspace_buffer, "workspace_buffer"},
                                  {&block_tables, "block_tables"}, {&seq_lens, "seq_lens"}}) {
    on.check(*view, arg);
  }
  on.check(qo_indptr, "qo_indptr");
  on.check(out, "out");
  const MlaDecodePolicy& policy = problem.policy;
  const KernelHandle& handle = acquire(service, policy, stream, on.device());
  const MlaPlan p = plan(policy, problem.batch, service.device_limits(handle.device),
                         service.device_arch(handle.device), PolicyCheck::kValidated);

  const Driver& d = Driver::get();
  bool allocated = false;
  if (!out) {
    if (stream_capturing(stream)) {
      check::fail("out", "a caller-provided output while the stream is capturing a CUDA graph (allocation is not "
                         "graph-safe)", "none");
    }
    CUdeviceptr ptr = 0;
    const auto bytes = static_cast<std::size_t>(problem.out.numel()) * static_cast<std::size_t>(dtype_bytes(out_dtype));
    d.check(d.cuMemAlloc(&ptr, bytes), "cuMemAlloc(mla_decode out)");
    problem.out.data = reinterpret_cast<void*>(ptr);
    allocated = true;
  }

  const WorkspaceLayout& ws = p.workspace;
  auto* ws_base = static_cast<unsigned char*>(workspace_buffer.data);
  MlaDecodeParams params{};
  params.q = query.data;
  params.kv = kv_cache.data;
  params.block_tables = block_tables.data;
  params.seq_lens = seq_lens.data;
  params.qo_indptr = qo_indptr ? qo_indptr->data : nullptr;
  params.out = problem.out.data;
  params.lse_partial = p.needs_combine ? ws_base + ws.lse_offset : nullptr;
  params.o_partial = p.needs_combine ? ws_base + ws.o_offset : nullptr;
  params.split_meta = p.needs_combine ? ws_base + ws.meta_offset : nullptr;
  params.block_table_stride = block_tables.stride(0);
  params.batch = problem.batch;
  set_policy_params(policy, params);
  params.num_parts = p.num_parts;
  params.piece_cost = p.piece_cost;
  params.combine_row_warps = p.combine_row_warps;
  // The kernel's softmax runs on exp2; callers give the natural-exponent scale (spec "Math").
  params.scale_log2 = static_cast<float>(bmm1_scale * 1.4426950408889634);
  params.out_scale = static_cast<float>(bmm2_scale);
  if (p.kv_tma) encode_kv_map(kv_cache, policy.page_size, params);

  try {
    launch(handle, p.decode, params, stream, kMlaDecodeEntry);
    if (p.needs_combine) launch(handle.companion(0), p.combine, params, stream, p.combine_entry);
  } catch (const Error&) {
    // A kernel that never launched cannot be using the buffer; don't leak it.
    if (allocated) d.cuMemFree(reinterpret_cast<CUdeviceptr>(problem.out.data));
    throw;
  }
  return problem.out;
}

}  // namespace kiln::mla
