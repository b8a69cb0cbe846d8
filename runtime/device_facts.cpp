#include "kiln/runtime/device_facts.h"

#include <map>
#include <mutex>
#include <string>

#include "kiln/jit/semantic_key.h"

namespace kiln {

namespace {

struct Readers {
  std::mutex mutex;
  std::map<std::string, DeviceFactsReader, std::less<>> by_family;
};

Readers& readers() {
  static Readers r;
  return r;
}

}  // namespace

void register_device_facts(std::string_view family, DeviceFactsReader read) {
  Readers& r = readers();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.by_family.insert_or_assign(std::string(family), read);
}

void read_device_facts(KernelService& service, const SemanticKey& key, int device) {
  DeviceFactsReader read = nullptr;
  {
    Readers& r = readers();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (const auto it = r.by_family.find(key.family()); it != r.by_family.end()) read = it->second;
  }
  if (read) read(service, device);
}

}  // namespace kiln
