#pragma once
// fp64 CPU oracle for paged MLA decode (every product, sum and exponential in double; the output
// rounded once to float), written straight from the contract's "Math" section
// (runtime/mla_decode/README.md). Inputs are raw bf16 / e4m3 bit patterns as stored on the device.
#include <cstdint>
#include <vector>

namespace kiln::testing {

float bf16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16_bits(float f);  // round to nearest even
float e4m3_bits_to_float(std::uint8_t bits);  // OCP e4m3fn; 0x7f / 0xff are NaN
std::uint8_t float_to_e4m3_bits(float f);     // round to nearest even, saturating to +-448

struct MlaReferenceProblem {
  int batch = 0;
  int heads = 0;
  int page_size = 0;
  bool fp8 = false;     // q and kv are e4m3 bytes, else bf16 u16 words
  bool causal = false;
  // Query rows of request b are q tokens [q_offsets[b], q_offsets[b + 1]); B + 1 entries.
  // Fixed mode is q_offsets[b] = b * SQ.
  std::vector<int> q_offsets;
  const void* q = nullptr;             // [total_q][heads][576]
  const void* kv = nullptr;            // [pages][page_size][576]
  const std::int32_t* block_tables = nullptr;
  long long block_table_stride = 0;    // elements between rows
  const std::int32_t* seq_lens = nullptr;  // [batch]
  float bmm1_scale = 1.f;
  float bmm2_scale = 1.f;
};

// Returns out as float, [total_q][heads][512]. Rows that see no key are zeros.
// `threads` > 1 splits the work over std::threads (requests x query rows).
std::vector<float> mla_reference(const MlaReferenceProblem& problem, int threads = 1);

}  // namespace kiln::testing
