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

namespace kiln::mla {

// The semantic-key fields that shape the kernel (dtype: fp8 = e4m3 q and cache, else bf16; the
// output is bf16). max_seq_len is part of the key but shapes nothing here.
struct MlaPolicy {
  int heads = 0;            // 1..128
  int page_size = 0;        // 16, 32, 64 or 128
  long long max_seq_len = 0;  // 1 .. 2^31 - 32768
  int max_seq_len_q = 1;    // 1..64
  bool packed = false;
  bool fp8 = false;
  bool causal = true;
  int kernel = kMlaKernelAuto;  // kMlaKernel*
};

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
  int combine_entry = kMlaCombineEntry;  // the module's four- or eight-warp combine
  LaunchConfig decode;
  LaunchConfig combine;
  WorkspaceLayout workspace;
};

// The family's policy rules (MlaDecodePolicy::validate): throws kiln::Error naming the field.
void validate_policy(const MlaPolicy& policy);

// True for the arch whose kernels may use wgmma (and 227 KB of shared memory per block).
bool is_sm90a(std::string_view arch);

// What `policy` compiles to for `arch` (the device code makes the same choice).
MlaVariant variant(const MlaPolicy& policy, std::string_view arch);

// Bound on the parts any device may use for this policy (independent of the device, so the
// workspace size is too: it assumes a GPU at least as large as every supported one).
int max_parts(const MlaPolicy& policy);

// kValidated skips the policy's rules for a caller that has just checked them (the launcher, on
// every call); everything else is still checked.
enum class PolicyCheck { kValidate, kValidated };

WorkspaceLayout workspace_layout(const MlaPolicy& policy, int batch, PolicyCheck check = PolicyCheck::kValidate);

// The public helper: exactly the semantic-key fields plus batch size.
std::size_t workspace_size(const MlaPolicy& policy, int batch);

// Throws kUnsupported when `arch` cannot run the policy's forced kernel (wgmma off sm_90a).
MlaPlan plan(const MlaPolicy& policy, int batch, const DeviceLimits& device, std::string_view arch,
             PolicyCheck check = PolicyCheck::kValidate);

// NVRTC name expressions, e.g. "kiln::mla_decode_kernel<128, 64, 1, false, false, true, 0>".
std::string decode_kernel_name(const MlaPolicy& policy);
std::string combine_kernel_name(const MlaPolicy& policy, bool wide = false);

}  // namespace kiln::mla
