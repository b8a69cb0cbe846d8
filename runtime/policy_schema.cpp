#include "kiln/runtime/policy_schema.h"

#include <fmt/format.h>

#include "kiln/runtime/validation.h"

namespace kiln {

bool IntRule::supported(std::int64_t v) const {
  if (v > supported_max) return false;
  if (supported_values[0] == 0) return true;
  for (std::int64_t s : supported_values) {
    if (s != 0 && s == v) return true;
  }
  return false;
}

void IntRule::check(std::string_view arg, std::int64_t v) const {
  if (!valid(v)) check::fail(arg, expected, fmt::format("{}", v));
  if (!supported(v)) check::unsupported(arg, expected, fmt::format("{}", v));
}

namespace schema_detail {

using nlohmann::json;

std::string describe_int(std::int64_t v) { return fmt::format("{}", v); }

json field_json(FieldKind kind, std::int64_t value, const std::vector<EnumName>& names) {
  switch (kind) {
    case FieldKind::kInt: return value;
    case FieldKind::kBool: return value != 0;
    case FieldKind::kEnum:
      for (const auto& n : names) {
        if (n.value == value) return std::string(n.json);
      }
      break;
  }
  throw Error(ErrorCode::kInternal, "policy field value without a JSON name (validate first)");
}

namespace {
[[noreturn]] void bad_type(std::string_view family, std::string_view field, std::string_view expected, const json& given) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{} policy field '{}' must be {}, got {}", family, field, expected, json_text(given)));
}
}  // namespace

std::int64_t parse_value(std::string_view family, std::string_view field, FieldKind kind,
                         const std::vector<EnumName>& names, const json& v) {
  switch (kind) {
    case FieldKind::kInt:
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX)) {
        bad_type(family, field, "an integer", v);
      }
      return v.get<std::int64_t>();
    case FieldKind::kBool:
      if (!v.is_boolean()) bad_type(family, field, "true or false", v);
      return v.get<bool>() ? 1 : 0;
    case FieldKind::kEnum: {
      std::string expected;
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (v.is_string() && v.get<std::string>() == names[i].json) return names[i].value;
        expected += fmt::format("{}\"{}\"", i == 0 ? "" : i + 1 == names.size() ? " or " : ", ", names[i].json);
      }
      bad_type(family, field, expected, v);
    }
  }
  throw Error(ErrorCode::kInternal, "unknown policy field kind");
}

void unknown_field(std::string_view family, std::string_view field, const std::string& fields) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{} policy has no field '{}'; fields: {}", family, field, fields));
}

void missing_field(std::string_view family, std::string_view field, std::string_view expected) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{} policy needs field '{}' ({})", family, field, expected));
}

void not_an_object(std::string_view family) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{} policy must be a JSON object", family));
}

void rethrow_for_policy(std::string_view family, const Error& e) {
  throw Error(e.code(), fmt::format("{} policy: {}", family, e.message()), e.details());
}

void out_of_range(std::string_view family, std::string_view field, std::int64_t v) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{} policy field '{}' is out of range: {}", family, field, v));
}

void enum_violation(ErrorCode code, std::string_view field, std::string_view expected, const std::string& given) {
  if (code == ErrorCode::kUnsupported) check::unsupported(field, expected, given);
  check::fail(field, expected, given);
}

}  // namespace schema_detail
}  // namespace kiln
