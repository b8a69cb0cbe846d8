#pragma once
// Redirects fd 2 into a file while alive, so a test can count kiln's warnings.
#include <filesystem>
#include <string>

namespace kiln::testing {

class StderrCapture {
 public:
  StderrCapture();
  ~StderrCapture();
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  // Restores fd 2 and returns what was written meanwhile.
  std::string text();

 private:
  void restore();
  std::filesystem::path file_;
  int saved_ = -1;
};

}  // namespace kiln::testing
