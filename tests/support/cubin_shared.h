#pragma once
// Static shared memory of a kernel in a cubin (the size of its .nv.shared.<mangled name> section),
// read from the ELF section headers, so tests can hold a render to a per-block budget without a GPU.
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::testing {

// The bytes a launch counts against the per-block budget (ptxas -v's "smem"); 0 when the kernel
// declares none. Cubins for sm_90 and later start the section with the block's 1 KiB of
// system-reserved shared memory, which the budget excludes; `arch` ("sm_90a") says which kind this
// is. Throws std::runtime_error for bytes that are not a 64-bit little-endian ELF.
std::uint64_t static_shared_bytes(std::string_view cubin, const std::string& mangled_kernel, std::string_view arch);

}  // namespace kiln::testing
