#pragma once
// CPU oracle of the sparse DeepSeek-V4.1 MLA decode (runtime/sparse_dsv41/README.md): the two FOOTER
// record formats decoded element by element from their definitions (E4M3 codes times UE8M0 powers of
// two in the 528-byte main record; E2M1 codes times E4M3 scales in the 288-byte extra record), and the
// decode's attention computed in double over the exactly dequantized rows with the bf16 query as
// given. Shares nothing with kernel_templates/; the element decoders are the NVFP4 reference's, which
// the unit suite checks against the CUDA toolkit's conversions.
#include <cstdint>
#include <vector>

namespace kiln::testing {

inline constexpr int kDsv41Dims = 512;

enum class Dsv41Format {
  kMain,   // 528 B: 512 E4M3 codes, then (in the page's scale block) 16 UE8M0 scales, one per 32 dims
  kExtra,  // 288 B: 256 bytes of E2M1 pairs (dim 2i low nibble), then 32 E4M3 scales, one per 16 dims
};

struct Dsv41Geometry {
  int data_bytes;
  int scale_bytes;
  int scale_group;  // dims per scale byte
  int record_bytes;
};
Dsv41Geometry dsv41_geometry(Dsv41Format format);

// 2^(b - 127); 0xff is NaN; 0x00 is 2^-127 (a subnormal float).
float ue8m0_to_float(std::uint8_t b);

// One record's 512 values: main x[d] = e4m3(codes[d]) * ue8m0(scales[d / 32]);
// extra x[d] = e2m1(nibble d of codes) * e4m3(scales[d / 16]). NaN codes and scales give NaN.
void dsv41_dequantize_main(const std::uint8_t* codes, const std::uint8_t* scales, float* out);
void dsv41_dequantize_extra(const std::uint8_t* codes, const std::uint8_t* scales, float* out);

// A paged cache in the FOOTER layout: page p starts at base + p * page_stride and holds page_size
// data rows, then page_size scale rows; a slot is page * page_size + row.
struct Dsv41Cache {
  Dsv41Format format = Dsv41Format::kMain;
  const std::uint8_t* base = nullptr;
  long long page_stride = 0;  // bytes, >= page_size * record_bytes
  int page_size = 0;
};
// Byte offsets of a slot's data row and scale row from the cache's base.
long long dsv41_data_offset(Dsv41Format format, long long page_stride, int page_size, long long slot);
long long dsv41_scale_offset(Dsv41Format format, long long page_stride, int page_size, long long slot);
void dsv41_dequantize_slot(const Dsv41Cache& cache, long long slot, float* out);

// One candidate section of the decode (main or extra).
struct Dsv41Section {
  Dsv41Cache cache;
  const std::int32_t* indices = nullptr;   // token t's row at indices + t * row_stride; null: no section
  long long row_stride = 0;
  int topk = 0;
  const std::int32_t* lengths = nullptr;   // per-token active prefix (clamped to [0, topk]), or null
};

struct Dsv41Problem {
  int tokens = 0;                      // T
  int heads = 0;                       // H
  const std::uint16_t* q = nullptr;    // [T, H, 512] bf16, used as given
  Dsv41Section main;
  Dsv41Section extra;
  const float* attn_sink = nullptr;    // [H] natural-log logits, or null
  double sm_scale = 0;
  double lse_scale = 1;
};

// out [T, H, 512] and lse [T, H] in fp32 (lse: base-2 LSE times lse_scale). Candidates of token t:
// main slots j < len with a non-negative index, then extra slots alike, each occurrence counted; a
// token with none gets zeros and -inf (sink * log2(e) * lse_scale with a sink). Slots that are
// masked or past the length are never read.
void dsv41_reference(const Dsv41Problem& problem, float* out, float* lse);

// The valid candidate slots of token t of a section, in order (what the reference gathers).
std::vector<std::int32_t> dsv41_valid_candidates(const Dsv41Section& section, int t);

}  // namespace kiln::testing
