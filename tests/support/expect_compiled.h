#pragma once
// The shared step of the NVRTC family tests: build one key through a KernelService and check that a
// fresh, real cubin came out.
#include <nlohmann/json.hpp>

#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/kernel_service.h"

namespace kiln::testing {

// Builds `key` through `service`; a compile error FAILs the test with NVRTC's log. Checks that the
// artifact was compiled now (not found in a cache), is more than a stub (> 1000 bytes) and records
// `key`; returns its lowered kernel names (metadata "lowered_names") for the caller to check.
nlohmann::json expect_compiled(KernelService& service, const SemanticKey& key);

}  // namespace kiln::testing
