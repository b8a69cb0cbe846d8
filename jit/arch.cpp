#include "kiln/jit/arch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kiln/jit/error.h"

namespace kiln {

const std::vector<std::string>& supported_archs() {
  static const std::vector<std::string> kArchs = {"sm_90a", "sm_120a"};
  return kArchs;
}

std::string validate_arch(std::string_view arch, std::string_view what) {
  const auto& all = supported_archs();
  if (std::find(all.begin(), all.end(), arch) == all.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} '{}' is not a supported target; use one of {}", what, arch, fmt::join(all, ", ")));
  }
  return std::string(arch);
}

std::string arch_for_compute_capability(int major, int minor) {
  if (major == 9 && minor == 0) return "sm_90a";
  if (major == 12 && minor == 0) return "sm_120a";
  throw Error(ErrorCode::kUnsupported,
              fmt::format("compute capability {}.{} has no kiln target; supported: {}", major, minor,
                          fmt::join(supported_archs(), ", ")));
}

std::vector<std::string> parse_arch_list(std::string_view list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    const std::string_view item = list.substr(start, end - start);
    if (!item.empty()) {
      std::string arch = validate_arch(item, "--arch entry");
      if (std::find(out.begin(), out.end(), arch) == out.end()) out.push_back(std::move(arch));
    }
    start = end + 1;
  }
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "arch list is empty; give e.g. sm_90a,sm_120a");
  return out;
}

}  // namespace kiln
