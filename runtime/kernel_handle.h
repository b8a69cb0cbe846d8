#pragma once
// A module loaded on one device, with its entry points and its companions' handles; immutable after
// warm-up.
#include <cuda.h>

#include <string>
#include <vector>

namespace kiln {

struct KernelFunction {
  CUfunction function = nullptr;
  std::string lowered_name;
  int registers = 0;
  int local_bytes = 0;        // per thread; non-zero means spills or a stack frame
  int static_smem_bytes = 0;
  int max_dynamic_smem_bytes = 0;  // what the attribute was raised to at warm-up
  int max_threads = 0;
};

struct KernelHandle {
  std::string key;  // printable semantic key
  int device = 0;
  CUmodule module = nullptr;
  std::vector<KernelFunction> functions;  // parallel to the KernelSource's name expressions
  // The handles of the family's companion keys (Family::companions, in order) on the same device,
  // owned by the service like this one.
  std::vector<const KernelHandle*> companions;

  const KernelFunction& entry(std::size_t i) const { return functions.at(i); }
  const KernelHandle& companion(std::size_t i) const { return *companions.at(i); }
};

}  // namespace kiln
