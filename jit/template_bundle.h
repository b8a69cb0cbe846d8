#pragma once
// The kernel_templates/ tree, embedded into the library at build time (never read from disk).
#include <span>
#include <string_view>

namespace kiln {

struct EmbeddedFile {
  std::string_view name;      // path relative to kernel_templates/, e.g. "common/numeric.cuh"
  std::string_view contents;
};

// Sorted by name, so the bundle bytes do not depend on file-system order.
std::span<const EmbeddedFile> embedded_templates();

// Every name and byte of the bundle, length-prefixed: part of every CacheKey, so editing any template
// invalidates old cubins.
std::string_view template_bundle_bytes();

}  // namespace kiln
