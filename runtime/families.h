#pragma once
namespace kiln {
// Registers every family kiln ships with the JIT, so that keys and manifests can name them
// (idempotent). A family's own typed API registers that family on first use; this is for lookups by
// name: the CLI, manifests, printable keys.
void register_builtin_families();
}  // namespace kiln
