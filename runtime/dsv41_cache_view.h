#pragma once
// Host-side checks of a view over a DeepSeek-V4.1 paged cache, FOOTER layout (528 B FP8 main or
// 288 B FP4 extra records; kernel_templates/common/dsv41_format.cuh). Written for every user of
// these caches: the cache writers and the sparse decode.
#include <cstdint>
#include <string_view>

#include "kiln/runtime/tensor_view.h"

namespace kiln {

struct Dsv41CacheGeometry {
  std::int64_t pages = 0;
  std::int64_t page_size = 0;    // rows per page
  std::int64_t page_stride = 0;  // bytes
};

// Accepted views (uint8, base 16-byte aligned):
//   2-D [P, page_bytes], page_bytes a positive multiple of the record, page_size = page_bytes / record;
//   3-D [P, page, record], HND [P, 1, page, record], NHD [P, page, 1, record], rows packed
//   (row stride == record);
// the byte dimension contiguous, at least one page of at least one row, and (with more than one
// page) a page stride that is a multiple of 16 and holds a whole page. `record_bytes` is 528 or
// 288. Throws Error(kInvalidArgument) naming `arg`, with the phrase FlashInfer's refusal carries;
// a page of more than INT_MAX / record_bytes rows is kUnsupported (in-page offsets are int32).
Dsv41CacheGeometry check_dsv41_cache(const TensorView& cache, std::string_view arg, int record_bytes);

}  // namespace kiln
