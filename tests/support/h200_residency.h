#pragma once
// Test data for the launch planners: the H200's resident clusters of one-SM CTAs (132 SMs,
// cuOccupancyMaxActiveClusters for 1..8 CTAs of 200+ KB; the GPU suite checks the driver still says
// so), scaled to `sms` as a stand-in for other SM counts.
#include "kiln/runtime/cluster_residency.h"

namespace kiln::testing {

inline ClusterResidency h200_residency(int sms = 132) {
  constexpr int kH200[] = {0, 132, 66, 39, 30, 22, 17, 15, 15};
  ClusterResidency r;
  for (int n = 1; n <= kMaxResidentClusterSize; ++n) r.clusters[n] = kH200[n] * sms / 132;
  return r;
}

}  // namespace kiln::testing
