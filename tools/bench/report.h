#pragma once
#include <nlohmann/json.hpp>
#include <string>
namespace kiln::tools {
// Machine, driver, GPU, commit ($KILN_COMMIT or git) and UTC date, the header of every bench report.
nlohmann::json bench_header(const std::string& what);
// Prints the report and writes it to `path` when non-empty.
void write_report(const nlohmann::json& report, const std::string& path);
}  // namespace kiln::tools
