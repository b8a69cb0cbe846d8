#pragma once
#include <string_view>
namespace kiln::tools {
// The keys `kiln prebuild` builds when no --manifest is given: what a DeepSeek server warms.
std::string_view default_manifest();
}  // namespace kiln::tools
