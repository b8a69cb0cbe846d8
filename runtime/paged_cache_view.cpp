#include "kiln/runtime/paged_cache_view.h"

#include <fmt/format.h>

#include <climits>

#include "kiln/runtime/validation.h"

namespace kiln {

PagedCacheGeometry check_record_cache(const TensorView& cache, std::string_view arg, const int record_bytes) {
  const std::int64_t bpt = record_bytes;
  {
    const auto phrase = [&] { return fmt::format("{} must be a CUDA tensor of dtype torch.uint8", arg); };
    const check::Phrase upstream(phrase);
    check::dtype(cache, arg, {DType::kU8});
  }
  {
    const auto phrase = [&] {
      return fmt::format("{} must be a {}-byte-record cache view of rank 2, 3 or 4, got rank {}", arg, bpt, cache.rank);
    };
    const check::Phrase upstream(phrase);
    check::rank(cache, arg, {2, 3, 4});
  }
  int row_dim = 1;
  if (cache.rank == 4) {
    if (cache.size(1) == 1) {
      row_dim = 2;  // HND [pages, 1, page, record]
    } else if (cache.size(2) != 1) {
      check::fail_as(fmt::format("{} 4-D view needs a singleton axis 1 (HND) or 2 (NHD)", arg), arg,
                     fmt::format("[pages, 1, page, {0}] or [pages, page, 1, {0}]", bpt), cache.shape_string());
    }
  }
  PagedCacheGeometry g{cache.size(0), 0, cache.stride(0)};
  if (cache.rank == 2) {
    const std::int64_t page_bytes = cache.size(1);
    if (page_bytes < 1 || page_bytes % bpt != 0) {
      check::fail_as(fmt::format("{} page bytes must be a positive multiple of {}, got {}", arg, bpt, page_bytes), arg,
                     fmt::format("[pages, page * {}] bytes", bpt), cache.shape_string());
    }
    g.page_size = page_bytes / bpt;
  } else {
    if (cache.size(-1) != bpt) {
      check::fail_as(fmt::format("{} must hold {}-byte records, got {}-byte rows", arg, bpt, cache.size(-1)), arg,
                     fmt::format("a last dimension of {}", bpt), cache.shape_string());
    }
    g.page_size = cache.size(row_dim);
  }
  if (cache.size(-1) > 1 && cache.stride(-1) != 1) {
    check::fail_as(fmt::format("{} byte dimension must be contiguous", arg), arg, "stride(-1) == 1",
                   fmt::format("{}", cache.stride(-1)));
  }
  if (cache.rank > 2 && g.page_size > 1 && cache.stride(row_dim) != bpt) {
    check::fail_as(fmt::format("{} rows must be packed inside a page (per-token stride {})", arg, bpt), arg,
                   fmt::format("per-token stride {}", bpt), fmt::format("{}", cache.stride(row_dim)));
  }
  if (g.pages < 1 || g.page_size < 1) {
    check::fail_as(fmt::format("{} must hold at least one page of at least one row", arg), arg, "pages >= 1 and page >= 1",
                   cache.shape_string());
  }
  if (g.page_size > INT_MAX / bpt) {
    check::unsupported(arg, fmt::format("page sizes up to {}", INT_MAX / bpt), fmt::format("page size {}", g.page_size));
  }
  const std::int64_t page_bytes = g.page_size * bpt;
  if (g.page_stride < page_bytes) {
    check::fail_as(fmt::format("{} page stride {} is smaller than its page of {} bytes", arg, g.page_stride, page_bytes), arg,
                   fmt::format("stride(0) >= page * {} = {}", bpt, page_bytes), fmt::format("{}", g.page_stride));
  }
  if (g.page_stride % 16 != 0) {
    check::fail_as(fmt::format("{} page stride must be a multiple of 16 bytes", arg), arg, "stride(0) % 16 == 0",
                   fmt::format("{}", g.page_stride));
  }
  check::not_null(cache, arg);
  {
    const auto phrase = [&] { return fmt::format("{} base must be 16-byte aligned", arg); };
    const check::Phrase upstream(phrase);
    check::aligned(cache, arg, 16);
  }
  return g;
}

}  // namespace kiln
