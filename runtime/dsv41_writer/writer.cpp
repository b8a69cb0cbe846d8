#include "kiln/runtime/dsv41_writer/writer.h"

#include <fmt/format.h>

#include <climits>

#include "kiln/kernel_templates/common/dsv41_format.cuh"
#include "kiln/kernel_templates/common/writer_geometry.cuh"
#include "kiln/kernel_templates/dsv41_writer/params.cuh"
#include "kiln/runtime/paged_cache_view.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/policy_schema.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/validation.h"
#include "kiln/runtime/writer_launch.h"

namespace kiln::dsv41 {

namespace {

constexpr int kLatentDims = 512;
constexpr std::string_view kLatent = "latent_kv";

int bits_of(CacheFormat f) { return f == CacheFormat::kFp8 ? kDsv41Fp8Bits : kDsv41Fp4Bits; }

// pack: one entry. append: the scan, claim and write kernels (kWriterAppend*Entry order).
KernelSource render(const WriterPolicy& p) {
  const int bits = bits_of(p.format);
  if (p.op == WriterOp::kPack) return KernelSource{"#include \"dsv41_writer/kernel.cuh\"\n", {fmt::format("kiln::writer_pack_kernel<kiln::Dsv41WriterFormat<{}>>", bits)}};
  return KernelSource{"#include \"dsv41_writer/kernel.cuh\"\n",
                      {fmt::format("kiln::writer_append_scan_kernel<kiln::Dsv41WriterFormat<{}>>", bits), fmt::format("kiln::dsv41_append_claim_kernel<{}>", bits),
                       fmt::format("kiln::writer_append_write_kernel<kiln::Dsv41WriterFormat<{}>>", bits)}};
}

const PolicySchema<WriterPolicy>& schema() {
  static const PolicySchema<WriterPolicy> s(
      kWriterFamily,
      {enum_field<&WriterPolicy::format>("format", {{"fp8", static_cast<int>(CacheFormat::kFp8)}, {"fp4", static_cast<int>(CacheFormat::kFp4)}},
                                         static_cast<int>(CacheFormat::kFp8), ErrorCode::kInvalidArgument, "CacheFormat::kFp8 or kFp4"),
       enum_field<&WriterPolicy::op>("op", {{"pack", static_cast<int>(WriterOp::kPack)}, {"append", static_cast<int>(WriterOp::kAppend)}},
                                     static_cast<int>(WriterOp::kAppend), ErrorCode::kInvalidArgument, "WriterOp::kPack or kAppend")},
      &render);
  return s;
}

// What every latent must be: bf16 or fp16, last dimension 512, contiguous, 16-byte aligned.
void check_latent_storage(const TensorView& latent) {
  if (latent.dtype != DType::kBf16 && latent.dtype != DType::kF16) {
    check::fail_as("latent_kv must be a contiguous CUDA bfloat16 or float16 tensor", kLatent, "dtype bfloat16 or float16",
                   dtype_name(latent.dtype));
  }
  if (latent.size(-1) != kLatentDims) {
    check::fail_as("latent_kv last dimension must be 512", kLatent, "512 values per row", fmt::format("shape {}", latent.shape_string()));
  }
  if (!latent.is_contiguous()) {
    check::fail_as("latent_kv must be a contiguous CUDA bfloat16 or float16 tensor", kLatent, "a contiguous tensor",
                   fmt::format("shape {}", latent.shape_string()));
  }
  check::not_null(latent, kLatent);
  check::aligned(latent, kLatent, 16);
}

struct PackLatent {
  std::int64_t pages = 0;
  std::int64_t page_size = 0;
};

PackLatent check_pack_latent(const TensorView& latent) {
  if (latent.rank == 2) {
    check::fail_as("full-page pack requires a page dimension", kLatent, "[num_pages, page_size, 512] (or with a singleton head axis)",
                   fmt::format("shape {}", latent.shape_string()));
  }
  if (latent.rank != 3 && latent.rank != 4) {
    check::fail_as("latent_kv must be [num_pages, page_size, 512]", kLatent,
                   "[num_pages, page_size, 512], [num_pages, 1, page_size, 512] or [num_pages, page_size, 1, 512]",
                   fmt::format("rank {} (shape {})", latent.rank, latent.shape_string()));
  }
  check_latent_storage(latent);
  PackLatent l{latent.size(0), latent.size(1)};
  if (latent.rank == 4) {
    if (latent.size(1) == 1) l.page_size = latent.size(2);
    else if (latent.size(2) != 1) {
      check::fail_as("latent_kv 4-D shape must have a singleton head axis (HND or NHD)", kLatent,
                     "[num_pages, 1, page_size, 512] or [num_pages, page_size, 1, 512]", fmt::format("shape {}", latent.shape_string()));
    }
  }
  if (l.pages < 1 || l.page_size < 1) {
    check::fail_as("latent_kv must have at least one page of at least one row", kLatent, "num_pages >= 1 and page_size >= 1",
                   fmt::format("shape {}", latent.shape_string()));
  }
  if (l.pages > INT_MAX / l.page_size) check::unsupported(kLatent, "at most 2^31-1 rows", fmt::format("{} pages of {} rows", l.pages, l.page_size));
  return l;
}

// The cache's geometry; its slots are numbered in int32.
PagedCacheGeometry check_cache(CacheFormat format, const TensorView& cache) {
  const PagedCacheGeometry g = check_record_cache(cache, "cache", record_bytes(format));
  if (g.pages > INT_MAX / g.page_size) {
    check::unsupported("cache", "at most 2^31-1 token slots", fmt::format("{} pages of {} rows", g.pages, g.page_size));
  }
  return g;
}

}  // namespace

void WriterPolicy::validate() const { schema().validate(*this); }
SemanticKey WriterPolicy::key(std::string_view arch) const { return schema().key(*this, arch); }
std::uint64_t WriterPolicy::fingerprint() const { return schema().fingerprint(*this); }

void register_writer_family() { schema().register_family(); }

int record_bytes(CacheFormat format) { return format == CacheFormat::kFp8 ? kDsv41MainRecordBytes : kDsv41ExtraRecordBytes; }

KvLayout parse_kv_layout(std::string_view kv_layout) {
  if (kv_layout == "HND") return KvLayout::kHnd;
  if (kv_layout == "NHD") return KvLayout::kNhd;
  check::fail_as("kv_layout must be \"HND\" or \"NHD\"", "kv_layout", "\"HND\" or \"NHD\"", fmt::format("\"{}\"", kv_layout));
}

std::array<std::int64_t, 4> pack_cache_shape(CacheFormat format, const TensorView& latent_kv, KvLayout layout) {
  const PackLatent l = check_pack_latent(latent_kv);
  const std::int64_t record = record_bytes(format);
  if (layout == KvLayout::kHnd) return {l.pages, 1, l.page_size, record};
  return {l.pages, l.page_size, 1, record};
}

void pack(CacheFormat format, const TensorView& latent_kv, const TensorView& cache, CUstream stream, KernelService& service) {
  const PackLatent l = check_pack_latent(latent_kv);
  const PagedCacheGeometry g = check_cache(format, cache);
  if (g.pages != l.pages || g.page_size != l.page_size) {
    check::fail("cache", fmt::format("{} pages of {} rows, matching latent_kv", l.pages, l.page_size),
                fmt::format("{} pages of {} rows (shape {})", g.pages, g.page_size, cache.shape_string()));
  }
  check::disjoint(latent_kv, kLatent, cache, "cache");
  const StreamDevice on(stream);
  on.check(latent_kv, kLatent);
  on.check(cache, "cache");
  const int rows = static_cast<int>(l.pages * l.page_size);
  const Dsv41WriterParams params{latent_kv.data, kLatentDims, cache.data, g.page_stride, nullptr, rows,
                                 static_cast<int>(g.page_size), rows, latent_kv.dtype == DType::kF16 ? 1 : 0, 0};
  launch(acquire(service, WriterPolicy{format, WriterOp::kPack}, stream, on.device()), writer_row_warps(rows, kWriterRowsPerWarp), params, stream);
}

void append(CacheFormat format, const TensorView& latent_kv, const TensorView& slot_mapping, const TensorView& cache, CUstream stream,
            KernelService& service) {
  if (latent_kv.rank != 2 && !(latent_kv.rank == 3 && latent_kv.size(1) == 1)) {
    check::fail_as("latent_kv must be [N, 512]", kLatent, "[N, 512] or [N, 1, 512], one row per slot_mapping entry",
                   fmt::format("shape {}", latent_kv.shape_string()));
  }
  check_latent_storage(latent_kv);
  const std::int64_t n = latent_kv.size(0);
  if (slot_mapping.dtype != DType::kI32 && slot_mapping.dtype != DType::kI64) {
    check::fail_as("slot_mapping must be a contiguous 1-D int32 or int64 tensor", "slot_mapping", "dtype int32 or int64",
                   dtype_name(slot_mapping.dtype));
  }
  if (slot_mapping.rank != 1 || !slot_mapping.is_contiguous()) {
    check::fail_as("slot_mapping must be a contiguous 1-D int32 or int64 tensor", "slot_mapping", "a contiguous 1-D tensor",
                   fmt::format("shape {}", slot_mapping.shape_string()));
  }
  if (slot_mapping.size(0) != n) {
    check::fail_as(fmt::format("slot_mapping must have one entry per latent_kv row ({} rows)", n), "slot_mapping",
                   fmt::format("{} entries", n), fmt::format("{}", slot_mapping.size(0)));
  }
  check::not_null(slot_mapping, "slot_mapping");
  check::aligned(slot_mapping, "slot_mapping", dtype_bytes(slot_mapping.dtype));
  const PagedCacheGeometry g = check_cache(format, cache);
  check::disjoint(latent_kv, kLatent, cache, "cache");
  check::disjoint(slot_mapping, "slot_mapping", cache, "cache");
  if (n > INT_MAX) check::unsupported(kLatent, "at most 2^31-1 rows", fmt::format("{}", n));
  if (n == 0) return;
  const StreamDevice on(stream);
  on.check(latent_kv, kLatent);
  on.check(slot_mapping, "slot_mapping");
  on.check(cache, "cache");
  const Dsv41WriterParams params{latent_kv.data,
                                 kLatentDims,
                                 cache.data,
                                 g.page_stride,
                                 slot_mapping.data,
                                 static_cast<int>(g.pages * g.page_size),
                                 static_cast<int>(g.page_size),
                                 static_cast<int>(n),
                                 latent_kv.dtype == DType::kF16 ? 1 : 0,
                                 slot_mapping.dtype == DType::kI64 ? 1 : 0};
  launch_writer_append(acquire(service, WriterPolicy{format, WriterOp::kAppend}, stream, on.device()), &params, params.num_rows, stream);
}

void warm(const WriterPolicy& policy, const std::vector<int>& devices, KernelService& service) { warm_policy(service, policy, devices); }

}  // namespace kiln::dsv41
