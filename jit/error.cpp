#include "kiln/jit/error.h"

#include <fmt/format.h>

namespace kiln {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCompileFailed: return "compile_failed";
    case ErrorCode::kCacheCorrupt: return "cache_corrupt";
    case ErrorCode::kCacheIo: return "cache_io";
    case ErrorCode::kDriver: return "driver";
    case ErrorCode::kNotWarm: return "not_warm";
    case ErrorCode::kSealed: return "sealed";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

namespace {
std::string compose(ErrorCode code, const std::string& message, const ErrorDetails& d) {
  std::string text = fmt::format("kiln [{}]: {}", error_code_name(code), message);
  if (!d.key.empty()) text += fmt::format(" (key {})", d.key);
  if (!d.path.empty()) text += fmt::format(" (path {})", d.path);
  return text;
}
}  // namespace

Error::Error(ErrorCode code, const std::string& message, ErrorDetails details)
    : std::runtime_error(compose(code, message, details)), code_(code), message_(message), details_(std::move(details)) {}

}  // namespace kiln
