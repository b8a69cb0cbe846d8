#pragma once
// The 384-byte NVFP4 MLA cache format (spec: sparse_nvfp4_decode.md). Host- and device-visible.
// A page holds page_size * 352 data bytes, then page_size * 32 scale bytes.

namespace kiln {

inline constexpr int kNvfp4LatentDims = 512;      // 448 quantized NoPE dims + 64 bf16 RoPE dims
inline constexpr int kNvfp4Groups = 28;            // 448 / 16: one e4m3 scale per 16 values
inline constexpr int kNvfp4CodeBytes = 224;        // 448 e2m1 codes, two per byte, low nibble first
inline constexpr int kNvfp4DataBytes = 352;        // codes + 64 bf16 RoPE values (128 bytes), per token
inline constexpr int kNvfp4ScaleBytes = 32;        // 28 scales + 4 zero bytes, per token
inline constexpr int kNvfp4TokenBytes = 384;

}  // namespace kiln
