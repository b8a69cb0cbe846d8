#include "kiln/runtime/manifest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "kiln/cache/file_lock.h"
#include "kiln/jit/arch.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/runtime/families.h"

namespace kiln {

namespace {

using nlohmann::json;

// A policy whose lists multiply past this is a mistake (or hostile input), not a key set to prebuild.
constexpr std::size_t kMaxPoliciesPerEntry = 10000;

Error manifest_error(std::string_view source, std::string_view what) {
  return Error(ErrorCode::kInvalidArgument, fmt::format("manifest {}: {}", source, what));
}

std::pair<std::size_t, std::size_t> line_column(std::string_view text, std::size_t byte) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < std::min(byte, text.size()); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

std::vector<std::string> archs_of(const json& node, std::string_view source, std::string_view where,
                                  const std::vector<std::string>& fallback) {
  if (!node.contains("archs")) return fallback;
  const json& a = node.at("archs");
  if (!a.is_array() || a.empty()) throw manifest_error(source, fmt::format("{}.archs must be a non-empty list", where));
  std::vector<std::string> out;
  for (const json& item : a) {
    if (!item.is_string()) throw manifest_error(source, fmt::format("{}.archs holds {}, not a string", where, json_text(item)));
    out.push_back(validate_arch(item.get<std::string>(), fmt::format("manifest {} {}.archs entry", source, where)));
  }
  return out;
}

// The fields of a policy, each as the list of values it takes (a scalar is a list of one); a value
// repeated in a list is kept once, since it names the same keys again.
std::vector<std::pair<std::string, std::vector<json>>> value_lists(const json& policy) {
  std::vector<std::pair<std::string, std::vector<json>>> fields;
  for (const auto& [field, value] : policy.items()) {
    std::vector<json> values;
    std::vector<std::string> seen;
    for (const json& v : value.is_array() ? value : json::array({value})) {
      std::string text = v.dump();
      if (std::find(seen.begin(), seen.end(), text) != seen.end()) continue;
      seen.push_back(std::move(text));
      values.push_back(v);
    }
    fields.emplace_back(field, std::move(values));
  }
  return fields;
}

// Cartesian product of the value lists, one policy at a time: a bad field fails on the first
// combination instead of after every combination was built.
template <typename Visit>
void for_each_policy(const std::vector<std::pair<std::string, std::vector<json>>>& fields, std::size_t index,
                     json& current, const Visit& visit) {
  if (index == fields.size()) {
    visit(current);
    return;
  }
  for (const json& v : fields[index].second) {
    current[fields[index].first] = v;
    for_each_policy(fields, index + 1, current, visit);
  }
}

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::kNotFound, fmt::format("cannot open manifest {}; check the path", file.string()),
                {.path = file.string()});
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

ManifestSelection select_manifest(std::string_view text, std::string_view source,
                                  const std::optional<std::vector<std::string>>& only_archs) {
  register_builtin_families();  // manifests name families
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    const auto [line, column] = line_column(text, e.byte == 0 ? 0 : e.byte - 1);
    std::string what = e.what();
    if (auto pos = what.find("syntax error"); pos != std::string::npos) what = what.substr(pos);
    throw manifest_error(source, fmt::format("line {}, column {}: {}", line, column, what));
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    throw manifest_error(source, e.what());
  }
  if (!doc.is_object()) throw manifest_error(source, "the top level must be a JSON object");
  for (const auto& [field, value] : doc.items()) {
    if (field != "archs" && field != "keys" && field != "policies" && field != "version" && field != "comment") {
      throw manifest_error(source, fmt::format("unknown field '{}'; expected archs, keys, policies", field));
    }
  }
  if (doc.contains("version") && doc["version"] != 1) {
    throw manifest_error(source, fmt::format("version {} is not one this kiln reads (it reads version 1)", doc["version"].dump()));
  }
  // The top-level list is still validated when --arch replaces it.
  const std::vector<std::string> manifest_archs = archs_of(doc, source, "top", {});
  const std::vector<std::string>& top_archs = only_archs ? *only_archs : manifest_archs;
  const auto requested = [&](const std::string& arch) {
    return std::find(only_archs->begin(), only_archs->end(), arch) != only_archs->end();
  };

  ManifestSelection out;
  std::vector<SemanticKey>& keys = out.keys;
  std::unordered_set<SemanticKey> listed;  // an entry may list 10^4 keys: no linear search per key
  const auto add = [&](SemanticKey k) {
    if (listed.insert(k).second) keys.push_back(std::move(k));
  };
  if (doc.contains("keys")) {
    if (!doc["keys"].is_array()) throw manifest_error(source, "keys must be a list of printable semantic keys");
    for (std::size_t i = 0; i < doc["keys"].size(); ++i) {
      const json& item = doc["keys"][i];
      if (!item.is_string()) throw manifest_error(source, fmt::format("keys[{}] is not a string", i));
      SemanticKey key = [&] {
        try {
          return SemanticKey::parse(item.get<std::string>());
        } catch (const Error& e) {
          throw manifest_error(source, fmt::format("keys[{}]: {}", i, e.message()));
        }
      }();
      if (only_archs && !requested(key.arch())) {
        out.skipped.push_back({fmt::format("keys[{}]", i), key.family(), {key.arch()}, 1});
      } else {
        add(std::move(key));
      }
    }
  }
  if (doc.contains("policies")) {
    if (!doc["policies"].is_array()) throw manifest_error(source, "policies must be a list");
    for (std::size_t i = 0; i < doc["policies"].size(); ++i) {
      const json& entry = doc["policies"][i];
      const std::string where = fmt::format("policies[{}]", i);
      if (!entry.is_object() || !entry.contains("family") || !entry["family"].is_string() ||
          !entry.contains("policy") || !entry["policy"].is_object()) {
        throw manifest_error(source, fmt::format("{} needs \"family\" (string) and \"policy\" (object)", where));
      }
      const std::vector<std::string> allowed = archs_of(entry, source, where, top_archs);
      std::vector<std::string> archs;
      for (const auto& arch : allowed) {
        if (!only_archs || !entry.contains("archs") || requested(arch)) archs.push_back(arch);
      }
      if (allowed.empty()) throw manifest_error(source, fmt::format("{} names no archs and the manifest has none", where));
      const auto fields = value_lists(entry["policy"]);
      std::size_t combinations = 1;
      for (const auto& [field, values] : fields) {
        // An empty list would expand the entry to no keys at all, silently.
        if (values.empty()) throw manifest_error(source, fmt::format("{}: field '{}' lists no values; give at least one", where, field));
        combinations *= values.size();
        if (combinations > kMaxPoliciesPerEntry) {
          throw manifest_error(source, fmt::format("{} expands to more than {} policies; split it into smaller entries",
                                                   where, kMaxPoliciesPerEntry));
        }
      }
      const std::string family = entry["family"].get<std::string>();
      // A skipped entry is still checked (family, fields, values) against the arch it names, so that a
      // manifest that prebuilds for one target is not broken for another.
      std::size_t expanded = 0;
      json current = json::object();
      for_each_policy(fields, 0, current, [&](const json& policy) {
        ++expanded;
        for (const auto& arch : archs.empty() ? std::vector<std::string>{allowed.front()} : archs) {
          try {
            SemanticKey key(family, policy, arch);
            if (!archs.empty()) add(std::move(key));
          } catch (const Error& e) {
            throw manifest_error(source, fmt::format("{} ({}): {}", where, json_text(policy), e.message()));
          }
        }
      });
      if (archs.empty()) out.skipped.push_back({where, family, allowed, expanded});
    }
  }
  return out;
}

std::vector<SemanticKey> parse_manifest(std::string_view text, std::string_view source,
                                        const std::optional<std::vector<std::string>>& only_archs) {
  return select_manifest(text, source, only_archs).keys;
}

ManifestSelection select_manifest_file(const std::filesystem::path& file,
                                       const std::optional<std::vector<std::string>>& only_archs) {
  return select_manifest(read_file(file), file.string(), only_archs);
}

std::vector<SemanticKey> load_manifest(const std::filesystem::path& file,
                                       const std::optional<std::vector<std::string>>& only_archs) {
  return select_manifest_file(file, only_archs).keys;
}

void append_to_manifest(const std::filesystem::path& file, const SemanticKey& key) {
  const FileLock lock(file.string() + ".lock");  // several processes may record misses at once
  json doc = json::object();
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) {
    doc = json::parse(read_file(file), nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object()) doc = json::object();  // an unreadable record is replaced, not fatal
  }
  json& list = doc["keys"];
  if (!list.is_array()) list = json::array();
  if (std::find(list.begin(), list.end(), key.str()) != list.end()) return;
  list.push_back(key.str());
  const std::string tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out) throw Error(ErrorCode::kCacheIo, "cannot write the miss manifest", {.path = tmp});
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    throw Error(ErrorCode::kCacheIo, fmt::format("cannot replace the miss manifest: {}", ec.message()),
                {.path = file.string()});
  }
}

}  // namespace kiln
