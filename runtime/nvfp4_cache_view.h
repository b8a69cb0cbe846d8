#pragma once
// Host-side checks of a view over a paged cache in the 384-byte NVFP4 format
// (kernel_templates/common/nvfp4_format.cuh), shared by the writer and the sparse decode.
#include <climits>
#include <cstdint>
#include <string_view>

#include "kiln/kernel_templates/common/nvfp4_format.cuh"
#include "kiln/runtime/paged_cache_view.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln {

using Nvfp4CacheGeometry = PagedCacheGeometry;

// What differs between the users of check_nvfp4_cache.
struct Nvfp4CacheRules {
  // The largest page size taken; a larger one is kUnsupported. The default keeps byte offsets
  // within a page in int32.
  std::int64_t max_page_size = INT_MAX / kNvfp4TokenBytes;
  // true, for a kernel that reads the page size at run time: the page size is checked as soon as
  // the layout is known (< 1 is invalid input, > max_page_size kUnsupported "page sizes up to N").
  // false, for a kernel whose key holds the page size: the page size is checked after every
  // stride, outside 1..max_page_size being kUnsupported.
  bool runtime_page_size = true;
};

// uint8 [P, page, 384], HND [P, 1, page, 384] or NHD [P, page, 1, 384]; unit stride in the token,
// tokens of a page 384 bytes apart, 16-byte aligned data, and a page stride that is a multiple of
// 16 and holds a whole page. Throws Error (kInvalidArgument or kUnsupported) naming `arg`.
Nvfp4CacheGeometry check_nvfp4_cache(const TensorView& cache, std::string_view arg, const Nvfp4CacheRules& rules = {});

}  // namespace kiln
