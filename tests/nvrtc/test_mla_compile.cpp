// The mla_decode family's rendered module (the decode kernel) and its companion mla_combine module
// (both combines) compile under NVRTC for both target archs, through the kernel service as a prebuild
// would (no GPU). Five keys: the wgmma kernel
// (sm_90a; bf16, and fp8 with its producer warpgroup), the mma.sync kernel's 16-row tile and sm_120's
// configuration, bf16 and fp8, fixed and packed, both masks, four page sizes, query rows up to 64, and
// the one-bf16-P precision on the heads-on-M, KV-on-M and sm_120 kernels.
// The full default-manifest set is left to the manifest's prebuild test: each compile takes a while.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "kiln/jit/family.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/mla_decode/family.h"
#include "tests/support/expect_compiled.h"
#include "tests/support/temp_dir.h"

namespace {

using kiln::DType;
using kiln::mla::MaskType;
using kiln::mla::MlaDecodePolicy;

struct Case {
  const char* arch;
  MlaDecodePolicy policy;
};

}  // namespace

TEST_CASE("mla_decode compiles for sm_90a and sm_120a", "[nvrtc]") {
  kiln::mla::register_mla_family();
  const kiln::testing::TempDir dir("kiln_mla_nvrtc");
  kiln::Config config;
  config.cache_dir = dir.path();
  kiln::KernelService service(config);

  // heads, page_size, max_seq_len, max_seq_len_q, packed, dtype, out_dtype, mask, kernel, precision
  constexpr auto kAuto = kiln::mla::MlaKernel::kAuto;
  constexpr auto kOneP = kiln::mla::MlaPrecision::kBf16;
  const std::vector<Case> cases = {
      {"sm_90a", {128, 64, 163840, 1, false, DType::kBf16, DType::kBf16, MaskType::kCausal}},  // wgmma
      {"sm_90a", {16, 16, 4096, 2, true, DType::kE4m3, DType::kBf16, MaskType::kDense}},       // wgmma fp8
      {"sm_90a", {64, 32, 65536, 1, false, DType::kE4m3, DType::kBf16, MaskType::kCausal}},    // wgmma fp8
      {"sm_90a", {8, 128, 4096, 1, false, DType::kBf16, DType::kBf16, MaskType::kCausal}},     // 16-row tile
      {"sm_120a", {32, 128, 163840, 64, true, DType::kBf16, DType::kBf16, MaskType::kCausal}},  // sm_120's
      {"sm_90a", {128, 64, 163840, 2, false, DType::kBf16, DType::kBf16, MaskType::kCausal, kAuto, kOneP}},
      {"sm_90a", {16, 64, 163840, 2, false, DType::kBf16, DType::kBf16, MaskType::kCausal, kAuto, kOneP}},  // KV-on-M
      {"sm_120a", {64, 64, 163840, 1, false, DType::kBf16, DType::kBf16, MaskType::kDense, kAuto, kOneP}},
  };
  std::set<std::string> combines;
  for (const Case& c : cases) {
    const kiln::SemanticKey key = c.policy.key(c.arch);
    INFO(key.str());
    const nlohmann::json lowered = kiln::testing::expect_compiled(service, key);
    REQUIRE(lowered.size() == 1u);
    CHECK(lowered[0].get<std::string>().find("mla_decode_kernel") != std::string::npos);
    for (const kiln::SemanticKey& combine : kiln::companion_keys(key)) {
      if (!combines.insert(combine.str()).second) continue;
      INFO(combine.str());
      const nlohmann::json names = kiln::testing::expect_compiled(service, combine);
      REQUIRE(names.size() == 2u);
      CHECK(names[kiln::kMlaCombineEntry].get<std::string>().find("mla_combine_kernel") != std::string::npos);
      CHECK(names[kiln::kMlaCombineWideEntry].get<std::string>().find("mla_combine_wide_kernel") != std::string::npos);
    }
  }
  CHECK(combines.size() == cases.size());  // no two cases share heads, query rows, packing and arch
  CHECK(service.counters().compiles == cases.size() + combines.size());
}
