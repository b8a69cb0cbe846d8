#include "runtime/mla_decode/planner.h"

#include <algorithm>
#include <string>

#include "jit/error.h"
#include "runtime/mla_decode/family.h"

namespace kiln::mla {
namespace {

[[noreturn]] void bad(const std::string& what, const std::string& expected, long long given) {
  throw Error(ErrorCode::kInvalidArgument, what + ": expected " + expected + ", given " + std::to_string(given));
}

// The workspace is sized before any device is known, for a GPU at least as large as every supported
// one: the most SMs and the most shared memory per SM (so the most resident CTAs). On a smaller GPU
// the plan simply uses fewer of the splits the workspace holds.
constexpr DeviceLimits kWorkspaceSizingDevice{
    .sm_count = 264, .smem_per_sm = 233472, .smem_per_block_optin = 232448, .smem_reserved_per_block = 1024};

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

// Resident CTAs per SM for this policy's tile on `device`.
long long ctas_per_sm(const MlaPolicy& policy, const DeviceLimits& device) {
  const int block = mla_decode_smem_bytes(tile_config(policy), policy.fp8) + device.smem_reserved_per_block;
  return std::max(1, device.smem_per_sm / block);
}

int row_tiles(const MlaPolicy& policy) {
  const int rows = mla_tile_rows(tile_config(policy));
  return (mla_max_rows(policy.heads, policy.max_seq_len_q) + rows - 1) / rows;
}

}  // namespace

void validate_policy(const MlaPolicy& policy) {
  MlaDecodePolicy{policy.heads,  policy.page_size, policy.max_seq_len, policy.max_seq_len_q,
                  policy.packed, policy.fp8 ? DType::kE4m3 : DType::kBf16, DType::kBf16,
                  policy.causal ? MaskType::kCausal : MaskType::kDense}
      .validate();
}

MlaTileConfig tile_config(const MlaPolicy& policy) {
  return mla_tile_config(policy.heads, policy.max_seq_len_q, policy.fp8);
}

int max_splits(const MlaPolicy& policy, int batch) {
  validate_policy(policy);
  if (batch < 1) bad("batch", ">= 1", batch);
  const long long ctas = static_cast<long long>(batch) * row_tiles(policy);
  const long long by_sms =
      (kWorkspaceSizingDevice.sm_count * ctas_per_sm(policy, kWorkspaceSizingDevice) + ctas - 1) / ctas;
  const long long by_len = (policy.max_seq_len + tile_config(policy).tile_tokens - 1) / tile_config(policy).tile_tokens;
  return static_cast<int>(std::max(1LL, std::min({by_sms, by_len, static_cast<long long>(kMlaMaxSplits)})));
}

WorkspaceLayout workspace_layout(const MlaPolicy& policy, int batch) {
  WorkspaceLayout w;
  w.max_splits = max_splits(policy, batch);
  if (w.max_splits == 1) return w;  // the decode kernel writes `out` directly; no scratch needed
  const std::size_t entries =
      static_cast<std::size_t>(batch) * mla_max_rows(policy.heads, policy.max_seq_len_q) * w.max_splits;
  w.lse_offset = 0;
  w.lse_bytes = entries * sizeof(float);
  w.o_offset = align256(w.lse_bytes);
  w.o_bytes = entries * kMlaDimV * sizeof(float);
  w.total_bytes = align256(w.o_offset + w.o_bytes);
  return w;
}

std::size_t workspace_size(const MlaPolicy& policy, int batch) { return workspace_layout(policy, batch).total_bytes; }

MlaPlan plan(const MlaPolicy& policy, int batch, const DeviceLimits& device) {
  if (device.sm_count < 1) bad("sm_count", ">= 1", device.sm_count);
  if (device.smem_per_sm < 1) bad("smem_per_sm", ">= 1", device.smem_per_sm);
  MlaPlan p;
  p.workspace = workspace_layout(policy, batch);  // validates policy and batch
  p.tile = tile_config(policy);
  const int tiles = row_tiles(policy);
  const long long ctas = static_cast<long long>(batch) * tiles;
  // Take the largest split count that still fits in one wave of resident CTAs, so no SM runs a
  // second, lonely round.
  const long long fit = std::max(1LL, device.sm_count * ctas_per_sm(policy, device) / ctas);
  p.num_splits = static_cast<int>(std::min<long long>(fit, p.workspace.max_splits));
  p.needs_combine = p.num_splits > 1;

  p.decode.grid[0] = static_cast<unsigned>(tiles);
  p.decode.grid[1] = static_cast<unsigned>(p.num_splits);
  p.decode.grid[2] = static_cast<unsigned>(batch);
  p.decode.block[0] = static_cast<unsigned>(mla_threads(p.tile));
  p.decode.smem_bytes = static_cast<unsigned>(mla_decode_smem_bytes(p.tile, policy.fp8));

  const int rows = mla_max_rows(policy.heads, policy.max_seq_len_q);
  p.combine.grid[0] = static_cast<unsigned>((rows + kMlaCombineRowsPerCta - 1) / kMlaCombineRowsPerCta);
  p.combine.grid[1] = static_cast<unsigned>(batch);
  p.combine.block[0] = kMlaCombineThreads;
  if (batch > 65535) bad("batch", "<= 65535 (grid z / y limit)", batch);
  return p;
}

std::string decode_kernel_name(const MlaPolicy& policy) {
  validate_policy(policy);
  const MlaTileConfig t = tile_config(policy);
  auto b = [](bool v) { return v ? std::string("true") : std::string("false"); };
  return "kiln::mla_decode_kernel<" + std::to_string(policy.heads) + ", " + std::to_string(policy.page_size) + ", " +
         std::to_string(policy.max_seq_len_q) + ", " + b(policy.packed) + ", " + b(policy.fp8) + ", " +
         b(policy.causal) + ", " + std::to_string(t.row_groups) + ", " + std::to_string(t.col_groups) + ", " +
         std::to_string(t.tile_tokens) + ", " + std::to_string(t.stages) + ">";
}

std::string combine_kernel_name(const MlaPolicy& policy) {
  validate_policy(policy);
  return "kiln::mla_combine_kernel<" + std::to_string(policy.heads) + ", " + std::to_string(policy.max_seq_len_q) +
         ", " + (policy.packed ? "true" : "false") + ">";
}

}  // namespace kiln::mla
