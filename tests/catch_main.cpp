// Catch2 implementation for every suite (main lives in main.cpp, or in the gpu suite's own file).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
