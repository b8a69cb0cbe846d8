#pragma once
// Exact target architectures kiln compiles for ("sm_90a", "sm_120a"): the arch-specific "a" targets,
// because the kernels use instructions (wgmma, setmaxnreg) that only those expose.
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

const std::vector<std::string>& supported_archs();

// Throws Error(kInvalidArgument) naming `what` and listing the supported archs.
std::string validate_arch(std::string_view arch, std::string_view what = "arch");

// Compute capability -> exact arch, e.g. (9, 0) -> "sm_90a". Throws kUnsupported for others.
std::string arch_for_compute_capability(int major, int minor);

// Comma-separated list ("sm_90a,sm_120a") -> validated archs.
std::vector<std::string> parse_arch_list(std::string_view list);

}  // namespace kiln
