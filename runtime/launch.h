#pragma once
// The launch path every family shares: find the warm handle (acquire / warm_policy), then launch
// one of its entry points with cuLaunchKernelEx (launch). A family's launcher validates, plans,
// fills its Params and calls these; it never talks to the driver itself.
//
// A policy type used here provides `std::uint64_t fingerprint() const` (cheap, no strings),
// `void validate() const` and `SemanticKey key(std::string_view arch) const` (see
// runtime/policy_schema.h).
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "kiln/runtime/kernel_handle.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/launch_config.h"

namespace kiln {

// The driver's description of `config`'s geometry and shared memory on `stream`, without attributes
// (launch() adds programmatic serialization and cluster dimensions as `config` asks).
CUlaunchConfig driver_launch_config(const LaunchConfig& config, CUstream stream);

// Launches entry `entry` of `handle` on `stream` with `params` (a pointer to the kernel's one
// by-value parameter block). Checks the dynamic shared memory against what the device allows for
// that function (kUnsupported naming the key); a driver error throws kDriver naming the function.
// Allocates and formats nothing unless it throws.
void launch(const KernelHandle& handle, const LaunchConfig& config, const void* params, CUstream stream,
            std::size_t entry = 0);

template <class Params>
void launch(const KernelHandle& handle, const LaunchConfig& config, const Params& params, CUstream stream,
            std::size_t entry = 0) {
  static_assert(std::is_trivially_copyable_v<Params>, "kernel parameter blocks are copied bytewise by the driver");
  static_assert(!std::is_pointer_v<Params>, "pass the parameter block itself, not a pointer to it");
  launch(handle, config, static_cast<const void*>(&params), stream, entry);
}

// The handle of `policy` on `device` (the stream's: StreamDevice). A warm policy costs one hash
// lookup; otherwise the key is built and warmed (refused while `stream` is capturing: kNotWarm).
template <class Policy>
const KernelHandle& acquire(KernelService& service, const Policy& policy, CUstream stream, int device) {
  const auto make_key = [&service, &policy, device] { return policy.key(service.device_arch(device)); };
  // A std::function built from a reference_wrapper never allocates (its constructor is noexcept),
  // whatever the lambda's size: nothing is allocated on the launch path.
  return service.acquire(policy.fingerprint(), std::cref(make_key), stream, device);
}

// Builds and loads `policy` on each device (arch from the device) and primes acquire()'s fast path.
// A policy that no arch accepts is refused before any device is asked (so before any driver call).
template <class Policy>
void warm_policy(KernelService& service, const Policy& policy, const std::vector<int>& devices) {
  policy.validate();
  for (int device : devices) service.warm(policy.key(service.device_arch(device)), device, policy.fingerprint());
}

}  // namespace kiln
