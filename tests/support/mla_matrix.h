#pragma once
// The paged MLA decode conformance matrix (runtime/mla_decode/README.md, "Conformance"): the launches
// the GPU suite runs against the fp64 oracle. Host-only, so that the unit suite can check on every CI
// run that the matrix still covers every value of every axis the contract lists.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/runtime/mla_decode/family.h"

namespace kiln::testing::mla_matrix {

using kiln::DType;
using kiln::mla::MaskType;
using kiln::mla::MlaKernel;

// One launch of the matrix. Fixed mode: every request has `sq` query rows; packed: q_lens[b].
struct MlaCase {
  int heads = 16;
  int page_size = 64;
  int sq = 1;  // fixed: SQ; packed: max_seq_len_q
  bool fp8 = false;
  bool causal = true;
  bool packed = false;
  long long max_seq_len = 0;  // 0: the longest live length (exact fit)
  std::vector<int> seq_lens;
  std::vector<int> q_lens;    // packed only; 0 = empty request
  int bt_pad = 0;             // block-table row stride = max_pages + bt_pad (padding -> NaN page)
  bool rank4_cache = false;   // [pages, 1, page_size, 576] instead of [pages, page_size, 576]
  bool pass_max_seq_len_q = true;  // fixed mode: pass SQ explicitly or leave it out
  bool allocate_out = false;  // let the launcher allocate the output (not graph-safe; eager only)
  // Peaked softmax: a fixed (large) bmm1_scale instead of one drawn around DeepSeek's, and/or one key
  // per request made to dominate every row's scores.
  float bmm1 = 0.f;           // 0: drawn from [0.04, 0.2]
  bool dominant_key = false;
  MlaKernel kernel = MlaKernel::kAuto;  // forced kernel variant
  kiln::mla::MlaPrecision precision = kiln::mla::MlaPrecision::kExact;
  bool outliers = false;      // large-magnitude cache channels (the GPU suite's fill_random)
  std::uint64_t seed = 0;     // 0: the seed of the launch's place in its list

  bool one_p() const { return precision == kiln::mla::MlaPrecision::kBf16; }
  long long policy_max_seq_len() const {
    return max_seq_len > 0 ? max_seq_len : *std::max_element(seq_lens.begin(), seq_lens.end());
  }
  int q_len(int b) const { return packed ? q_lens[b] : sq; }
  std::string label() const {
    std::ostringstream s;
    s << "H" << heads << " p" << page_size << (packed ? " packed msq" : " SQ") << sq << (fp8 ? " fp8" : " bf16")
      << (causal ? " causal" : " dense") << " max_seq_len " << policy_max_seq_len() << " B " << seq_lens.size() << " L [";
    for (std::size_t b = 0; b < seq_lens.size(); ++b) {
      s << (b ? "," : "") << seq_lens[b];
      if (packed) s << "/" << q_lens[b];
    }
    s << "] pad " << bt_pad << (rank4_cache ? " rank4" : "") << (allocate_out ? " alloc-out" : "");
    if (bmm1 > 0) s << " bmm1 " << bmm1;
    if (dominant_key) s << " dominant-key";
    if (kernel == MlaKernel::kMmaSync) s << " kernel=mma_sync";
    if (kernel == MlaKernel::kWgmma) s << " kernel=wgmma";
    if (kernel == MlaKernel::kWgmmaKv) s << " kernel=wgmma_kv";
    if (one_p()) s << " precision=bf16";
    if (outliers) s << " outliers";
    return s.str();
  }
  kiln::mla::MlaDecodePolicy policy() const {
    return {heads,  page_size, policy_max_seq_len(), sq, packed, fp8 ? DType::kE4m3 : DType::kBf16, DType::kBf16,
            causal ? MaskType::kCausal : MaskType::kDense, kernel, precision};
  }
};

// The tile-edge lengths of the contract, in a scrambled order so long and short requests interleave.
extern const std::vector<int> kAllLens;
extern const std::vector<int> kMidLens;    // no 2048 / 4097: for 256+ rows
extern const std::vector<int> kShortLens;  // for 512+ rows
inline constexpr long long kFar = 163840;  // DeepSeek-V3's max_seq_len

MlaCase fixed(int heads, int page, int sq, bool fp8, bool causal, std::vector<int> lens, long long max_seq_len = 0);
MlaCase packed(int heads, int page, int msq, bool fp8, bool causal, std::vector<int> lens, std::vector<int> q_lens,
               long long max_seq_len = 0);

// The matrix; the two large-batch launches draw their lengths from base_seed().
std::vector<MlaCase> conformance_matrix();

// The oracle's cost of one launch: sum(L * q_len) * H * (576 + 512) multiply-adds, in G.
double oracle_gmacs(const MlaCase& c);

}  // namespace kiln::testing::mla_matrix
