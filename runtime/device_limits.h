#pragma once
// What a planner needs to know about a GPU. The kernel service reads it from the driver once per
// device (KernelService::device_limits); planners take it as a plain value, so they stay pure
// functions that tests can call for any GPU without one.

namespace kiln {

struct DeviceLimits {
  int sm_count = 0;
  int smem_per_sm = 0;               // bytes of shared memory per SM (resident blocks share it)
  int smem_per_block_optin = 0;      // the most dynamic + static shared memory one block may use
  int smem_reserved_per_block = 0;   // bytes the driver reserves per resident block
};

}  // namespace kiln
