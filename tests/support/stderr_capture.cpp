#include "tests/support/stderr_capture.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <system_error>

#include "tests/support/files.h"

namespace kiln::testing {

namespace fs = std::filesystem;

StderrCapture::StderrCapture() : file_(fs::temp_directory_path() / ("kiln_stderr_" + std::to_string(::getpid()))) {
  std::fflush(stderr);
  saved_ = ::dup(2);
  const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
}

StderrCapture::~StderrCapture() {
  restore();
  std::error_code ec;
  fs::remove(file_, ec);
}

std::string StderrCapture::text() {
  restore();
  return read_text(file_);
}

void StderrCapture::restore() {
  if (saved_ < 0) return;
  std::fflush(stderr);
  ::dup2(saved_, 2);
  ::close(saved_);
  saved_ = -1;
}

}  // namespace kiln::testing
