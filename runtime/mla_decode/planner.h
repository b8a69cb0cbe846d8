#pragma once
// Pure host planner for paged MLA decode: static policy + batch + device limits -> tile
// configuration, split count, launch geometry and workspace layout. No CUDA calls; unit-testable
// anywhere.
#include <cstddef>
#include <string>

#include "kernel_templates/mla_decode/params.cuh"
#include "runtime/device_limits.h"
#include "runtime/launch_config.h"

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

using LaunchDims = LaunchConfig;

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

// The family's policy rules (MlaDecodePolicy::validate): throws kiln::Error naming the field.
void validate_policy(const MlaPolicy& policy);

MlaTileConfig tile_config(const MlaPolicy& policy);

// Split bound for (policy, batch): independent of the device, so the workspace size is too (it
// assumes kWorkspaceSizingDevice, which bounds every supported GPU).
int max_splits(const MlaPolicy& policy, int batch);

WorkspaceLayout workspace_layout(const MlaPolicy& policy, int batch);

// The public helper: exactly the semantic-key fields plus batch size.
std::size_t workspace_size(const MlaPolicy& policy, int batch);

MlaPlan plan(const MlaPolicy& policy, int batch, const DeviceLimits& device);

// NVRTC name expressions, e.g. "kiln::mla_decode_kernel<128, 64, 1, false, false, true, 4, 2, 32, 3>".
std::string decode_kernel_name(const MlaPolicy& policy);
std::string combine_kernel_name(const MlaPolicy& policy);

}  // namespace kiln::mla
