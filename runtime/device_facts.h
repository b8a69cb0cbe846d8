#pragma once
// Facts of a device that a family's launches read from the driver beside KernelService's own (arch,
// limits): the sparse decodes' cluster residency. Reading them loads a probe module, which a CUDA
// graph capture would not survive, so KernelService::warm reads a key's family's facts before it
// hands out the key's handle: however a key is warmed, its first launch in a capture reads nothing.
#include <string_view>

namespace kiln {

class KernelService;
class SemanticKey;

// Reads (and caches, process-wide) what the family's launches will ask of `device`; throws Error.
using DeviceFactsReader = void (*)(KernelService& service, int device);

// A family's PolicySchema registers its reader when it registers the family; registering again replaces it.
void register_device_facts(std::string_view family, DeviceFactsReader read);

// Runs the reader of `key`'s family on `device`; nothing when the family registered none.
void read_device_facts(KernelService& service, const SemanticKey& key, int device);

}  // namespace kiln
