// The sparse_nvfp4 family compiles under NVRTC for every target arch (no GPU). Six modules: on
// sm_90a the warpgroup-MMA kernel (one head group and a cluster pair) and the mma.sync kernel, on
// sm_120a the compact configuration, covering both values of has_extra and split (and head_tiles for
// the mma.sync kernel), so every branch of the decode templates is instantiated, and the merge kernel
// (their sparse_merge companions, one module per arch). split and H are run-time values of each
// kernel, so keys that differ only in them share one entry.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "kiln/runtime/config.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "tests/support/expect_compiled.h"
#include "tests/support/temp_dir.h"

namespace {

namespace sp = kiln::sparse;

struct Case {
  const char* arch;
  sp::SparsePolicy policy;
  int twin_heads;  // another head count the same module serves
};

}  // namespace

TEST_CASE("sparse_nvfp4 compiles for sm_90a and sm_120a", "[nvrtc]") {
  sp::register_sparse_family();
  const kiln::testing::TempDir dir("kiln_sparse_nvrtc");
  kiln::Config config;
  config.cache_dir = dir.path();
  kiln::KernelService service(config);

  const std::vector<Case> cases = {
      {"sm_90a", {64, 1, false, false, sp::SparseKernel::kSm90}, 32},  // TP 2 of 128 heads, sliding window only, direct
      {"sm_90a", {128, 1, true, true, sp::SparseKernel::kSm90}, 96},   // full 128 heads (a cluster pair), both pools, split
      {"sm_90a", {32, 2, false, true}, 96},                            // the mma.sync kernel, two head tiles
      {"sm_90a", {8, 1, true, false}, 48},                             // smallest head count (half a 16-row tile)
      {"sm_120a", {16, 1, false, true, sp::SparseKernel::kMmaSmall}, 96},
      {"sm_120a", {64, 1, true, false, sp::SparseKernel::kMmaSmall}, 128},
  };
  for (const Case& c : cases) {
    const kiln::SemanticKey key = c.policy.key(c.arch);
    INFO(key.str());
    const nlohmann::json lowered = kiln::testing::expect_compiled(service, key);
    // An sm90 module of H > 64 also holds the one-group kernel of an unpaired launch.
    const bool two_kernels = c.policy.kernel == sp::SparseKernel::kSm90 && c.policy.heads > 64;
    REQUIRE(lowered.size() == (two_kernels ? 2u : 1u));
    for (const nlohmann::json& name : lowered) {
      CHECK(name.get<std::string>().find(c.policy.kernel == sp::SparseKernel::kSm90 ? "sparse_nvfp4_sm90_kernel" : "sparse_nvfp4_decode_kernel") !=
            std::string::npos);
    }
  }
  // The merge kernel is each key's sparse_merge companion: one module per arch.
  std::set<std::string> merges;
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    const kiln::SemanticKey merge = sp::SparseMergePolicy{64}.key(arch);
    merges.insert(merge.str());
    INFO(merge.str());
    const nlohmann::json lowered = kiln::testing::expect_compiled(service, merge);
    REQUIRE(lowered.size() == 1u);
    CHECK(lowered[0].get<std::string>().find("sparse_nvfp4_merge_kernel") != std::string::npos);
  }
  // A second service over the same directory finds every entry on disk: nothing recompiles, nor for
  // the keys that differ from a case only in split or H, nor for another H's merge.
  kiln::KernelService again(config);
  for (const Case& c : cases) {
    CHECK(again.build(c.policy.key(c.arch)).source == kiln::ArtifactSource::kDisk);
    sp::SparsePolicy twin = c.policy;
    twin.split = !c.policy.split;
    INFO(twin.key(c.arch).str());
    CHECK(again.build(twin.key(c.arch)).source == kiln::ArtifactSource::kDisk);
    twin.heads = c.twin_heads;
    INFO(twin.key(c.arch).str());
    CHECK(again.build(twin.key(c.arch)).source == kiln::ArtifactSource::kDisk);
    CHECK(again.build(sp::SparseMergePolicy{c.policy.heads}.key(c.arch)).source == kiln::ArtifactSource::kDisk);
  }
  CHECK(again.counters().compiles == 0);
  CHECK(service.counters().compiles == cases.size() + merges.size());
}

TEST_CASE("sparse_nvfp4: the sm90 kernel for another target fails with a message naming the kernel and the fix",
          "[nvrtc]") {
  sp::register_sparse_family();
  const kiln::testing::TempDir dir("kiln_sparse_nvrtc_arch");
  kiln::Config config;
  config.cache_dir = dir.path();
  kiln::KernelService service(config);
  const kiln::SemanticKey key = sp::SparsePolicy{64, 1, false, false, sp::SparseKernel::kSm90}.key("sm_120a");
  try {
    service.build(key);
    FAIL("compiling " << key.str() << " succeeded");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kCompileFailed);
    CHECK_THAT(e.what(), Catch::Contains("runs on sm_90a only") && Catch::Contains("mma_small"));
  }
}
