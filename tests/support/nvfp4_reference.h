#pragma once
// CPU reference of the 384-byte NVFP4 token format (runtime/nvfp4_writer/README.md) and of the
// upstream writers' quantize rule, written from the format's definition and shared with no kernel:
// conversions are brute-force nearest-value searches over the format's values (ties to the even
// code), the scale is amax / 6 in fp32. The GPU cache writer is tested byte-for-byte against this.
#include <array>
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
// Nearest finite e4m3 value, ties to the even code; beyond 448 (and Inf) the largest; NaN -> 0x7f.
uint8_t float_to_e4m3_satfinite(float f);
float e2m1_to_float(uint8_t code);
// Nearest of the 8 E2M1 magnitudes, ties to the even code, sign kept (-0 and negatives that round
// to zero give 0x8); beyond 6 (and Inf) +-6; NaN -> 0x7 (+6), as cvt.rn.satfinite.e2m1x2.f32.
uint8_t float_to_e2m1(float y);

// The reciprocal the quantizer multiplies by, per E4M3 scale byte (0..127): by default fp32(1/s)
// (0 for s == 0). Upstream's compiled writer takes MUFU.RCP (rcp.approx.ftz.f32) of the scale; the
// GPU tests read those values from the device and pass them here.
using Nvfp4Reciprocals = std::array<float, 128>;
const Nvfp4Reciprocals& nvfp4_exact_reciprocals();

// One token: 512 bf16 values -> 352 data bytes + 32 scale bytes. Per group of 16: amax over the
// non-NaN |x|, scale = e4m3(amax / 6), code = e2m1(fp32(x * reciprocal(scale))).
void nvfp4_quantize_token(const uint16_t* x, uint8_t* data, uint8_t* scales,
                          const Nvfp4Reciprocals& rcp = nvfp4_exact_reciprocals());

// The quantize-dequantize round trip of 448 NoPE values in place (what the kernels do to Q, by the
// writers' rule: pass the device's rcp.approx.ftz values as `rcp` to follow them exactly).
void nvfp4_round_trip_nope(float* x, const Nvfp4Reciprocals& rcp = nvfp4_exact_reciprocals());

// Token `index` of a paged pool (page p at pool + p * page_stride; page_size tokens per page).
void nvfp4_write_token(uint8_t* pool, long long page_stride, int page_size, long long index, const uint16_t* x,
                       const Nvfp4Reciprocals& rcp = nvfp4_exact_reciprocals());
void nvfp4_dequantize_token(const uint8_t* pool, long long page_stride, int page_size, long long index, float* out);

}  // namespace kiln::testing
