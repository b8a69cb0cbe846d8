#pragma once
#include <string>
#include <vector>

namespace kiln {

// A few lines of CUDA that include one family header and name its template specialisations.
// Every knob is a template argument inside `name_expressions`; nothing is pasted into code.
struct KernelSource {
  std::string source;
  std::vector<std::string> name_expressions;  // one per entry point of the module, in a fixed order
};

}  // namespace kiln
