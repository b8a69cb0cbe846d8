#pragma once
// How many thread-block clusters of one-SM CTAs a GPU runs at once, by cluster size. A cluster must
// fit in one GPC and GPCs differ in size, so the count is not sms / size; the driver knows it
// (cuOccupancyMaxActiveClusters), and planners take the answer as a plain value.
#include <array>

namespace kiln {

inline constexpr int kMaxResidentClusterSize = 8;  // the portable cluster size

struct ClusterResidency {
  // clusters[n]: resident clusters of n CTAs, each alone on its SM (n = 1..8; [0] unused).
  std::array<int, kMaxResidentClusterSize + 1> clusters{};
  int operator[](int n) const { return clusters[n]; }
  bool operator==(const ClusterResidency&) const = default;
};

// The counts for `device`, read from the driver once per device (later calls read a cache and
// allocate nothing): cuOccupancyMaxActiveClusters for a probe kernel of `threads` threads whose
// `smem_bytes` of dynamic shared memory leave room for one CTA per SM. Throws Error(kDriver) without
// a driver or when the device cannot launch clusters (compute capability < 9.0).
const ClusterResidency& device_cluster_residency(int device, unsigned threads, unsigned smem_bytes);

}  // namespace kiln
