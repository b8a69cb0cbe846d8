#include "kiln/jit/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

#include "kiln/jit/error.h"

namespace kiln {

namespace {
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void register_family(std::unique_ptr<Family> family) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name(family->name());
  r.families.try_emplace(name, std::move(family));  // idempotent: a second registration is ignored
}

const Family& find_family(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.families.find(name);
  if (it == r.families.end()) {
    std::vector<std::string> known;
    for (const auto& [n, f] : r.families) known.push_back(n);
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("unknown kernel family '{}'; known families: {} (the families kiln ships are registered by "
                            "kiln::register_builtin_families(), runtime/families.h)",
                            name, fmt::join(known, ", ")));
  }
  return *it->second;
}

std::vector<SemanticKey> companion_keys(const SemanticKey& key) {
  return find_family(key.family()).companions(key.policy(), key.arch());
}

}  // namespace kiln
