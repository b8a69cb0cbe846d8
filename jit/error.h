#pragma once
// kiln's one exception type: a code, a message that says what to do, and details.
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

enum class ErrorCode {
  kInvalidArgument,  // the caller passed something the contract forbids
  kUnsupported,      // valid request that kiln does not implement
  kCompileFailed,    // NVRTC rejected the rendered source
  kCacheCorrupt,     // an on-disk entry failed parsing or its checksum
  kCacheIo,          // the cache directory could not be read or written
  kDriver,           // the CUDA driver is missing or returned an error
  kNotWarm,          // a launch needed a kernel that was never warmed (e.g. during capture)
  kSealed,           // the service is sealed and refuses to compile or load
  kNotFound,         // a key, file or entry named by the caller does not exist
  kInternal,         // a bug in kiln
};

std::string_view error_code_name(ErrorCode code);

struct ErrorDetails {
  std::string key;   // semantic key (printable form) or cache key, when one is involved
  std::string path;  // file or directory involved
  std::string log;   // compiler log or driver message
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, ErrorDetails details = {});

  ErrorCode code() const noexcept { return code_; }
  // The message as given, without what()'s "kiln [code]: " prefix and details: for wrapping it in
  // another Error's message.
  const std::string& message() const noexcept { return message_; }
  const ErrorDetails& details() const noexcept { return details_; }

 private:
  ErrorCode code_;
  std::string message_;
  ErrorDetails details_;
};

}  // namespace kiln
