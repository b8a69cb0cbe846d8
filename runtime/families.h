#pragma once
namespace kiln {
// Registers every family kiln ships (idempotent). KernelService::global() calls it; so do tools.
void register_builtin_families();
}  // namespace kiln
