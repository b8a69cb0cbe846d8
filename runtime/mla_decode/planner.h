#pragma once
// Pure host planner for paged MLA decode: static policy + batch + device (limits and arch) -> kernel
// variant, number of parts, launch geometry and workspace layout. No CUDA calls; unit-testable
// anywhere.
#include <cstddef>
#include <string>
#include <string_view>

#include "kiln/kernel_templates/mla_decode/params.cuh"
#include "kiln/runtime/device_limits.h"
#include "kiln/runtime/launch_config.h"
#include "kiln/runtime/mla_decode/family.h"

namespace kiln::mla {

// Byte offsets into the caller's workspace (base must be 32-byte aligned; offsets are 256-aligned).
struct WorkspaceLayout {
  int max_parts = 1;            // parts the workspace is sized for
  std::size_t meta_offset = 0;  // int32 [B][2] split records
  std::size_t lse_offset = 0;
  std::size_t lse_bytes = 0;    // fp32 [B + max_parts - 1][max_rows]
  std::size_t o_offset = 0;
  std::size_t o_bytes = 0;      // fp32 [B + max_parts - 1][max_rows][512]
  std::size_t total_bytes = 0;  // 0 when no plan can split for this policy
};

struct MlaPlan {
  MlaVariant variant{};
  int num_parts = 1;            // -> MlaDecodeParams::num_parts (grid x)
  int piece_cost = 1;           // -> MlaDecodeParams::piece_cost
  bool needs_combine = false;   // num_parts > 1: launch the combine kernel (PDL) after the decode kernel
  int combine_entry = kMlaCombineEntry;  // the combine module's four-warp form or its eight-warp form
  int combine_row_warps = 4;    // -> MlaDecodeParams::combine_row_warps: 4 or 1; 0 with the eight-warp form
  bool kv_tma = false;          // the decode kernel loads KV with TMA (MlaDecodeParams::kv_map); decode.cluster pairs CTAs
  LaunchConfig decode;
  LaunchConfig combine;
  WorkspaceLayout workspace;
};

// True for the arch whose kernels may use wgmma (and 227 KB of shared memory per block).
bool is_sm90a(std::string_view arch);

// What `policy` compiles to for `arch` (the device code makes the same choice).
MlaVariant variant(const MlaDecodePolicy& policy, std::string_view arch);

// Bound on the parts any device may use for this policy (independent of the device, so the
// workspace size is too: it assumes a GPU at least as large as every supported one).
int max_parts(const MlaDecodePolicy& policy);

// kValidated skips the policy's rules for a caller that has just checked them (the launcher, on
// every call); everything else is still checked.
enum class PolicyCheck { kValidate, kValidated };

WorkspaceLayout workspace_layout(const MlaDecodePolicy& policy, int batch, PolicyCheck check = PolicyCheck::kValidate);

// The public helper: exactly the semantic-key fields plus batch size.
std::size_t workspace_size(const MlaDecodePolicy& policy, int batch);

// Throws kUnsupported when `arch` cannot run the policy's forced kernel (wgmma off sm_90a).
MlaPlan plan(const MlaDecodePolicy& policy, int batch, const DeviceLimits& device, std::string_view arch,
             PolicyCheck check = PolicyCheck::kValidate);

// NVRTC name expressions, e.g. "kiln::mla_decode_kernel<128, 64, false, false, 0, 0>" (row class,
// page size, packed, fp8, kernel, precision).
std::string decode_kernel_name(const MlaDecodePolicy& policy);
std::string combine_kernel_name(const MlaCombinePolicy& policy, bool wide = false);

// The policy's values that the decode kernel takes at run time (its name carries only the row
// class): H, SQ, H's reciprocal for a row's query index, and the causal flag, off with one query row
// (a request's causal limit is then its last key, where every piece ends anyway).
void set_policy_params(const MlaDecodePolicy& policy, MlaDecodeParams& params);

}  // namespace kiln::mla
