#include "runtime/nvfp4_writer/writer.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "jit/error.h"
#include "jit/family.h"
#include "kernel_templates/common/nvfp4_format.cuh"
#include "kernel_templates/nvfp4_writer/params.cuh"
#include "runtime/driver.h"
#include "runtime/kernel_service.h"
#include "runtime/nvfp4_cache_view.h"
#include "runtime/validation.h"

namespace kiln::nvfp4 {

namespace {

using nlohmann::json;

constexpr int kMaxPageSize = 1024;

class WriterFamily final : public Family {
 public:
  std::string_view name() const override { return kWriterFamily; }

  json canonicalize(const json& policy) const override {
    if (!policy.is_object()) throw Error(ErrorCode::kInvalidArgument, "nvfp4_writer policy must be a JSON object");
    json out = {{"op", "append"}, {"page_size", 64}};
    for (const auto& [field, value] : policy.items()) {
      if (field == "op") {
        if (!value.is_string() || (value != "pack" && value != "append")) {
          throw Error(ErrorCode::kInvalidArgument, fmt::format("nvfp4_writer policy field 'op' must be \"pack\" or \"append\", got {}", json_text(value)));
        }
        out["op"] = value;
      } else if (field == "page_size") {
        if (!value.is_number_integer() || value.get<long long>() < 1 || value.get<long long>() > kMaxPageSize) {
          throw Error(ErrorCode::kInvalidArgument,
                      fmt::format("nvfp4_writer policy field 'page_size' must be an integer in [1, {}], got {}", kMaxPageSize, json_text(value)));
        }
        out["page_size"] = value.get<long long>();
      } else {
        throw Error(ErrorCode::kInvalidArgument, fmt::format("nvfp4_writer policy has no field '{}'; fields: op, page_size", field));
      }
    }
    return out;
  }

  KernelSource render(const json& policy) const override {
    return KernelSource{"#include \"nvfp4_writer/kernel.cuh\"\n",
                        {fmt::format("kiln::nvfp4_writer_kernel<{}, {}>", policy["page_size"].get<int>(),
                                     policy["op"] == "append" ? "true" : "false")}};
  }
};

json policy_json(const WriterPolicy& p) {
  return {{"op", p.op == WriterOp::kPack ? "pack" : "append"}, {"page_size", p.page_size}};
}

std::uint64_t fingerprint(const WriterPolicy& p) {
  const std::int32_t words[3] = {0x77726974 /* family tag */, static_cast<std::int32_t>(p.op), p.page_size};
  return XXH3_64bits(words, sizeof words);
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
  if (rows.stride(-1) != 1) check::fail(arg, "stride(-1) == 1", fmt::format("{}", rows.stride(-1)));
  check::aligned(rows, arg, 16);
}

void launch(const WriterPolicy& policy, const Nvfp4WriterParams& params, CUstream stream) {
  KernelService& service = KernelService::global();
  const KernelHandle& handle =
      service.acquire(fingerprint(policy), [&] { return policy.key(service.device_arch(KernelService::current_device())); }, stream);
  const Driver& d = Driver::get();
  void* args[] = {const_cast<Nvfp4WriterParams*>(&params)};
  const unsigned grid = static_cast<unsigned>((params.num_rows + kNvfp4WriterRowsPerBlock - 1) / kNvfp4WriterRowsPerBlock);
  d.check(d.cuLaunchKernel(handle.entry(0).function, grid, 1, 1, kNvfp4WriterThreads, 1, 1, 0, stream, args, nullptr),
          "cuLaunchKernel(nvfp4_writer)");
}

}  // namespace

SemanticKey WriterPolicy::key(std::string_view arch) const { return SemanticKey(kWriterFamily, policy_json(*this), arch); }

void register_writer_family() { register_family(std::make_unique<WriterFamily>()); }

void pack(const TensorView& latent, const TensorView& cache, CUstream stream) {
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
  const Nvfp4WriterParams params{latent.data, latent.stride(1), cache.data, g.page_stride, nullptr, rows,
                                 static_cast<int>(rows)};
  launch(WriterPolicy{WriterOp::kPack, static_cast<int>(g.page_size)}, params, stream);
}

void append(const TensorView& rows, const TensorView& slot_mapping, const TensorView& cache, CUstream stream) {
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
  const Nvfp4WriterParams params{rows.data, rows.stride(0), cache.data, g.page_stride,
                                 static_cast<const int*>(slot_mapping.data), g.pages * g.page_size,
                                 static_cast<int>(rows.size(0))};
  launch(WriterPolicy{WriterOp::kAppend, static_cast<int>(g.page_size)}, params, stream);
}

void warm(const WriterPolicy& policy, const std::vector<int>& devices) {
  KernelService& service = KernelService::global();
  for (int device : devices) service.warm(policy.key(service.device_arch(device)), device);
}

}  // namespace kiln::nvfp4
