#pragma once
// SemanticKey: what an engine asks for — family + canonical policy + exact arch.
// Printable form: "family:arch:field=value,...:digest" — every policy field (so it parses back) and a
// 16-hex XXH3-64 digest of the canonical content that catches typos and truncation.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace kiln {

class SemanticKey {
 public:
  // Canonicalises `policy` through the family and validates `arch`. Throws kInvalidArgument, or
  // kUnsupported for a well-formed policy value kiln does not implement (the family's rule says which).
  SemanticKey(std::string_view family, const nlohmann::json& policy, std::string_view arch);

  // Parses a printable key; the digest must match. Throws as the constructor does, saying what is wrong.
  static SemanticKey parse(std::string_view printable);

  const std::string& family() const { return family_; }
  const nlohmann::json& policy() const { return policy_; }
  const std::string& arch() const { return arch_; }
  const std::string& str() const { return printable_; }

  SemanticKey with_arch(std::string_view arch) const { return SemanticKey(family_, policy_, arch); }

  friend bool operator==(const SemanticKey& a, const SemanticKey& b) { return a.printable_ == b.printable_; }

 private:
  std::string family_;
  nlohmann::json policy_;
  std::string arch_;
  std::string printable_;
};

}  // namespace kiln

template <>
struct std::hash<kiln::SemanticKey> {
  std::size_t operator()(const kiln::SemanticKey& k) const noexcept { return std::hash<std::string>()(k.str()); }
};
