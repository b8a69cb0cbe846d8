// The device facts KernelService::warm reads before it hands out a handle (runtime/device_facts.h):
// which family's reader runs, and that both sparse families have one, so that warming one of their
// keys by any route leaves a capture's first launch nothing to read from the driver.
#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/device_facts.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "tests/support/expect_error.h"
#include "tests/support/temp_dir.h"

namespace {

// A family with one empty policy; only its name matters here.
class NamedFamily final : public kiln::Family {
 public:
  explicit NamedFamily(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  nlohmann::json canonicalize(const nlohmann::json&) const override { return nlohmann::json::object(); }
  kiln::KernelSource render(const nlohmann::json&) const override { return {}; }

 private:
  std::string name_;
};

kiln::SemanticKey key_of(const std::string& family) {
  kiln::register_family(std::make_unique<NamedFamily>(family));  // idempotent
  return kiln::SemanticKey(family, nlohmann::json::object(), "sm_90a");
}

// What the readers saw: (which reader, device). A reader is a plain function pointer, so it records here.
std::vector<std::pair<char, int>> g_reads;

kiln::Config config_in(const kiln::testing::TempDir& dir) {
  kiln::Config c;  // not from_environment: the test decides every setting
  c.cache_dir = dir.path();
  c.log_level = kiln::LogLevel::kError;
  return c;
}

}  // namespace

TEST_CASE("device facts: the key's own family's reader runs, for the key's device, and no other family's", "[unit]") {
  g_reads.clear();
  const kiln::SemanticKey with_reader = key_of("kiln_test_facts_a");
  const kiln::SemanticKey without = key_of("kiln_test_facts_b");
  kiln::register_device_facts("kiln_test_facts_a", [](kiln::KernelService&, int device) { g_reads.emplace_back('a', device); });
  const kiln::testing::TempDir dir("kiln_device_facts_test");
  kiln::KernelService service(config_in(dir));

  kiln::read_device_facts(service, with_reader, 3);
  kiln::read_device_facts(service, without, 1);
  CHECK(g_reads == std::vector<std::pair<char, int>>{{'a', 3}});

  // Registering the family again replaces its reader.
  kiln::register_device_facts("kiln_test_facts_a", [](kiln::KernelService&, int device) { g_reads.emplace_back('A', device); });
  kiln::read_device_facts(service, with_reader, 0);
  CHECK(g_reads == std::vector<std::pair<char, int>>{{'a', 3}, {'A', 0}});
}

TEST_CASE("device facts: both sparse families read the GPU (cluster residency), MLA and the writer nothing", "[unit]") {
  if (kiln::Driver::get().available()) {
    WARN("skipped: this machine has a CUDA driver, so the readers would succeed (the gpu suite's first-call cases cover that)");
    return;
  }
  // No register_builtin_families: a typed policy's key registers its family, reader included, as
  // an engine that only calls warm_sparse or KernelService::warm relies on (ctest runs each case
  // in a process of its own). Without a driver a reader that asks the GPU fails with kDriver; a
  // family without one does not throw.
  const kiln::testing::TempDir dir("kiln_device_facts_test");
  kiln::KernelService service(config_in(dir));
  for (const kiln::SemanticKey& key : {kiln::sparse::SparsePolicy{}.key("sm_90a"), kiln::dsv41::Dsv41Policy{}.key("sm_90a")}) {
    INFO(key.str());
    const kiln::Error e = kiln::testing::expect_error([&] { kiln::read_device_facts(service, key, 0); });
    CHECK(e.code() == kiln::ErrorCode::kDriver);
  }
  kiln::mla::MlaDecodePolicy mla;
  mla.heads = 128;
  mla.max_seq_len = 4096;
  CHECK_NOTHROW(kiln::read_device_facts(service, mla.key("sm_90a"), 0));
  CHECK_NOTHROW(kiln::read_device_facts(service, kiln::nvfp4::WriterPolicy{kiln::nvfp4::WriterOp::kAppend, 64}.key("sm_90a"), 0));
}
