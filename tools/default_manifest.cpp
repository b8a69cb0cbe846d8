#include "tools/default_manifest.h"

namespace kiln::tools {

std::string_view default_manifest() {
  return R"json({
  "comment": "kiln's default prebuild set",
  "archs": ["sm_90a", "sm_120a"],
  "policies": [
    {"family": "nvfp4_writer", "policy": {"op": ["pack", "append"], "page_size": [2, 32, 64, 128]}}
  ]
}
)json";
}

}  // namespace kiln::tools
