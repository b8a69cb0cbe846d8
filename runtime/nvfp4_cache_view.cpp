#include "kiln/runtime/nvfp4_cache_view.h"

#include <fmt/format.h>

#include "kiln/runtime/validation.h"

namespace kiln {

Nvfp4CacheGeometry check_nvfp4_cache(const TensorView& cache, std::string_view arg, const Nvfp4CacheRules& rules) {
  check::dtype(cache, arg, {DType::kU8});
  check::rank(cache, arg, {3, 4});
  check::dim(cache, arg, -1, kNvfp4TokenBytes);
  int row_dim = 1;
  if (cache.rank == 4) {
    if (cache.size(1) == 1) row_dim = 2;  // HND [P, 1, page, 384]
    else if (cache.size(2) != 1) check::fail(arg, "[P, page, 384], HND [P, 1, page, 384] or NHD [P, page, 1, 384]", cache.shape_string());
  }
  const Nvfp4CacheGeometry g{cache.size(0), cache.size(row_dim), cache.stride(0)};
  check::unit_stride(cache, arg, -1);
  if (rules.runtime_page_size) {
    if (g.page_size < 1) check::fail(arg, "a page size >= 1", fmt::format("shape {}", cache.shape_string()));
    if (g.page_size > rules.max_page_size) {
      check::unsupported(arg, fmt::format("page sizes up to {}", rules.max_page_size), fmt::format("page size {}", g.page_size));
    }
  }
  if (g.page_size > 1 && cache.stride(row_dim) != kNvfp4TokenBytes) {
    check::fail(arg, "pages whose page_size * 384 bytes are contiguous (token stride 384)",
                fmt::format("token stride {}", cache.stride(row_dim)));
  }
  check::not_null(cache, arg);
  check::aligned(cache, arg, 16);
  if (g.pages > 1 && (g.page_stride % 16 != 0 || g.page_stride < g.page_size * kNvfp4TokenBytes)) {  // one page: its stride is never used
    check::fail(arg, fmt::format("a page stride that is a multiple of 16 and >= page_size * 384 = {}", g.page_size * kNvfp4TokenBytes),
                fmt::format("{}", g.page_stride));
  }
  if (!rules.runtime_page_size && (g.page_size < 1 || g.page_size > rules.max_page_size)) {
    check::unsupported(arg, fmt::format("page sizes 1..{}", rules.max_page_size), fmt::format("page size {}", g.page_size));
  }
  return g;
}

}  // namespace kiln
