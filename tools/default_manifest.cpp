#include "tools/default_manifest.h"

#include <string>

namespace kiln::tools {

namespace {

// Enables the sparse_dsv41 keys in the default set. `kiln prebuild` compiles every default key (the
// NVRTC suite checks that), so they join once kernel_templates/sparse_dsv41/kernel*.cuh exist.
constexpr bool kDefaultHasDsv41 = false;

constexpr std::string_view kBase = R"json({
  "comment": "kiln's default prebuild set: the NVFP4 writer, the paged MLA decode keys a DeepSeek-V3 server warms (H 16/32/64/128, page 64, SQ 1/2; H 64/128 also in the one-bf16-P precision), and the sparse decode variants a DeepSeek-V4 server hits (H 8-128 over TP 1-16, each target's own kernel; page sizes are run-time)",
  "archs": ["sm_90a", "sm_120a"],
  "policies": [
    {"family": "nvfp4_writer", "policy": {"op": ["pack", "append"], "page_size": [2, 32, 64, 128]}},
    {"family": "mla_decode", "archs": ["sm_90a"], "policy": {"heads": [16, 32, 64, 128], "page_size": 64, "max_seq_len": 163840, "max_seq_len_q": [1, 2], "packed": false, "dtype": ["bf16", "fp8_e4m3"], "out_dtype": "bf16", "mask": ["dense", "causal"]}},
    {"family": "mla_decode", "archs": ["sm_90a"], "policy": {"heads": [64, 128], "page_size": 64, "max_seq_len": 163840, "max_seq_len_q": [1, 2], "packed": false, "dtype": "bf16", "out_dtype": "bf16", "mask": "causal", "precision": "bf16"}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [8, 16], "head_tiles": 1, "has_extra": false, "split": false}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [8, 16], "head_tiles": 1, "has_extra": true, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "head_tiles": [1, 2], "has_extra": false, "split": false}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "head_tiles": [1, 2], "has_extra": true, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "kernel": "sm90", "has_extra": false, "split": false}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "kernel": "sm90", "has_extra": true, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_120a"], "policy": {"heads": [8, 16, 32, 64, 128], "kernel": "mma_small", "has_extra": false, "split": false}},
    {"family": "sparse_nvfp4", "archs": ["sm_120a"], "policy": {"heads": [8, 16, 32, 64, 128], "kernel": "mma_small", "has_extra": true, "split": [false, true]}})json";

constexpr std::string_view kEnd = R"json(
  ]
}
)json";

}  // namespace

std::string_view dsv41_default_policies() {
  // DeepSeek-V4.1 at TP 1 and 2 (64 and 128 query heads), each target's own variant (the launcher's
  // choice: dsv41::dsv41_variants_for), with and without the extra cache, split and not.
  return R"json(
    {"family": "sparse_dsv41", "archs": ["sm_90a"], "policy": {"heads": [64, 128], "variant": "sm90", "has_extra": [false, true], "split": [false, true]}},
    {"family": "sparse_dsv41", "archs": ["sm_120a"], "policy": {"heads": [64, 128], "variant": "default", "has_extra": [false, true], "split": [false, true]}})json";
}

std::string_view default_manifest() {
  static const std::string text = [] {
    std::string t(kBase);
    if (kDefaultHasDsv41) {
      t += ',';
      t += dsv41_default_policies();
    }
    t += kEnd;
    return t;
  }();
  return text;
}

}  // namespace kiln::tools
