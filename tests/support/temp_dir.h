#pragma once
// A fresh directory under the system temp dir (mkdtemp), removed with everything in it when the
// object goes away.
#include <filesystem>
#include <string>
#include <string_view>

namespace kiln::testing {

class TempDir {
 public:
  // `prefix` names the directory, e.g. "kiln_cli_test" -> /tmp/kiln_cli_test.XXXXXX.
  explicit TempDir(std::string_view prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kiln::testing
