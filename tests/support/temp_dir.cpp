#include "tests/support/temp_dir.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <system_error>

namespace kiln::testing {

namespace fs = std::filesystem;

TempDir::TempDir(std::string_view prefix) {
  std::string tmpl = (fs::temp_directory_path() / (std::string(prefix) + ".XXXXXX")).string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace kiln::testing
