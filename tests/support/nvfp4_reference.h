#pragma once
// CPU reference of the 384-byte NVFP4 token format (spec/sparse_nvfp4_decode.md): the exact quantize
// rule writers use, and dequantization. The GPU cache writer is tested byte-for-byte against this.
#include <cstdint>

namespace kiln::testing {

constexpr int kNvfp4Dims = 512;
constexpr int kNvfp4NopeDims = 448;
constexpr int kNvfp4Groups = 28;          // 16-value scale groups over the NoPE dims
constexpr int kNvfp4DataBytes = 352;      // 224 code bytes + 128 RoPE bytes per token
constexpr int kNvfp4ScaleBytes = 32;      // 28 scales + 4 zero bytes per token
constexpr int kNvfp4TokenBytes = 384;

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float f);  // round to nearest even, NaN -> 0x7fc0 | sign
float e4m3_to_float(uint8_t v);   // OCP e4m3fn
uint8_t float_to_e4m3_satfinite(float f);  // RNE, clamp to +-448, NaN -> 0x7f
float e2m1_to_float(uint8_t code);
uint8_t float_to_e2m1(float y);   // RNE saturating at 6; zero magnitude and NaN -> 0

// One token: 512 bf16 values -> 352 data bytes + 32 scale bytes.
void nvfp4_quantize_token(const uint16_t* x, uint8_t* data, uint8_t* scales);

// The quantize-dequantize round trip of 448 NoPE values in place (what the kernels do to Q).
void nvfp4_round_trip_nope(float* x);

// Token `index` of a paged pool (page p at pool + p * page_stride; page_size tokens per page).
void nvfp4_write_token(uint8_t* pool, long long page_stride, int page_size, long long index, const uint16_t* x);
void nvfp4_dequantize_token(const uint8_t* pool, long long page_stride, int page_size, long long index, float* out);

}  // namespace kiln::testing
