#include "kiln/runtime/families.h"

#include "kiln/runtime/dsv41_writer/writer.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_nvfp4/family.h"

namespace kiln {

// The one place that knows which families kiln ships: a new family adds one line here.
void register_builtin_families() {
  nvfp4::register_writer_family();
  mla::register_mla_family();  // and mla_combine
  sparse::register_sparse_family();  // and sparse_merge
  dsv41::register_dsv41_family();
  dsv41::register_writer_family();
}

}  // namespace kiln
