#include "tests/support/mla_matrix.h"

#include "tests/support/rng.h"

namespace kiln::testing::mla_matrix {

const std::vector<int> kAllLens = {65, 1, 4097, 256, 2048, 63, 2049, 64};
const std::vector<int> kMidLens = {256, 1, 2049, 64, 63, 65};
const std::vector<int> kShortLens = {63, 1, 256, 65, 64};

MlaCase fixed(int heads, int page, int sq, bool fp8, bool causal, std::vector<int> lens, long long max_seq_len) {
  MlaCase c;
  c.heads = heads;
  c.page_size = page;
  c.sq = sq;
  c.fp8 = fp8;
  c.causal = causal;
  c.seq_lens = std::move(lens);
  c.max_seq_len = max_seq_len;
  return c;
}

MlaCase packed(int heads, int page, int msq, bool fp8, bool causal, std::vector<int> lens, std::vector<int> q_lens,
               long long max_seq_len) {
  MlaCase c = fixed(heads, page, msq, fp8, causal, std::move(lens), max_seq_len);
  c.packed = true;
  c.q_lens = std::move(q_lens);
  return c;
}

std::vector<MlaCase> conformance_matrix() {
  constexpr bool kBf16 = false, kFp8 = true, kDense = false, kCausal = true;
  std::vector<MlaCase> m = {
      // The DeepSeek shapes (tensor parallel 8 and 1), live lengths far below max_seq_len.
      fixed(16, 64, 1, kBf16, kCausal, kAllLens, kFar),
      fixed(16, 64, 1, kFp8, kCausal, kAllLens, kFar),
      fixed(128, 64, 1, kBf16, kCausal, kAllLens, kFar),
      fixed(128, 64, 1, kFp8, kCausal, {65, 1, 2049, 256, 2048, 63, 64}, kFar),
      fixed(32, 64, 2, kBf16, kCausal, kAllLens, kFar),
      fixed(64, 64, 2, kFp8, kCausal, kMidLens, kFar),
      // Every head count, with every page size, both dtypes, both masks and every SQ spread over them.
      fixed(6, 16, 2, kBf16, kCausal, kAllLens),
      fixed(6, 32, 8, kFp8, kDense, kAllLens),
      fixed(7, 128, 8, kBf16, kCausal, kAllLens),
      fixed(7, 32, 2, kFp8, kDense, kAllLens),
      fixed(8, 32, 4, kBf16, kDense, kAllLens),
      fixed(8, 16, 1, kFp8, kCausal, kAllLens, kFar),
      fixed(12, 16, 1, kFp8, kDense, kAllLens),
      fixed(12, 128, 4, kBf16, kCausal, kAllLens, 8192),
      fixed(24, 64, 2, kBf16, kDense, kAllLens),
      fixed(24, 128, 1, kFp8, kCausal, kAllLens),
      fixed(32, 16, 1, kBf16, kDense, kAllLens, 5000),
      fixed(32, 32, 2, kFp8, kCausal, kAllLens),
      fixed(48, 64, 1, kBf16, kDense, kAllLens),
      fixed(48, 128, 2, kFp8, kCausal, kMidLens),
      fixed(64, 16, 2, kBf16, kCausal, kMidLens),
      fixed(64, 32, 1, kFp8, kDense, kAllLens),
      fixed(96, 64, 1, kBf16, kCausal, {65, 1, 2049, 256, 2048, 63, 64}),
      fixed(96, 16, 1, kFp8, kDense, kMidLens, kFar),
      fixed(96, 32, 4, kBf16, kCausal, {63, 1, 256, 65, 2048, 64}),
      fixed(128, 128, 2, kBf16, kCausal, kMidLens),
      fixed(128, 32, 2, kFp8, kDense, kMidLens),
      fixed(64, 128, 4, kBf16, kCausal, kMidLens),
      fixed(32, 64, 8, kFp8, kCausal, kMidLens),
      fixed(16, 128, 8, kBf16, kDense, kAllLens),
      fixed(128, 16, 8, kBf16, kCausal, kShortLens),
      fixed(128, 64, 4, kFp8, kDense, kShortLens),
      fixed(24, 32, 8, kFp8, kCausal, kMidLens),
      fixed(48, 16, 4, kFp8, kDense, kShortLens),
      fixed(16, 32, 4, kFp8, kCausal, kAllLens),
      fixed(12, 64, 8, kBf16, kDense, kMidLens),
      // max_seq_len <= one 32-token tile: no split is possible, the decode kernel writes `out` itself.
      fixed(16, 16, 4, kBf16, kCausal, {1, 17, 31, 32, 5, 32}, 32),
      fixed(8, 128, 1, kFp8, kDense, {32, 1, 20}, 32),
      // A batch large enough to fill the GPU with one split per request (72 x 2 row tiles > 132 SMs).
      fixed(128, 64, 1, kFp8, kCausal, {}, 300),
      fixed(96, 128, 2, kBf16, kCausal, {}, 300),
      // Packed: uneven and empty requests (first and last empty too).
      packed(16, 128, 8, kBf16, kCausal, {65, 1, 4097, 256, 2049, 63, 64, 300}, {8, 0, 4, 1, 0, 3, 8, 7}),
      packed(8, 64, 4, kFp8, kCausal, {65, 1, 4097, 256, 2049, 63, 64, 300}, {4, 0, 2, 1, 0, 3, 4, 3}, kFar),
      packed(64, 16, 4, kBf16, kDense, {65, 1, 2049, 256, 2048, 63, 64, 300}, {4, 0, 2, 1, 0, 3, 4, 3}),
      packed(16, 32, 2, kFp8, kDense, {4097, 63, 1, 2048, 64}, {2, 1, 0, 2, 1}),
      packed(128, 128, 4, kBf16, kCausal, {300, 65, 1, 64, 63}, {4, 1, 0, 3, 2}),
      packed(7, 16, 8, kFp8, kCausal, {1, 2049, 65, 4097, 64, 256}, {0, 5, 8, 1, 0, 8}),
      packed(32, 64, 1, kBf16, kCausal, {2049, 1, 63, 4097, 64, 65}, {1, 0, 1, 1, 0, 1}, kFar),
      packed(6, 32, 2, kBf16, kDense, {64, 4097, 1, 65, 2048, 256}, {0, 2, 1, 2, 1, 0}),
      packed(96, 64, 2, kFp8, kCausal, {256, 65, 1, 2049}, {1, 2, 2, 0}),
      packed(12, 128, 4, kFp8, kDense, {63, 64, 65, 1, 256}, {3, 0, 4, 4, 1}, 70000),
      packed(24, 16, 8, kBf16, kCausal, {1, 63, 256, 64}, {8, 0, 3, 6}),
      packed(48, 32, 2, kBf16, kDense, {2049, 65, 1}, {2, 0, 1}),
      // Long query rows (speculative decoding, upstream's SQ 16 / 32 tests): SQ x H fold into row
      // tiles like any other rows; causal rows with L < SQ see no key at first (zeros).
      fixed(24, 64, 16, kBf16, kCausal, {65, 1, 256, 63, 2049}),
      fixed(12, 32, 32, kFp8, kDense, {64, 1, 300, 129}),
      fixed(12, 128, 32, kBf16, kCausal, {63, 2049, 1, 256}),
      fixed(8, 16, 64, kBf16, kCausal, {64, 65, 1, 700}),
      fixed(16, 64, 64, kBf16, kDense, {100, 33}),
      fixed(128, 16, 64, kFp8, kCausal, {70, 1}),
      packed(128, 64, 16, kBf16, kCausal, {300, 65, 1, 129}, {16, 0, 5, 16}),
      // Large magnitudes (outlier channels: bf16 cache values to +-32, fp8 over the whole e4m3 range).
      fixed(128, 64, 1, kBf16, kCausal, kMidLens, kFar),
      fixed(16, 32, 2, kBf16, kDense, kAllLens),
      fixed(64, 64, 1, kFp8, kCausal, kMidLens, kFar),
      packed(16, 128, 4, kFp8, kCausal, {65, 1, 2049, 256}, {4, 1, 2, 3}),
  };
  for (std::size_t i = m.size() - 4; i < m.size(); ++i) m[i].outliers = true;
  // The two large-batch cases draw their lengths here (random, short: the oracle stays cheap).
  Rng rng(base_seed() ^ 0x5eed);
  for (MlaCase& c : m) {
    if (!c.seq_lens.empty()) continue;
    const int batch = 72;
    for (int b = 0; b < batch; ++b) c.seq_lens.push_back(1 + rng.below(static_cast<int>(c.max_seq_len)));
  }
  // Layout variety at no cost: padded block-table rows on most launches, the rank-4 cache on some,
  // fixed mode without max_seq_len_q on some, and one launcher-allocated output.
  for (std::size_t i = 0; i < m.size(); ++i) {
    m[i].bt_pad = i % 3 == 0 ? 0 : static_cast<int>(1 + i % 17);
    m[i].rank4_cache = i % 4 == 1;
    m[i].pass_max_seq_len_q = i % 5 != 2;
  }
  m[9].allocate_out = true;
  return m;
}


double oracle_gmacs(const MlaCase& c) {
  double macs = 0;
  for (std::size_t b = 0; b < c.seq_lens.size(); ++b) macs += static_cast<double>(c.seq_lens[b]) * c.q_len(static_cast<int>(b));
  return macs * c.heads * (576 + 512) * 1e-9;
}

}  // namespace kiln::testing::mla_matrix
