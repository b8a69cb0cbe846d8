#include "kiln/jit/semantic_key.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <charconv>

#include "kiln/jit/arch.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"

namespace kiln {

namespace {

std::string render_value(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_string()) return v.get<std::string>();
  throw Error(ErrorCode::kInternal, fmt::format("policy value {} is not an int, bool or string", json_text(v)));
}

nlohmann::json parse_value(std::string_view text) {
  if (text == "true") return true;
  if (text == "false") return false;
  long long n = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec == std::errc() && ptr == text.data() + text.size()) return n;
  return std::string(text);
}

std::string digest_of(std::string_view body) {
  return fmt::format("{:016x}", XXH3_64bits(body.data(), body.size()));
}

}  // namespace

SemanticKey::SemanticKey(std::string_view family, const nlohmann::json& policy, std::string_view arch)
    : family_(family), policy_(find_family(family).canonicalize(policy)), arch_(validate_arch(arch)) {
  std::string body = fmt::format("{}:{}:", family_, arch_);
  bool first = true;
  for (const auto& [field, value] : policy_.items()) {  // nlohmann::json objects iterate sorted
    const std::string text = render_value(value);
    if (text.find_first_of(":,= ") != std::string::npos || field.find_first_of(":,= ") != std::string::npos) {
      throw Error(ErrorCode::kInternal, fmt::format("policy field {}={} cannot be printed in a key", field, text));
    }
    body += fmt::format("{}{}={}", first ? "" : ",", field, text);
    first = false;
  }
  printable_ = body + ":" + digest_of(body);
}

SemanticKey SemanticKey::parse(std::string_view printable) {
  const auto bad = [&](std::string_view why) {
    return Error(ErrorCode::kInvalidArgument,
                 fmt::format("cannot parse semantic key '{}': {}; expected family:arch:field=value,...:digest",
                             printable, why));
  };
  const std::size_t last = printable.rfind(':');
  const std::size_t first = printable.find(':');
  const std::size_t second = first == std::string_view::npos ? first : printable.find(':', first + 1);
  if (first == std::string_view::npos || second == std::string_view::npos || second >= last) {
    throw bad("it needs four ':'-separated parts");
  }
  const std::string_view family = printable.substr(0, first);
  const std::string_view arch = printable.substr(first + 1, second - first - 1);
  const std::string_view fields = printable.substr(second + 1, last - second - 1);
  const std::string_view digest = printable.substr(last + 1);

  nlohmann::json policy = nlohmann::json::object();
  std::size_t pos = 0;
  while (pos < fields.size()) {
    const std::size_t end = std::min(fields.find(',', pos), fields.size());
    const std::string_view item = fields.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) throw bad(fmt::format("field '{}' is not name=value", item));
    policy[std::string(item.substr(0, eq))] = parse_value(item.substr(eq + 1));
    pos = end + 1;
  }
  SemanticKey key(family, policy, arch);
  if (key.str() != printable) {
    if (key.str().substr(0, key.str().rfind(':')) == printable.substr(0, last)) {
      throw bad(fmt::format("digest {} does not match the fields (expected {})", digest,
                            key.str().substr(key.str().rfind(':') + 1)));
    }
    throw bad(fmt::format("it is not in canonical form; the canonical key is {}", key.str()));
  }
  return key;
}

}  // namespace kiln
