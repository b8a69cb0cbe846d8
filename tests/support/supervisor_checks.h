#pragma once
// What the multi-process supervisors (tests/stress, tests/remote) share: a check that prints its
// verdict and counts failures, and the text helpers their log scans use. Header-only: the stress
// supervisor links no test support library.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::testing::supervisor {

// Failed checks so far; the supervisor's exit status.
inline int& failures() {
  static int count = 0;
  return count;
}

inline void check(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures();
}

// The file's bytes; "" when it cannot be opened (a log a killed worker never wrote).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::size_t count_occurrences(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (std::size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// "1,2,3"
inline std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

}  // namespace kiln::testing::supervisor
