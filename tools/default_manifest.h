#pragma once
#include <string_view>
namespace kiln::tools {
// The keys `kiln prebuild` builds when no --manifest is given: what a DeepSeek server warms.
std::string_view default_manifest();
// The sparse_dsv41 policy entries (a JSON fragment: two objects of a "policies" list, with a leading
// newline) that default_manifest() holds once kDefaultHasDsv41 (default_manifest.cpp) is set.
std::string_view dsv41_default_policies();
}  // namespace kiln::tools
