// The DeepSeek-V4.1 cache writers on the host: the family's keys and the argument rules of the
// cache views and the launchers. Only calls that must fail in validation (or launch nothing) reach
// the launchers here: a valid one would need a driver.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <fmt/format.h>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/jit/error.h"
#include "kiln/runtime/paged_cache_view.h"
#include "kiln/runtime/dsv41_writer/writer.h"
#include "tests/support/expect_error.h"

namespace {

namespace kt = kiln::testing;
namespace dw = kiln::dsv41;
using kiln::DType;
using kiln::ErrorCode;
using kiln::TensorView;

void* addr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

}  // namespace

TEST_CASE("dsv41_writer: keys of both formats and ops", "[unit]") {
  dw::register_writer_family();
  const dw::WriterPolicy fp4_pack{dw::CacheFormat::kFp4, dw::WriterOp::kPack};
  const std::string key = fp4_pack.key("sm_120a").str();
  CHECK(key.rfind("dsv41_writer:sm_120a:format=fp4,op=pack:", 0) == 0);
  CHECK(kiln::SemanticKey::parse(key).str() == key);
  CHECK(fp4_pack.fingerprint() != dw::WriterPolicy{dw::CacheFormat::kFp8, dw::WriterOp::kPack}.fingerprint());
  CHECK(fp4_pack.fingerprint() != dw::WriterPolicy{dw::CacheFormat::kFp4, dw::WriterOp::kAppend}.fingerprint());
  const kiln::SemanticKey defaults("dsv41_writer", nlohmann::json::object(), "sm_90a");
  CHECK(defaults.str().rfind("dsv41_writer:sm_90a:format=fp8,op=append:", 0) == 0);
  const kiln::Error e = kt::expect_error([] { kiln::SemanticKey("dsv41_writer", {{"format", "fp6"}}, "sm_90a"); });
  CHECK(e.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains("format"));
  CHECK(dw::record_bytes(dw::CacheFormat::kFp8) == 528);
  CHECK(dw::record_bytes(dw::CacheFormat::kFp4) == 288);
}

namespace {

TensorView u8_view(std::uintptr_t a, std::initializer_list<std::int64_t> shape) { return TensorView::contiguous(addr(a), DType::kU8, shape); }

std::string cache_error(const TensorView& v, int record) {
  const kiln::Error e = kt::expect_error([&] { kiln::check_record_cache(v, "cache", record); });
  CHECK(e.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains("'cache'"));
  return e.what();
}

}  // namespace

TEST_CASE("dsv41 cache views: every accepted view gives the same geometry", "[unit]") {
  for (const int rec : {528, 288}) {
    const std::uintptr_t base = 0x100000;
    const auto two_d = kiln::check_record_cache(u8_view(base, {4, 61 * rec}), "cache", rec);
    CHECK(two_d.pages == 4);
    CHECK(two_d.page_size == 61);
    CHECK(two_d.page_stride == 61 * rec);
    const auto three_d = kiln::check_record_cache(u8_view(base, {4, 61, rec}), "cache", rec);
    const auto hnd = kiln::check_record_cache(u8_view(base, {4, 1, 61, rec}), "cache", rec);
    const auto nhd = kiln::check_record_cache(u8_view(base, {4, 61, 1, rec}), "cache", rec);
    for (const auto& g : {three_d, hnd, nhd}) {
      CHECK(g.pages == 4);
      CHECK(g.page_size == 61);
      CHECK(g.page_stride == 61 * rec);
    }
    TensorView padded = u8_view(base, {4, 1, 61, rec});
    padded.strides[0] = 61 * rec + 128;
    if ((61 * rec + 128) % 16 == 0) CHECK(kiln::check_record_cache(padded, "cache", rec).page_stride == 61 * rec + 128);
    CHECK(kiln::check_record_cache(u8_view(base, {2, 1, rec}), "cache", rec).page_size == 1);
  }
}

TEST_CASE("dsv41 cache views: refusals carry upstream's phrase and name the argument", "[unit]") {
  const std::uintptr_t base = 0x200000;
  CHECK_THAT(cache_error(u8_view(base, {4, 64, 384}), 528), Catch::Contains("528"));
  CHECK_THAT(cache_error(u8_view(base, {4, 64, 528}), 288), Catch::Contains("288"));
  CHECK_THAT(cache_error(u8_view(base, {4, 64 * 528 + 16}), 528), Catch::Contains("multiple of 528"));
  CHECK_THAT(cache_error(u8_view(base, {4, 2, 2, 288}), 288), Catch::Contains("singleton"));
  TensorView loose = u8_view(base, {4, 64, 528});
  loose.strides = {64 * 544, 544, 1};
  CHECK_THAT(cache_error(loose, 528), Catch::Contains("packed"));
  TensorView strided = u8_view(base, {4, 64, 528});
  strided.strides[2] = 2;
  CHECK_THAT(cache_error(strided, 528), Catch::Contains("contiguous"));
  CHECK_THAT(cache_error(u8_view(base, {4}), 528), Catch::Contains("rank"));
  CHECK_THAT(cache_error(u8_view(base, {0, 64, 528}), 528), Catch::Contains("at least one page"));
  CHECK_THAT(cache_error(u8_view(base, {4, 0, 528}), 528), Catch::Contains("at least one page"));
  TensorView small = u8_view(base, {4, 64, 528});
  small.strides[0] = 63 * 528;
  CHECK_THAT(cache_error(small, 528), Catch::Contains("smaller than"));
  TensorView odd = u8_view(base, {4, 61, 288});
  odd.strides[0] = 61 * 288 + 8;
  CHECK_THAT(cache_error(odd, 288), Catch::Contains("multiple of 16"));
  TensorView wrong_type = TensorView::contiguous(addr(base), DType::kI8, {4, 64, 528});
  CHECK_THAT(cache_error(wrong_type, 528), Catch::Contains("torch.uint8"));
  CHECK_THAT(cache_error(u8_view(base + 8, {4, 64, 528}), 528), Catch::Contains("16-byte aligned"));
  // Shapes too large for int32 offsets or slot numbers are refused as unsupported, without overflow.
  for (const auto& huge : {u8_view(base, {2, std::int64_t{1} << 40, 288}), u8_view(base, {2, 288 * (std::int64_t{1} << 40)})}) {
    const kiln::Error e = kt::expect_error([&] { kiln::check_record_cache(huge, "cache", 288); });
    CHECK(e.code() == ErrorCode::kUnsupported);
    CHECK_THAT(e.what(), Catch::Contains("page sizes up to"));
  }
  const TensorView many_pages = u8_view(base, {std::int64_t{1} << 40, 64, 528});
  const kiln::Error e = kt::expect_error([&] {
    dw::append(dw::CacheFormat::kFp8, TensorView::contiguous(addr(0x100000), DType::kBf16, {1, 512}),
               TensorView::contiguous(addr(0x200000), DType::kI32, {1}), many_pages, nullptr);
  });
  CHECK(e.code() == ErrorCode::kUnsupported);
  CHECK_THAT(e.what(), Catch::Contains("2^31-1 token slots"));
}

namespace {

TensorView latent(std::uintptr_t a, std::initializer_list<std::int64_t> shape, DType t = DType::kBf16) {
  return TensorView::contiguous(addr(a), t, shape);
}

std::string launcher_error(const std::function<void()>& call, std::string_view arg) {
  const kiln::Error e = kt::expect_error(call);
  CHECK(e.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains(fmt::format("'{}'", arg)));
  return e.what();
}

}  // namespace

TEST_CASE("dsv41_writer: pack and append argument rules", "[unit]") {
  const TensorView cache = u8_view(0x4000000, {4, 1, 64, 528});
  const auto pack = [&](const TensorView& l, const TensorView& c, dw::CacheFormat f = dw::CacheFormat::kFp8) {
    return [=] { dw::pack(f, l, c, nullptr); };
  };
  CHECK_THAT(launcher_error(pack(latent(0x100000, {256, 512}), cache), "latent_kv"), Catch::Contains("full-page pack requires a page dimension"));
  CHECK_THAT(launcher_error(pack(latent(0x100000, {4, 64, 512}, DType::kF32), cache), "latent_kv"), Catch::Contains("float16"));
  CHECK_THAT(launcher_error(pack(latent(0x100000, {4, 64, 576}), cache), "latent_kv"), Catch::Contains("512"));
  CHECK_THAT(launcher_error(pack(latent(0x100000, {4, 2, 32, 512}), cache), "latent_kv"), Catch::Contains("singleton"));
  CHECK_THAT(launcher_error(pack(latent(0x100008, {4, 64, 512}), cache), "latent_kv"), Catch::Contains("16-byte aligned"));
  CHECK_THAT(launcher_error(pack(latent(0x100000, {4, 32, 512}), cache), "cache"), Catch::Contains("matching latent_kv"));
  CHECK_THAT(launcher_error(pack(latent(0x100000, {4, 64, 512}), cache, dw::CacheFormat::kFp4), "cache"), Catch::Contains("288"));
  CHECK_THAT(launcher_error(pack(latent(0x4000000, {4, 64, 512}), cache), "latent_kv"), Catch::Contains("overlap"));
  // pack_cache_shape checks the latent the same way and names the layout's shape.
  CHECK(dw::pack_cache_shape(dw::CacheFormat::kFp4, latent(0x100000, {4, 1, 61, 512}), dw::KvLayout::kNhd) ==
        std::array<std::int64_t, 4>{4, 61, 1, 288});
  CHECK(dw::pack_cache_shape(dw::CacheFormat::kFp8, latent(0x100000, {4, 61, 1, 512}, DType::kF16), dw::KvLayout::kHnd) ==
        std::array<std::int64_t, 4>{4, 1, 61, 528});
  CHECK_THAT(launcher_error([] { dw::pack_cache_shape(dw::CacheFormat::kFp8, latent(0x100000, {8, 512}), dw::KvLayout::kHnd); }, "latent_kv"),
             Catch::Contains("full-page pack requires a page dimension"));
  CHECK_THAT(launcher_error([] { dw::parse_kv_layout("HDN"); }, "kv_layout"), Catch::Contains("\"HND\" or \"NHD\""));
  CHECK(dw::parse_kv_layout("NHD") == dw::KvLayout::kNhd);

  const auto append = [&](const TensorView& l, const TensorView& s, const TensorView& c) {
    return [=] { dw::append(dw::CacheFormat::kFp8, l, s, c, nullptr); };
  };
  const TensorView rows = latent(0x100000, {10, 512});
  const TensorView slots = TensorView::contiguous(addr(0x200000), DType::kI64, {10});
  CHECK_THAT(launcher_error(append(rows, TensorView::contiguous(addr(0x200000), DType::kF32, {10}), cache), "slot_mapping"),
             Catch::Contains("int32 or int64"));
  CHECK_THAT(launcher_error(append(rows, TensorView::contiguous(addr(0x200000), DType::kI32, {9}), cache), "slot_mapping"),
             Catch::Contains("one entry per latent_kv row"));
  CHECK_THAT(launcher_error(append(rows, TensorView::contiguous(addr(0x200000), DType::kI32, {10, 1}), cache), "slot_mapping"),
             Catch::Contains("1-D"));
  CHECK_THAT(launcher_error(append(latent(0x100000, {10, 2, 512}), slots, cache), "latent_kv"), Catch::Contains("[N, 512]"));
  CHECK_THAT(launcher_error(append(rows, slots, u8_view(0x4000000, {4, 64, 384})), "cache"), Catch::Contains("528"));
  CHECK_THAT(launcher_error(append(rows, TensorView::contiguous(addr(0x4000100), DType::kI32, {10}), cache), "slot_mapping"),
             Catch::Contains("overlap"));
  // No rows: validated, then nothing is launched (no driver is reached).
  CHECK_NOTHROW(dw::append(dw::CacheFormat::kFp4, latent(0x100000, {0, 512}, DType::kF16), TensorView::contiguous(addr(0x200000), DType::kI32, {0}),
                           u8_view(0x4000000, {4, 64 * 288}), nullptr));
  CHECK_THAT(launcher_error([] {
               dw::append(dw::CacheFormat::kFp4, latent(0x100000, {0, 512}), TensorView::contiguous(addr(0x200000), DType::kI32, {0}),
                          u8_view(0x4000000, {4, 64, 528}), nullptr);
             }, "cache"),
             Catch::Contains("288"));
}
