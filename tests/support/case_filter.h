#pragma once
// Running part of a conformance matrix, for a sanitizer or profiler run over one case: under
// KILN_TEST_CASES=TEXT only the cases whose label contains TEXT run (each keeps its index, so its
// seed and inputs are the ones of a full run). The selection is printed, and a filter that matches
// nothing fails the test rather than letting it pass without running a case.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace kiln::testing {

template <class Case>
std::vector<std::size_t> selected_cases(const std::vector<Case>& cases, const char* suite) {
  std::vector<std::size_t> picked;
  const char* filter = std::getenv("KILN_TEST_CASES");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (filter == nullptr || !*filter || cases[i].label().find(filter) != std::string::npos) picked.push_back(i);
  }
  if (filter != nullptr && *filter) {
    std::printf("%s: KILN_TEST_CASES=\"%s\" selects %zu of %zu cases\n", suite, filter, picked.size(), cases.size());
    REQUIRE(!picked.empty());
  }
  return picked;
}

}  // namespace kiln::testing
