#pragma once
// Host-side checks of a view over a paged cache of fixed-size per-token records, read by a kernel
// that takes the page size and page stride at run time. Shared by the cache formats whose page
// holds its rows' data, then their scales (the DeepSeek-V4.1 FOOTER layout: 528-byte FP8 and
// 288-byte FP4 records), whatever view of the same bytes the caller passes.
#include <cstdint>
#include <string_view>

#include "kiln/runtime/tensor_view.h"

namespace kiln {

struct PagedCacheGeometry {
  std::int64_t pages = 0;
  std::int64_t page_size = 0;    // tokens per page
  std::int64_t page_stride = 0;  // bytes
};

// uint8 views of a cache of `record_bytes` per token, 16-byte aligned:
//   2-D [pages, page_bytes]: page_bytes a positive multiple of record_bytes, unit stride;
//   3-D [pages, page, record], HND [pages, 1, page, record] or NHD [pages, page, 1, record]: unit
//     last stride, rows of a page record_bytes apart (packed);
// every view: >= 1 page of >= 1 row, and a page stride (stride(0), bytes) that is a multiple of 16
// and at least page * record_bytes (padded pools pass). Throws Error (kInvalidArgument; kUnsupported
// for a page size past int32 offsets) naming `arg`; each message carries the refusal's upstream
// phrase ("528" / "multiple of 528", "singleton", "packed", "contiguous", "rank", "at least one
// page", "smaller than", "multiple of 16", "torch.uint8", "16-byte aligned").
PagedCacheGeometry check_record_cache(const TensorView& cache, std::string_view arg, int record_bytes);

}  // namespace kiln
