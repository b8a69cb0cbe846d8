#pragma once
// A family's policy, declared once: each field's JSON name, default (or none: required) and rule.
// From that one declaration come JSON parsing (the SemanticKey canonicalisation), JSON printing,
// validation of a typed policy, the fast-path fingerprint and the jit Family that renders source.
//
// Each rule has one error code: outside the valid range is invalid input (kInvalidArgument),
// valid but not implemented is kUnsupported. A typed policy's errors read "argument 'heads': ...";
// a JSON policy's read "<family> policy: argument 'heads': ..." (type errors name the field too).
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/device_facts.h"

namespace kiln {

// The rule of one integer field (also used by launchers for the same value taken from a tensor).
struct IntRule {
  std::string_view expected;  // for messages: "1..128", "16, 32, 64 or 128"
  std::int64_t min = std::numeric_limits<std::int64_t>::min();  // valid range: outside is kInvalidArgument
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
  std::int64_t multiple_of = 1;                                 // valid only for multiples
  std::int64_t supported_max = std::numeric_limits<std::int64_t>::max();  // above is kUnsupported
  std::array<std::int64_t, 4> supported_values{};               // when [0] != 0: the only implemented values

  bool valid(std::int64_t v) const { return v >= min && v <= max && v % multiple_of == 0; }
  bool supported(std::int64_t v) const;
  // Throws check::fail / check::unsupported naming `arg`.
  void check(std::string_view arg, std::int64_t v) const;
};

enum class FieldKind { kInt, kBool, kEnum };

struct EnumName {
  std::string_view json;  // spelling in the policy JSON
  std::int64_t value;     // the C++ enumerator
};

template <class P>
struct PolicyField {
  std::string_view name;
  FieldKind kind = FieldKind::kInt;
  std::int64_t (*get)(const P&) = nullptr;
  void (*set)(P&, std::int64_t) = nullptr;
  std::optional<std::int64_t> default_value;  // none: the JSON policy must name the field
  IntRule rule;                               // kInt
  std::vector<EnumName> names;                // kEnum: every value the key can hold
  // kEnum: a typed value outside `names` (e.g. a DType the family does not take).
  ErrorCode other_code = ErrorCode::kInvalidArgument;
  std::string_view other_expected;
  std::string (*describe)(std::int64_t) = nullptr;  // how to print such a value
};

namespace schema_detail {
template <auto Member, class P>
std::int64_t get(const P& p) {
  return static_cast<std::int64_t>(p.*Member);
}
template <auto Member, class P>
void set(P& p, std::int64_t v) {
  using T = std::remove_cvref_t<decltype(p.*Member)>;
  p.*Member = static_cast<T>(v);
}
template <class T>
struct MemberOf;
template <class P, class T>
struct MemberOf<T P::*> {
  using Policy = P;
  using Type = T;
};
std::string describe_int(std::int64_t v);
// Canonical JSON of one field value.
nlohmann::json field_json(FieldKind kind, std::int64_t value, const std::vector<EnumName>& names);
// Reads one JSON value into an integer, throwing kInvalidArgument naming the field for a wrong type.
std::int64_t parse_value(std::string_view family, std::string_view field, FieldKind kind,
                         const std::vector<EnumName>& names, const nlohmann::json& v);
[[noreturn]] void unknown_field(std::string_view family, std::string_view field, const std::string& fields);
[[noreturn]] void missing_field(std::string_view family, std::string_view field, std::string_view expected);
[[noreturn]] void not_an_object(std::string_view family);
[[noreturn]] void rethrow_for_policy(std::string_view family, const Error& e);
[[noreturn]] void out_of_range(std::string_view family, std::string_view field, std::int64_t v);

// What every field declaration sets: its JSON name, kind and accessors of the policy member.
template <auto Member>
auto field_of(std::string_view name, FieldKind kind) {
  using P = typename MemberOf<decltype(Member)>::Policy;
  PolicyField<P> f;
  f.name = name;
  f.kind = kind;
  f.get = &get<Member, P>;
  f.set = &set<Member, P>;
  return f;
}
}  // namespace schema_detail

// Field declarations. Member is a pointer to the policy's data member, e.g. &MlaDecodePolicy::heads.
template <auto Member>
auto int_field(std::string_view name, IntRule rule, std::optional<std::int64_t> default_value = std::nullopt) {
  auto f = schema_detail::field_of<Member>(name, FieldKind::kInt);
  f.rule = rule;
  f.default_value = default_value;
  return f;
}

template <auto Member>
auto bool_field(std::string_view name, std::optional<bool> default_value = std::nullopt) {
  auto f = schema_detail::field_of<Member>(name, FieldKind::kBool);
  if (default_value) f.default_value = *default_value ? 1 : 0;
  return f;
}

// `other_code`, `other_expected` and `describe` report a typed value the JSON names do not cover.
template <auto Member>
auto enum_field(std::string_view name, std::vector<EnumName> names, std::optional<std::int64_t> default_value,
                ErrorCode other_code, std::string_view other_expected,
                std::string (*describe)(std::int64_t) = &schema_detail::describe_int) {
  auto f = schema_detail::field_of<Member>(name, FieldKind::kEnum);
  f.names = std::move(names);
  f.default_value = default_value;
  f.other_code = other_code;
  f.other_expected = other_expected;
  f.describe = describe;
  return f;
}

template <class P>
class PolicySchema {
 public:
  static constexpr std::size_t kMaxFields = 16;
  using Render = KernelSource (*)(const P&);
  using CrossCheck = void (*)(const P&);  // rules between fields, run after every field's own rule
  using Companions = std::vector<SemanticKey> (*)(const P&, std::string_view arch);  // Family::companions

  // `device_facts`: what the family's launches read from the driver beyond the device's limits
  // (device_facts.h), registered with the family so that every warm of its keys reads it.
  PolicySchema(std::string_view family, std::vector<PolicyField<P>> fields, Render render,
               CrossCheck cross_check = nullptr, Companions companions = nullptr, DeviceFactsReader device_facts = nullptr)
      : family_(family),
        fields_(std::move(fields)),
        render_(render),
        cross_check_(cross_check),
        companions_(companions),
        device_facts_(device_facts) {
    for (const auto& f : fields_) field_list_ += (field_list_.empty() ? "" : ", ") + std::string(f.name);
    tag_ = XXH3_64bits(family_.data(), family_.size());
  }

  const std::string& family() const { return family_; }

  // Every rule of every field, then the cross-field rules. Throws naming the field.
  void validate(const P& p) const {
    for (const auto& f : fields_) {
      const std::int64_t v = f.get(p);
      if (f.kind == FieldKind::kInt) {
        f.rule.check(f.name, v);
      } else if (f.kind == FieldKind::kEnum && !named(f, v)) {
        throw_other(f, v);
      }
    }
    if (cross_check_) cross_check_(p);
  }

  // A JSON policy (flat object) -> a validated policy; unnamed fields take their defaults.
  P parse(const nlohmann::json& policy) const {
    if (!policy.is_object()) schema_detail::not_an_object(family_);
    P p{};
    std::array<bool, kMaxFields> seen{};
    for (const auto& [key, value] : policy.items()) {
      const std::size_t i = index_of(key);
      if (i == fields_.size()) schema_detail::unknown_field(family_, key, field_list_);
      const auto& f = fields_[i];
      const std::int64_t v = schema_detail::parse_value(family_, f.name, f.kind, f.names, value);
      if (f.kind == FieldKind::kInt) {
        try {
          f.rule.check(f.name, v);  // before narrowing into the member's type
        } catch (const Error& e) {
          schema_detail::rethrow_for_policy(family_, e);
        }
      }
      f.set(p, v);
      if (f.get(p) != v) schema_detail::out_of_range(family_, f.name, v);  // did not fit the member
      seen[i] = true;
    }
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      if (seen[i]) continue;
      if (!fields_[i].default_value) {
        schema_detail::missing_field(family_, fields_[i].name, fields_[i].rule.expected);
      }
      fields_[i].set(p, *fields_[i].default_value);
    }
    try {
      validate(p);
    } catch (const Error& e) {
      schema_detail::rethrow_for_policy(family_, e);
    }
    return p;
  }

  nlohmann::json to_json(const P& p) const {
    nlohmann::json out = nlohmann::json::object();  // keys sorted: canonical
    for (const auto& f : fields_) out[std::string(f.name)] = schema_detail::field_json(f.kind, f.get(p), f.names);
    return out;
  }

  // The semantic key (validates). Registers the family with the jit on first use, so a library
  // user's typed policies work without any set-up call.
  SemanticKey key(const P& p, std::string_view arch) const {
    register_family();
    return SemanticKey(family_, to_json(p), arch);
  }

  // Cheap identity for KernelService::acquire's fast path: the family and every field's value.
  std::uint64_t fingerprint(const P& p) const noexcept {
    std::array<std::int64_t, kMaxFields> words{};
    for (std::size_t i = 0; i < fields_.size(); ++i) words[i] = fields_[i].get(p);
    return XXH3_64bits_withSeed(words.data(), fields_.size() * sizeof(std::int64_t), tag_);
  }

  KernelSource render(const P& p) const { return render_(p); }

  // Idempotent; runtime/families.cpp calls it for every family kiln ships.
  void register_family() const {
    std::call_once(registered_, [this] {
      kiln::register_family(std::make_unique<Adapter>(*this));
      if (device_facts_) register_device_facts(family_, device_facts_);
    });
  }

 private:
  class Adapter final : public Family {
   public:
    explicit Adapter(const PolicySchema& schema) : schema_(schema) {}
    std::string_view name() const override { return schema_.family(); }
    nlohmann::json canonicalize(const nlohmann::json& policy) const override {
      return schema_.to_json(schema_.parse(policy));
    }
    KernelSource render(const nlohmann::json& canonical_policy) const override {
      return schema_.render(schema_.parse(canonical_policy));
    }
    std::vector<SemanticKey> companions(const nlohmann::json& canonical_policy, std::string_view arch) const override {
      if (!schema_.companions_) return {};
      return schema_.companions_(schema_.parse(canonical_policy), arch);
    }

   private:
    const PolicySchema& schema_;
  };

  std::size_t index_of(std::string_view name) const {
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      if (fields_[i].name == name) return i;
    }
    return fields_.size();
  }
  static bool named(const PolicyField<P>& f, std::int64_t v) {
    for (const auto& n : f.names) {
      if (n.value == v) return true;
    }
    return false;
  }
  [[noreturn]] static void throw_other(const PolicyField<P>& f, std::int64_t v);

  std::string family_;
  std::vector<PolicyField<P>> fields_;
  Render render_;
  CrossCheck cross_check_;
  Companions companions_;
  DeviceFactsReader device_facts_;
  std::string field_list_;
  std::uint64_t tag_ = 0;
  mutable std::once_flag registered_;
};

namespace schema_detail {
[[noreturn]] void enum_violation(ErrorCode code, std::string_view field, std::string_view expected, const std::string& given);
}

template <class P>
void PolicySchema<P>::throw_other(const PolicyField<P>& f, std::int64_t v) {
  schema_detail::enum_violation(f.other_code, f.name, f.other_expected, f.describe(v));
}

}  // namespace kiln
