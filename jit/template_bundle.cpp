#include "kiln/jit/template_bundle.h"

#include <cstdint>
#include <string>

namespace kiln {

namespace generated {
// Defined in the file that CMake generates from kernel_templates/ (jit/embed_templates.cmake).
extern const EmbeddedFile kTemplates[];
extern const std::size_t kTemplateCount;
}  // namespace generated

std::span<const EmbeddedFile> embedded_templates() {
  return {generated::kTemplates, generated::kTemplateCount};
}

std::string_view template_bundle_bytes() {
  static const std::string kBytes = [] {
    std::string out;
    for (const EmbeddedFile& f : embedded_templates()) {
      for (const std::string_view part : {f.name, f.contents}) {
        const std::uint64_t n = part.size();
        out.append(reinterpret_cast<const char*>(&n), sizeof n);
        out.append(part);
      }
    }
    return out;
  }();
  return kBytes;
}

}  // namespace kiln
