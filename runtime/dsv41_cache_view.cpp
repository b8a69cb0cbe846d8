#include "kiln/runtime/dsv41_cache_view.h"

#include <fmt/format.h>

#include <climits>

#include "kiln/runtime/validation.h"

namespace kiln {

namespace {

std::string_view format_name(int record_bytes) { return record_bytes == 528 ? "FP8 (528-byte)" : "FP4 (288-byte)"; }

}  // namespace

Dsv41CacheGeometry check_dsv41_cache(const TensorView& cache, std::string_view arg, int record_bytes) {
  const auto what = [&] { return fmt::format("a DeepSeek-V4.1 {} cache view", format_name(record_bytes)); };
  if (cache.dtype != DType::kU8) {
    check::fail_as(fmt::format("{} must be a torch.uint8 tensor", arg), arg, what(), dtype_name(cache.dtype));
  }
  if (cache.rank < 2 || cache.rank > 4) {
    check::fail_as(fmt::format("{} must have rank 2, 3 or 4", arg), arg,
                   fmt::format("[P, page_bytes], [P, page, {0}], [P, 1, page, {0}] or [P, page, 1, {0}]", record_bytes),
                   fmt::format("rank {} (shape {})", cache.rank, cache.shape_string()));
  }
  const std::int64_t last = cache.size(-1);
  Dsv41CacheGeometry g{cache.size(0), 0, cache.stride(0)};
  int row_dim = -1;  // none for a 2-D view
  if (cache.rank == 2) {
    if (last < record_bytes || last % record_bytes != 0) {
      check::fail_as(fmt::format("{} page bytes must be a positive multiple of {}", arg, record_bytes), arg,
                     fmt::format("{} with page_bytes a multiple of {}", what(), record_bytes), fmt::format("shape {}", cache.shape_string()));
    }
    g.page_size = last / record_bytes;
  } else {
    if (last != record_bytes) {
      check::fail_as(fmt::format("{} must be a {}-byte-per-token cache, got last dimension {}", arg, record_bytes, last), arg,
                     fmt::format("{} (last dimension {})", what(), record_bytes), fmt::format("shape {}", cache.shape_string()));
    }
    row_dim = 1;
    if (cache.rank == 4) {
      if (cache.size(1) == 1) row_dim = 2;  // HND [P, 1, page, record]
      else if (cache.size(2) != 1) {
        check::fail_as(fmt::format("{} 4-D view must have a singleton head axis (HND or NHD)", arg), arg,
                       fmt::format("[P, 1, page, {0}] or [P, page, 1, {0}]", record_bytes), fmt::format("shape {}", cache.shape_string()));
      }
    }
    g.page_size = cache.size(row_dim);
  }
  if (cache.stride(-1) != 1) {
    check::fail_as(fmt::format("{} byte dimension must be contiguous", arg), arg, "stride(-1) == 1", fmt::format("{}", cache.stride(-1)));
  }
  if (row_dim >= 0 && g.page_size > 1 && cache.stride(row_dim) != record_bytes) {
    check::fail_as(fmt::format("{} rows must be packed inside a page (row stride {})", arg, record_bytes), arg,
                   fmt::format("row stride {}", record_bytes), fmt::format("row stride {}", cache.stride(row_dim)));
  }
  if (g.pages < 1 || g.page_size < 1) {
    check::fail_as(fmt::format("{} must have at least one page of at least one row", arg), arg, "num_pages >= 1 and page_size >= 1",
                   fmt::format("shape {}", cache.shape_string()));
  }
  if (g.page_size > INT_MAX / record_bytes) {  // byte offsets inside a page stay in int32
    check::unsupported(arg, fmt::format("page sizes up to {}", INT_MAX / record_bytes), fmt::format("page size {}", g.page_size));
  }
  const std::int64_t page_bytes = g.page_size * record_bytes;
  if (g.pages > 1 && g.page_stride < page_bytes) {  // one page: its stride is never used
    check::fail_as(fmt::format("{} page stride {} is smaller than the page ({} bytes)", arg, g.page_stride, page_bytes), arg,
                   fmt::format("a page stride >= page_size * {} = {}", record_bytes, page_bytes), fmt::format("{}", g.page_stride));
  }
  if (g.pages > 1 && g.page_stride % 16 != 0) {
    check::fail_as(fmt::format("{} page stride must be a multiple of 16 bytes", arg), arg, "a page stride that is a multiple of 16",
                   fmt::format("{}", g.page_stride));
  }
  check::not_null(cache, arg);
  if (reinterpret_cast<std::uintptr_t>(cache.data) % 16 != 0) {
    check::fail_as(fmt::format("{} must be 16-byte aligned", arg), arg, "a 16-byte aligned base",
                   fmt::format("address {:#x}", reinterpret_cast<std::uintptr_t>(cache.data)));
  }
  return g;
}

}  // namespace kiln
