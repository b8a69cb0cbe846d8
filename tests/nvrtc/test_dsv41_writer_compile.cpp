// The DeepSeek-V4.1 cache writers compile under NVRTC for both target archs (no GPU): every key of
// the family (two formats x two ops) on sm_90a and sm_120a, each with its entry points in order.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kiln/jit/build_request.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/dsv41_writer/writer.h"
#include "kiln/runtime/kernel_service.h"
#include "tests/support/expect_compiled.h"
#include "tests/support/temp_dir.h"

namespace dw = kiln::dsv41;

TEST_CASE("dsv41_writer compiles every key for sm_90a and sm_120a", "[nvrtc]") {
  dw::register_writer_family();
  const kiln::testing::TempDir dir("kiln_dsv41_writer_nvrtc");
  kiln::Config config;
  config.cache_dir = dir.path();
  kiln::KernelService service(config);
  int compiled = 0;
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    for (const dw::CacheFormat format : {dw::CacheFormat::kFp8, dw::CacheFormat::kFp4}) {
      for (const dw::WriterOp op : {dw::WriterOp::kPack, dw::WriterOp::kAppend}) {
        const kiln::SemanticKey key = dw::WriterPolicy{format, op}.key(arch);
        INFO(key.str());
        // The render names the format's element width as the template argument; no fast math.
        const kiln::BuildRequest request = kiln::make_build_request(key);
        const std::string bits = format == dw::CacheFormat::kFp8 ? "<8>" : "<4>";
        for (const auto& name : request.source.name_expressions) CHECK(name.find(bits) != std::string::npos);
        for (const auto& option : request.options) CHECK(option.find("fast") == std::string::npos);
        const nlohmann::json lowered = kiln::testing::expect_compiled(service, key);
        // The row loops both writer families share, over this family's format; the claim is its own.
        const auto names = [&](std::size_t i, std::string_view kernel, std::string_view format) {
          const std::string name = lowered[i].get<std::string>();
          CHECK(name.find(kernel) != std::string::npos);
          CHECK(name.find(format) != std::string::npos);
        };
        if (op == dw::WriterOp::kPack) {
          REQUIRE(lowered.size() == 1u);
          names(0, "writer_pack_kernel", "Dsv41WriterFormat");
        } else {
          REQUIRE(lowered.size() == 3u);
          names(0, "writer_append_scan_kernel", "Dsv41WriterFormat");
          names(1, "dsv41_append_claim_kernel", "Dsv41WriterParams");
          names(2, "writer_append_write_kernel", "Dsv41WriterFormat");
        }
        ++compiled;
      }
    }
  }
  CHECK(compiled == 8);
  CHECK(service.counters().compiles == 8u);
}
