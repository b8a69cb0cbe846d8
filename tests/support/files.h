#pragma once
// Whole-file reads and writes for tests.
#include <filesystem>
#include <string>
#include <string_view>

namespace kiln::testing {

// The file's bytes; "" when it cannot be opened.
std::string read_text(const std::filesystem::path& file);

// Replaces the file's contents with `bytes`; REQUIREs that the write succeeded.
void write_text(const std::filesystem::path& file, std::string_view bytes);

}  // namespace kiln::testing
