#include "kiln/runtime/mla_decode/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "kiln/jit/error.h"
#include "kiln/runtime/validation.h"

namespace kiln::mla {
namespace {

// The workspace is sized before any device is known, for a GPU at least as large as every supported
// one: the most SMs and the most shared memory per SM (so the most resident CTAs). On a smaller GPU
// the plan simply uses fewer of the parts the workspace holds.
constexpr DeviceLimits kWorkspaceSizingDevice{
    .sm_count = 264, .smem_per_sm = 233472, .smem_per_block_optin = 232448, .smem_reserved_per_block = 1024};

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

int row_tiles(const MlaDecodePolicy& policy, const MlaVariant& v) {
  const int rows = mla_variant_rows(v);
  return (mla_max_rows(policy.heads, policy.max_seq_len_q) + rows - 1) / rows;
}

// One wave of resident CTAs: every SM holds as many as its shared memory allows, each CTA is one
// (part, row tile), so the parts are that count over the row tiles.
int parts_for(const MlaDecodePolicy& policy, const MlaVariant& v, const DeviceLimits& device) {
  const int block = mla_variant_smem(v, policy.fp8()) + device.smem_reserved_per_block;
  const long long ctas_per_sm = v.wgmma ? 1 : std::max(1, device.smem_per_sm / block);
  return static_cast<int>(std::max(1LL, device.sm_count * ctas_per_sm / row_tiles(policy, v)));
}

// A request of one KV block lies in one part: it is never split, whatever the parts.
bool can_split(const MlaDecodePolicy& policy) { return policy.max_seq_len > kMlaMinBlockTokens; }

// The combine for the pieces a request is expected in (about parts / batch with lengths alike), as
// measured on the H200 (NOTES.md): the eight-warp form at >= 32 (1.03-1.31x as fast as four warps
// per row at B = 1, 0.85-1.06x at B 8-128, where many small CTAs per SM do better); one warp per row
// at <= 4 where the batch has at least 8 rows per SM (1.02-1.10x against four at B >= 32; 0.98-0.99x
// below that); else four warps per row. Returns the warps per row, 0 for the eight-warp form.
int combine_row_warps(int parts, int batch, int rows, int sm_count) {
  const int pieces = (parts + batch - 1) / batch;
  if (pieces >= 32) return 0;
  return pieces <= 4 && static_cast<long long>(batch) * rows >= 8LL * sm_count ? 1 : 4;
}

MlaVariant variant_for(const MlaDecodePolicy& policy, bool sm90a) {
  return mla_variant(static_cast<int>(policy.kernel), policy.heads, policy.max_seq_len_q, policy.fp8(),
                     mla_split_p(policy.fp8(), static_cast<int>(policy.precision)), sm90a);
}

int max_parts_valid(const MlaDecodePolicy& policy) {
  // Both variants a key may compile to (sm_90a and every other arch).
  return std::max(parts_for(policy, variant_for(policy, true), kWorkspaceSizingDevice),
                  parts_for(policy, variant_for(policy, false), kWorkspaceSizingDevice));
}

}  // namespace

bool is_sm90a(std::string_view arch) { return arch == "sm_90a"; }

MlaVariant variant(const MlaDecodePolicy& policy, std::string_view arch) { return variant_for(policy, is_sm90a(arch)); }

int max_parts(const MlaDecodePolicy& policy) {
  policy.validate();
  return max_parts_valid(policy);
}

WorkspaceLayout workspace_layout(const MlaDecodePolicy& policy, int batch, PolicyCheck check) {
  if (batch < 1) check::fail("batch", ">= 1", std::to_string(batch));
  if (check == PolicyCheck::kValidate) policy.validate();
  WorkspaceLayout w;
  w.max_parts = max_parts_valid(policy);
  // Every request in one piece: `out` written directly, no scratch.
  if (w.max_parts == 1 || !can_split(policy)) return w;
  const std::size_t slots = static_cast<std::size_t>(batch) + w.max_parts - 1;
  const std::size_t rows = static_cast<std::size_t>(mla_max_rows(policy.heads, policy.max_seq_len_q));
  w.meta_offset = 0;
  w.lse_offset = align256(static_cast<std::size_t>(batch) * 2 * sizeof(int));
  w.lse_bytes = slots * rows * sizeof(float);
  w.o_offset = align256(w.lse_offset + w.lse_bytes);
  w.o_bytes = slots * rows * kMlaDimV * sizeof(float);
  w.total_bytes = align256(w.o_offset + w.o_bytes);
  return w;
}

std::size_t workspace_size(const MlaDecodePolicy& policy, int batch) { return workspace_layout(policy, batch).total_bytes; }

MlaPlan plan(const MlaDecodePolicy& policy, int batch, const DeviceLimits& device, std::string_view arch, PolicyCheck check) {
  if (device.sm_count < 1) check::fail("sm_count", ">= 1", std::to_string(device.sm_count));
  if (device.smem_per_sm < 1) check::fail("smem_per_sm", ">= 1", std::to_string(device.smem_per_sm));
  kBatchRule.check("batch", batch);
  MlaPlan p;
  p.workspace = workspace_layout(policy, batch, check);
  if ((policy.kernel == MlaKernel::kWgmma || policy.kernel == MlaKernel::kWgmmaKv) && !is_sm90a(arch)) {
    throw Error(ErrorCode::kUnsupported, std::string("argument 'kernel': \"") +
                                             (policy.kernel == MlaKernel::kWgmma ? "wgmma" : "wgmma_kv") +
                                             "\" runs on sm_90a (Hopper) only; this device is " + std::string(arch) +
                                             ": use kernel \"auto\" or \"mma_sync\"");
  }
  p.variant = variant(policy, arch);
  const int tiles = row_tiles(policy, p.variant);
  p.num_parts = std::min(parts_for(policy, p.variant, device), p.workspace.max_parts);
  p.needs_combine = p.num_parts > 1 && can_split(policy);
  p.piece_cost = p.variant.wgmma ? kMlaPieceCostWgmma : kMlaPieceCostMma;

  p.decode.grid[0] = static_cast<unsigned>(p.num_parts);
  p.decode.grid[1] = static_cast<unsigned>(tiles);
  p.decode.block[0] = static_cast<unsigned>(mla_variant_threads(p.variant, policy.fp8()));
  p.decode.smem_bytes = static_cast<unsigned>(mla_variant_smem(p.variant, policy.fp8()));
  const int tma_ctas =
      mla_kv_tma_ctas(p.variant, policy.fp8(), policy.heads, policy.max_seq_len_q, policy.packed, policy.page_size);
  p.kv_tma = tma_ctas > 0;
  if (tma_ctas == kMlaKvTmaCluster) p.decode.cluster[1] = kMlaKvTmaCluster;

  const int rows = mla_max_rows(policy.heads, policy.max_seq_len_q);
  p.combine_row_warps = combine_row_warps(p.num_parts, batch, rows, device.sm_count);
  p.combine_entry = p.combine_row_warps > 0 ? kMlaCombineEntry : kMlaCombineWideEntry;
  p.combine.grid[0] = static_cast<unsigned>(p.combine_row_warps == 1 ? (rows + kMlaCombineRowsPerCta - 1) / kMlaCombineRowsPerCta : rows);
  p.combine.grid[1] = static_cast<unsigned>(batch);
  p.combine.block[0] = static_cast<unsigned>(p.combine_row_warps > 0 ? kMlaCombineThreads : kMlaCombineWideThreads);
  // Both kernels are scheduled during the tail of the kernel before them in the stream (programmatic
  // dependent launch) and wait for it before their first global read or write.
  p.decode.pdl = true;
  p.combine.pdl = true;
  return p;
}

std::string decode_kernel_name(const MlaDecodePolicy& policy) {
  policy.validate();
  const int row_class = mla_row_class(static_cast<int>(policy.kernel), policy.heads, policy.max_seq_len_q, policy.fp8());
  return fmt::format("kiln::mla_decode_kernel<{}, {}, {}, {}, {}, {}>", row_class, policy.page_size, policy.packed,
                     policy.fp8(), static_cast<int>(policy.kernel), static_cast<int>(policy.precision));
}

void set_policy_params(const MlaDecodePolicy& policy, MlaDecodeParams& params) {
  params.heads = policy.heads;
  params.max_seq_len_q = policy.max_seq_len_q;
  params.heads_recip = mla_heads_recip(policy.heads);
  params.causal = policy.causal() && policy.max_seq_len_q > 1;
}

std::string combine_kernel_name(const MlaCombinePolicy& policy, bool wide) {
  policy.validate();
  return fmt::format("kiln::{}<{}, {}, {}>", wide ? "mla_combine_wide_kernel" : "mla_combine_kernel", policy.heads,
                     policy.max_seq_len_q, policy.packed);
}

}  // namespace kiln::mla
