// sm_120 GPUs give a block at most 99 KiB of shared memory (static + dynamic). kiln's GPU tests run
// on Hopper, where a larger render would still launch, so every sm_120a render of a family with a
// compact configuration is held to the budget here: the cubin's static shared memory plus the
// dynamic bytes its launcher asks for.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kiln/jit/compiler.h"
#include "kiln/kernel_templates/sparse_dsv41/params.cuh"
#include "kiln/kernel_templates/sparse_nvfp4/params.cuh"
#include "kiln/runtime/config.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "tests/support/cubin_shared.h"
#include "tests/support/temp_dir.h"

namespace {

constexpr std::uint64_t kSm120BlockShared = 101376;  // 99 KiB

// The decode kernel's static shared memory in `key`'s cubin.
std::uint64_t decode_static_shared(kiln::KernelService& service, const kiln::SemanticKey& key) {
  const kiln::Artifact a = service.build(key);
  REQUIRE(a.entry != nullptr);
  const std::string decode = a.entry->metadata.at("lowered_names").at(0).get<std::string>();
  return kiln::testing::static_shared_bytes(a.entry->cubin, decode, key.arch());
}

}  // namespace

TEST_CASE("cubin static shared memory is read from the ELF (a kernel with a known array)", "[nvrtc]") {
  const kiln::KernelSource source{
      "extern \"C\" __global__ void probe(float* out) {\n"
      "  __shared__ float buf[300];\n"
      "  buf[threadIdx.x] = threadIdx.x;\n"
      "  __syncthreads();\n"
      "  out[threadIdx.x] = buf[299 - threadIdx.x];\n"
      "}\n",
      {"probe"}};
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    INFO(arch);
    const kiln::CompileResult r = kiln::Compiler().compile(source, arch, "probe");
    CHECK(kiln::testing::static_shared_bytes(r.cubin, "probe", arch) == 300 * sizeof(float));
    CHECK(kiln::testing::static_shared_bytes(r.cubin, "absent", arch) == 0);
  }
  CHECK_THROWS(kiln::testing::static_shared_bytes("not an elf", "probe", "sm_90a"));
}

TEST_CASE("every sm_120a sparse decode render fits 99 KiB per block", "[nvrtc]") {
  kiln::sparse::register_sparse_family();
  const kiln::testing::TempDir dir("kiln_shared_budget");
  kiln::Config config;
  config.cache_dir = dir.path();
  kiln::KernelService service(config);
  namespace sp = kiln::sparse;
  for (const sp::SparsePolicy& policy : {sp::SparsePolicy{16, 1, true, true, sp::SparseKernel::kMmaSmall},
                                         sp::SparsePolicy{128, 1, false, false, sp::SparseKernel::kMmaSmall}}) {
    const kiln::SemanticKey key = policy.key("sm_120a");
    INFO(key.str());
    const std::uint64_t total = decode_static_shared(service, key) + kiln::sparse_decode_smem_bytes(1, true);
    CHECK(total <= kSm120BlockShared);
  }
  kiln::dsv41::register_dsv41_family();
  namespace ds = kiln::dsv41;
  for (const ds::Dsv41Policy& policy : {ds::Dsv41Policy{16, true, true, ds::Dsv41Variant::kDefault},
                                        ds::Dsv41Policy{128, false, false, ds::Dsv41Variant::kDefault}}) {
    const kiln::SemanticKey key = policy.key("sm_120a");
    INFO(key.str());
    const std::uint64_t total = decode_static_shared(service, key) + kiln::sparse_dsv41_small_smem_bytes();
    CHECK(total <= kSm120BlockShared);
  }
}
