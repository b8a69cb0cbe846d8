#include "kiln/runtime/nvfp4_writer/writer.h"

#include <fmt/format.h>

#include "kiln/kernel_templates/common/nvfp4_format.cuh"
#include "kiln/kernel_templates/common/writer_geometry.cuh"
#include "kiln/kernel_templates/nvfp4_writer/params.cuh"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/nvfp4_cache_view.h"
#include "kiln/runtime/policy_schema.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/validation.h"
#include "kiln/runtime/writer_launch.h"

namespace kiln::nvfp4 {

namespace {

constexpr int kMaxPageSize = 1024;

// pack: one entry. append: the scan, claim and write kernels (kWriterAppend*Entry order).
KernelSource render(const WriterPolicy& p) {
  if (p.op == WriterOp::kPack) return KernelSource{"#include \"nvfp4_writer/kernel.cuh\"\n", {fmt::format("kiln::writer_pack_kernel<kiln::Nvfp4WriterFormat<{}>>", p.page_size)}};
  return KernelSource{"#include \"nvfp4_writer/kernel.cuh\"\n",
                      {fmt::format("kiln::writer_append_scan_kernel<kiln::Nvfp4WriterFormat<{}>>", p.page_size), fmt::format("kiln::nvfp4_append_claim_kernel<{}>", p.page_size),
                       fmt::format("kiln::writer_append_write_kernel<kiln::Nvfp4WriterFormat<{}>>", p.page_size)}};
}

const PolicySchema<WriterPolicy>& schema() {
  static const PolicySchema<WriterPolicy> s(
      kWriterFamily,
      {enum_field<&WriterPolicy::op>("op", {{"pack", static_cast<int>(WriterOp::kPack)}, {"append", static_cast<int>(WriterOp::kAppend)}},
                                     static_cast<int>(WriterOp::kAppend), ErrorCode::kInvalidArgument, "WriterOp::kPack or kAppend"),
       int_field<&WriterPolicy::page_size>("page_size", {.expected = "an integer in [1, 1024]", .min = 1, .max = kMaxPageSize}, 64)},
      &render);
  return s;
}

// The page size is in the key (1..kMaxPageSize), so it is checked after the view's strides.
Nvfp4CacheGeometry check_cache(const TensorView& cache) {
  return check_nvfp4_cache(cache, "cache", {.max_page_size = kMaxPageSize, .runtime_page_size = false});
}

void check_rows(const TensorView& rows, std::string_view arg, int rank) {
  check::rank(rows, arg, {rank});
  check::not_null(rows, arg);
  check::dtype(rows, arg, {DType::kBf16});
  check::dim(rows, arg, -1, kNvfp4LatentDims);
  check::unit_stride(rows, arg, -1);
  check::aligned(rows, arg, 16);
}

}  // namespace

void WriterPolicy::validate() const { schema().validate(*this); }
SemanticKey WriterPolicy::key(std::string_view arch) const { return schema().key(*this, arch); }
std::uint64_t WriterPolicy::fingerprint() const { return schema().fingerprint(*this); }

void register_writer_family() { schema().register_family(); }

void pack(const TensorView& latent, const TensorView& cache, CUstream stream, KernelService& service) {
  const Nvfp4CacheGeometry g = check_cache(cache);
  check_rows(latent, "latent", 3);
  if (latent.size(0) != g.pages || latent.size(1) != g.page_size) {
    check::fail("latent", fmt::format("shape [{}, {}, 512] matching the cache", g.pages, g.page_size), latent.shape_string());
  }
  if (latent.stride(1) % 8 != 0 || (g.pages > 1 && latent.stride(0) != latent.stride(1) * g.page_size)) {
    check::fail("latent", "rows at a stride that is a multiple of 8 elements, pages packed back to back",
                fmt::format("strides [{}, {}, 1]", latent.stride(0), latent.stride(1)));
  }
  check::disjoint(latent, "latent", cache, "cache");
  const std::int64_t rows = g.pages * g.page_size;
  if (rows > INT32_MAX) check::fail("cache", "at most 2^31-1 token slots", fmt::format("{}", rows));
  if (rows == 0) return;
  const StreamDevice on(stream);
  on.check(latent, "latent");
  on.check(cache, "cache");
  const Nvfp4WriterParams params{latent.data, latent.stride(1), cache.data, g.page_stride, nullptr, rows,
                                 static_cast<int>(rows)};
  launch(acquire(service, WriterPolicy{WriterOp::kPack, static_cast<int>(g.page_size)}, stream, on.device()), writer_row_warps(params.num_rows, kWriterRowsPerWarp), params, stream);
}

void append(const TensorView& rows, const TensorView& slot_mapping, const TensorView& cache, CUstream stream,
            KernelService& service) {
  const Nvfp4CacheGeometry g = check_cache(cache);
  check_rows(rows, "rows", 2);
  if (rows.size(0) > 1 && rows.stride(0) % 8 != 0) check::fail("rows", "a row stride that is a multiple of 8 elements", fmt::format("{}", rows.stride(0)));
  check::dtype(slot_mapping, "slot_mapping", {DType::kI32});
  check::rank(slot_mapping, "slot_mapping", {1});
  check::contiguous(slot_mapping, "slot_mapping");
  check::not_null(slot_mapping, "slot_mapping");
  check::aligned(slot_mapping, "slot_mapping", 4);
  check::dim(slot_mapping, "slot_mapping", 0, rows.size(0));
  check::disjoint(rows, "rows", cache, "cache");
  check::disjoint(slot_mapping, "slot_mapping", cache, "cache");
  if (rows.size(0) > INT32_MAX) check::fail("rows", "at most 2^31-1 rows", fmt::format("{}", rows.size(0)));
  if (rows.size(0) == 0) return;
  const StreamDevice on(stream);
  on.check(rows, "rows");
  on.check(slot_mapping, "slot_mapping");
  on.check(cache, "cache");
  const Nvfp4WriterParams params{rows.data, rows.stride(0), cache.data, g.page_stride,
                                 static_cast<const int*>(slot_mapping.data), g.pages * g.page_size,
                                 static_cast<int>(rows.size(0))};
  launch_writer_append(acquire(service, WriterPolicy{WriterOp::kAppend, static_cast<int>(g.page_size)}, stream, on.device()), &params, params.num_rows, stream);
}

void warm(const WriterPolicy& policy, const std::vector<int>& devices, KernelService& service) {
  warm_policy(service, policy, devices);
}

}  // namespace kiln::nvfp4
