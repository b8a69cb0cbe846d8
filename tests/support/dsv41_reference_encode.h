#pragma once
// CPU reference of the DeepSeek-V4.1 cache writers (528 B FP8 and 288 B FP4 records, FOOTER
// layout), written from the format's rules (runtime/dsv41_writer/README.md) and sharing nothing
// with the kernels: element encodings are nearest-value searches over the format's values (ties to
// the even code), divisions are the host's IEEE fp32 division, the power-of-two scale is found by
// comparing powers of two. The GPU writers are tested byte for byte against it.
#include <cstdint>

namespace kiln::testing {

inline constexpr int kDsv41Dims = 512;
inline constexpr int kDsv41Fp8Data = 512, kDsv41Fp8Scales = 16, kDsv41Fp8Record = 528;
inline constexpr int kDsv41Fp4Data = 256, kDsv41Fp4Scales = 32, kDsv41Fp4Record = 288;

enum class Dsv41Format { kFp8, kFp4 };

int dsv41_record_bytes(Dsv41Format f);

// Input widening (exact).
float dsv41_bf16_value(uint16_t bits);
float dsv41_fp16_value(uint16_t bits);
// Nearest fp16 / bf16 to f, ties to even (for building inputs).
uint16_t dsv41_fp16_bits(float f);
uint16_t dsv41_bf16_bits(float f);

// E4M3 (OCP e4m3fn) value of a byte (NaN for 0x7F / 0xFF).
float dsv41_e4m3_value(uint8_t code);
// Nearest finite E4M3 to v, ties to the even code, saturating at +-448, sign kept (so -0 and
// negatives that round to zero give 0x80). v must not be NaN.
uint8_t dsv41_e4m3_encode(float v);
// E2M1 value of a nibble; nearest E2M1 code of y (ties to the even code, saturating at +-6, sign kept).
float dsv41_e2m1_value(uint8_t code);
uint8_t dsv41_e2m1_encode(float y);

// One FP8 group of 32 values -> 32 code bytes; returns the UE8M0 scale byte.
uint8_t dsv41_fp8_group(const float* x, uint8_t* codes);
// One FP4 group of 16 values -> 8 packed bytes (element 2i in the low nibble of byte i); returns the
// E4M3 scale byte.
uint8_t dsv41_fp4_group(const float* x, uint8_t* packed);

// One 512-value row -> its data bytes (512 or 256) and scale bytes (16 or 32).
void dsv41_encode_row(Dsv41Format f, const float* x, uint8_t* data, uint8_t* scales);

// Writes row x into slot `slot` of a paged byte image (page p at pool + p * page_stride; page_size
// data rows, then page_size scale rows). Touches only that slot's data and scale bytes.
void dsv41_write_slot(Dsv41Format f, uint8_t* pool, long long page_stride, int page_size, long long slot, const float* x);

// Dequantized value of dim d of slot `slot` (what the decode reads).
float dsv41_read_dim(Dsv41Format f, const uint8_t* pool, long long page_stride, int page_size, long long slot, int d);

}  // namespace kiln::testing
