#include "runtime/families.h"

#include "runtime/nvfp4_writer/writer.h"

namespace kiln {

void register_builtin_families() { nvfp4::register_writer_family(); }

}  // namespace kiln
