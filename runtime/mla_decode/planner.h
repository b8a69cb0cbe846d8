#pragma once
// Pure host planner for paged MLA decode: static policy + batch + SM count -> tile configuration,
// split count, launch geometry and workspace layout. No CUDA calls; unit-testable anywhere.
#include <cstddef>
#include <string>

#include "kernel_templates/mla_decode/params.cuh"

namespace kiln::mla {

// The semantic-key fields that shape the kernel (dtype: fp8 = e4m3 q and cache, else bf16; the
// output is bf16). max_seq_len is part of the key but only bounds the split count here.
struct MlaPolicy {
  int heads = 0;            // 1..128
  int page_size = 0;        // 16, 32, 64 or 128
  long long max_seq_len = 0;  // 1 .. 2^31 - 32768
  int max_seq_len_q = 1;    // 1..8
  bool packed = false;
  bool fp8 = false;
  bool causal = true;
};

struct LaunchDims {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem_bytes = 0;  // dynamic shared memory
};

// Byte offsets into the caller's workspace (base must be 32-byte aligned; offsets are 256-aligned).
struct WorkspaceLayout {
  int max_splits = 1;        // splits the workspace is sized for
  std::size_t lse_offset = 0;
  std::size_t lse_bytes = 0;   // fp32 [B][max_rows][splits]
  std::size_t o_offset = 0;
  std::size_t o_bytes = 0;     // fp32 [B][max_rows][splits][512]
  std::size_t total_bytes = 0;  // 0 when no split can ever be chosen for this (policy, B)
};

struct MlaPlan {
  MlaTileConfig tile{};
  int num_splits = 1;         // -> MlaDecodeParams::num_splits
  bool needs_combine = false;  // num_splits > 1: launch the combine kernel after the decode kernel
  LaunchDims decode;
  LaunchDims combine;
  WorkspaceLayout workspace;
};

// Throws kiln::Error(kInvalidArgument) naming the field, expected and given values.
void validate_policy(const MlaPolicy& policy);

MlaTileConfig tile_config(const MlaPolicy& policy);

// Split bound for (policy, batch): independent of the device, so the workspace size is too.
int max_splits(const MlaPolicy& policy, int batch);

WorkspaceLayout workspace_layout(const MlaPolicy& policy, int batch);

// The public helper: exactly the semantic-key fields plus batch size.
std::size_t workspace_size(const MlaPolicy& policy, int batch);

MlaPlan plan(const MlaPolicy& policy, int batch, int sm_count);

// NVRTC name expressions, e.g. "kiln::mla_decode_kernel<128, 64, 1, false, false, true, 4, 2, 32, 3>".
std::string decode_kernel_name(const MlaPolicy& policy);
std::string combine_kernel_name(const MlaPolicy& policy);

}  // namespace kiln::mla
