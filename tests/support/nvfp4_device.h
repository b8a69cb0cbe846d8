#pragma once
// What the GPU computes for the NVFP4 quantize rule where the rule names a hardware instruction whose
// result the CPU reference cannot derive: read from the device, for the GPU suites only.
#include "tests/support/nvfp4_reference.h"

namespace kiln::testing {

// rcp.approx.ftz.f32 (MUFU.RCP) of every non-zero E4M3 scale on device 0, the reciprocal upstream's
// writer (and kiln's writers and Q rounding) multiply by. Prints how many of the 126 differ from
// fp32(1/scale) the first time.
const Nvfp4Reciprocals& nvfp4_device_reciprocals();

}  // namespace kiln::testing
