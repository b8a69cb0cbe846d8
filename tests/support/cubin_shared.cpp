#include "tests/support/cubin_shared.h"

#include <cstring>
#include <stdexcept>

namespace kiln::testing {

namespace {

template <typename T>
T read_at(std::string_view bytes, std::uint64_t offset) {
  if (offset + sizeof(T) > bytes.size()) throw std::runtime_error("cubin: truncated ELF");
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

// "sm_90a" -> 90, "sm_120a" -> 120.
int sm_number(std::string_view arch) {
  int n = 0;
  for (std::size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) n = 10 * n + (arch[i] - '0');
  return n;
}

}  // namespace

std::uint64_t static_shared_bytes(std::string_view cubin, const std::string& mangled_kernel, std::string_view arch) {
  if (cubin.size() < 64 || cubin.substr(0, 4) != "\x7f" "ELF" || cubin[4] != 2 || cubin[5] != 1) {
    throw std::runtime_error("cubin: not a 64-bit little-endian ELF");
  }
  const std::uint64_t reserved = sm_number(arch) >= 90 ? 1024 : 0;
  const auto shoff = read_at<std::uint64_t>(cubin, 0x28);
  const auto shentsize = read_at<std::uint16_t>(cubin, 0x3a);
  const auto shnum = read_at<std::uint16_t>(cubin, 0x3c);
  const auto shstrndx = read_at<std::uint16_t>(cubin, 0x3e);
  const auto section = [&](std::uint64_t i) { return shoff + i * shentsize; };
  const auto strtab = read_at<std::uint64_t>(cubin, section(shstrndx) + 0x18);
  const std::string wanted = ".nv.shared." + mangled_kernel;
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::uint64_t name_at = strtab + read_at<std::uint32_t>(cubin, section(i));
    if (name_at >= cubin.size()) throw std::runtime_error("cubin: section name out of range");
    const std::string_view rest = cubin.substr(name_at);
    if (rest.substr(0, rest.find('\0')) != wanted) continue;
    const auto size = read_at<std::uint64_t>(cubin, section(i) + 0x20);
    return size > reserved ? size - reserved : 0;
  }
  return 0;
}

}  // namespace kiln::testing
