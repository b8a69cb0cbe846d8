#include "tools/default_manifest.h"

namespace kiln::tools {

std::string_view default_manifest() {
  return R"json({
  "comment": "kiln's default prebuild set: the NVFP4 writer, the DeepSeek-V4.1 writers (both formats, page sizes are run-time), the paged MLA decode keys a DeepSeek-V3 server warms (H 16/32/64/128, page 64, SQ 1/2; H 64/128 also in the one-bf16-P precision), the sparse decode variants a DeepSeek-V4 server hits (H 8-128 over TP 1-16, each target's own kernel; page sizes are run-time), and DeepSeek-V4.1's mixed-cache decode at H 64/128 (TP 1-2)",
  "archs": ["sm_90a", "sm_120a"],
  "policies": [
    {"family": "nvfp4_writer", "policy": {"op": ["pack", "append"], "page_size": [2, 32, 64, 128]}},
    {"family": "dsv41_writer", "policy": {"format": ["fp8", "fp4"], "op": ["pack", "append"]}},
    {"family": "mla_decode", "archs": ["sm_90a"], "policy": {"heads": [16, 32, 64, 128], "page_size": 64, "max_seq_len": 163840, "max_seq_len_q": [1, 2], "packed": false, "dtype": ["bf16", "fp8_e4m3"], "out_dtype": "bf16", "mask": ["dense", "causal"]}},
    {"family": "mla_decode", "archs": ["sm_90a"], "policy": {"heads": [64, 128], "page_size": 64, "max_seq_len": 163840, "max_seq_len_q": [1, 2], "packed": false, "dtype": "bf16", "out_dtype": "bf16", "mask": "causal", "precision": "bf16"}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [8, 16], "head_tiles": 1, "has_extra": false, "split": false}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [8, 16], "head_tiles": 1, "has_extra": true, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "head_tiles": [1, 2], "has_extra": false, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "head_tiles": [1, 2], "has_extra": true, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "kernel": "sm90", "has_extra": false, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_90a"], "policy": {"heads": [32, 64, 128], "kernel": "sm90", "has_extra": true, "split": [false, true]}},
    {"family": "sparse_nvfp4", "archs": ["sm_120a"], "policy": {"heads": [8, 16, 32, 64, 128], "kernel": "mma_small", "has_extra": false, "split": false}},
    {"family": "sparse_nvfp4", "archs": ["sm_120a"], "policy": {"heads": [8, 16, 32, 64, 128], "kernel": "mma_small", "has_extra": true, "split": [false, true]}},
    {"family": "sparse_dsv41", "policy": {"heads": [64, 128], "variant": "default", "has_extra": [false, true], "split": [false, true]}},
    {"family": "sparse_dsv41", "archs": ["sm_90a"], "policy": {"heads": [64, 128], "variant": "sm90", "has_extra": [false, true], "split": [false, true]}}
  ]
}
)json";
}

}  // namespace kiln::tools
