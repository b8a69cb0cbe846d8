// Host validation of the paged MLA decode engine API (runtime/mla_decode/README.md, "Arguments"): every rule
// rejects a bad argument with kiln::Error naming it, before any driver call. Views use fake, aligned,
// far-apart addresses: nothing here touches device memory or needs a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/mla_decode/launcher.h"
#include "kiln/runtime/mla_decode/planner.h"

namespace {

using kiln::DType;
using kiln::Error;
using kiln::ErrorCode;
using kiln::TensorView;
using kiln::mla::MaskType;

void* addr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

constexpr std::uintptr_t kQuery = 0x10000000;
constexpr std::uintptr_t kCache = 0x20000000;
constexpr std::uintptr_t kTables = 0x30000000;
constexpr std::uintptr_t kLens = 0x31000000;
constexpr std::uintptr_t kIndptr = 0x32000000;
constexpr std::uintptr_t kOut = 0x40000000;
constexpr std::uintptr_t kWork = 0x50000000;

// All arguments of one call; the defaults are a valid fixed-mode launch (B 4, SQ 2, H 16, page 64).
struct Args {
  int batch = 4;
  int sq = 2;
  int heads = 16;
  int page_size = 64;
  long long max_seq_len = 4096;
  DType dtype = DType::kBf16;

  TensorView query, kv_cache, workspace, block_tables, seq_lens;
  int kv_lora_rank = 512;
  int qk_rope_head_dim = 64;
  std::optional<TensorView> qo_indptr;
  std::optional<int> max_seq_len_q;
  std::optional<TensorView> out;
  double bmm1_scale = 0.0721687836;  // 1/sqrt(192)
  double bmm2_scale = 1.0;
  MaskType mask = MaskType::kCausal;
  DType out_dtype = DType::kBf16;

  Args() { rebuild(); }

  // Recomputes every view from the scalar fields above (fixed mode).
  void rebuild() {
    const std::int64_t pages_per_seq = (max_seq_len + page_size - 1) / page_size;
    query = TensorView::contiguous(addr(kQuery), dtype, {batch, sq, heads, 576});
    kv_cache = TensorView::contiguous(addr(kCache), dtype, {300, page_size, 576});
    block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {batch, pages_per_seq});
    seq_lens = TensorView::contiguous(addr(kLens), DType::kI32, {batch});
    out = TensorView::contiguous(addr(kOut), DType::kBf16, {batch, sq, heads, 512});
    qo_indptr.reset();
    max_seq_len_q.reset();
    workspace = TensorView::contiguous(addr(kWork), DType::kU8, {static_cast<std::int64_t>(workspace_bytes())});
  }

  // Switches to packed mode with `total_q` query tokens and bound `msq`.
  void make_packed(std::int64_t total_q, int msq) {
    sq = msq;
    query = TensorView::contiguous(addr(kQuery), dtype, {total_q, heads, 576});
    out = TensorView::contiguous(addr(kOut), DType::kBf16, {total_q, heads, 512});
    qo_indptr = TensorView::contiguous(addr(kIndptr), DType::kI32, {batch + 1});
    max_seq_len_q = msq;
    workspace = TensorView::contiguous(addr(kWork), DType::kU8, {static_cast<std::int64_t>(workspace_bytes(true))});
  }

  std::size_t workspace_bytes(bool packed = false) const {
    return kiln::mla::mla_workspace_size(heads, page_size, max_seq_len, sq, packed, dtype, DType::kBf16, mask, batch);
  }

  kiln::mla::MlaProblem validate() const {
    return kiln::mla::validate_mla_arguments(query, kv_cache, workspace, kv_lora_rank, qk_rope_head_dim, block_tables,
                                             seq_lens, max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale,
                                             bmm2_scale, mask, out_dtype);
  }

  // The whole engine API: a failing check must throw before it reaches the driver.
  TensorView launch() const {
    return kiln::mla::prims_ts_batch_decode_with_kv_cache_mla(query, kv_cache, workspace, kv_lora_rank,
                                                              qk_rope_head_dim, block_tables, seq_lens, max_seq_len,
                                                              qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale,
                                                              mask, out_dtype, nullptr);
  }
};

TensorView with_stride(TensorView t, int dim, std::int64_t stride) {
  t.strides[dim] = stride;
  return t;
}

TensorView shifted(TensorView t, std::intptr_t bytes) {
  t.data = static_cast<char*>(t.data) + bytes;
  return t;
}

TensorView at(TensorView t, std::uintptr_t a) {
  t.data = addr(a);
  return t;
}

// Runs the full launcher and checks the code and that the message names `arg` (plus `detail`).
void expect_error(const Args& a, ErrorCode code, const std::string& arg, const std::string& detail = "") {
  INFO("argument " << arg);
  try {
    a.launch();
    FAIL("no error");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.code() == code);
    CHECK_THAT(e.what(), Catch::Contains("argument '" + arg + "'"));
    if (!detail.empty()) CHECK_THAT(e.what(), Catch::Contains(detail));
  }
}

void expect_invalid(const Args& a, const std::string& arg, const std::string& detail = "") {
  expect_error(a, ErrorCode::kInvalidArgument, arg, detail);
}
void expect_unsupported(const Args& a, const std::string& arg, const std::string& detail = "") {
  expect_error(a, ErrorCode::kUnsupported, arg, detail);
}

}  // namespace

TEST_CASE("mla validation: valid launches pass every host check", "[unit]") {
  kiln::mla::register_mla_family();
  Args a;
  REQUIRE(a.workspace_bytes() > 0);  // the baseline must exercise the workspace rules

  SECTION("fixed mode") {
    const auto p = a.validate();
    CHECK(p.batch == 4);
    CHECK(p.total_q == 8);
    CHECK(p.policy.heads == 16);
    CHECK(p.policy.max_seq_len_q == 2);
    CHECK_FALSE(p.policy.packed);
    CHECK(p.workspace_bytes == a.workspace_bytes());
    CHECK(p.out.data == addr(kOut));
  }
  SECTION("fixed mode with max_seq_len_q == SQ") {
    a.max_seq_len_q = 2;
    CHECK(a.validate().policy.max_seq_len_q == 2);
  }
  SECTION("packed mode") {
    a.make_packed(5, 3);
    const auto p = a.validate();
    CHECK(p.policy.packed);
    CHECK(p.policy.max_seq_len_q == 3);
    CHECK(p.total_q == 5);
  }
  SECTION("rank-4 cache [pages, 1, page, 576]") {
    a.kv_cache = TensorView::contiguous(addr(kCache), DType::kBf16, {300, 1, 64, 576});
    CHECK_NOTHROW(a.validate());
  }
  SECTION("fp8 e4m3 query and cache") {
    a.dtype = DType::kE4m3;
    a.rebuild();
    CHECK(a.validate().policy.dtype == DType::kE4m3);
  }
  SECTION("every page size") {
    for (int ps : {16, 32, 64, 128}) {
      a.page_size = ps;
      a.rebuild();
      CHECK(a.validate().policy.page_size == ps);
    }
  }
  SECTION("padded block-table rows and more pages than needed") {
    a.block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {4, 80});
    a.block_tables.strides[0] = 96;
    CHECK_NOTHROW(a.validate());
  }
  SECTION("a larger workspace, int8") {
    a.workspace = TensorView::contiguous(addr(kWork), DType::kI8, {static_cast<std::int64_t>(a.workspace_bytes() + 4096)});
    CHECK_NOTHROW(a.validate());
  }
  SECTION("absent out: the expected shape, no pointer") {
    a.out.reset();
    const auto p = a.validate();
    CHECK(p.out.data == nullptr);
    CHECK(p.out.rank == 4);
    CHECK(p.out.size(3) == 512);
    CHECK(p.out.numel() == 4 * 2 * 16 * 512);
  }
  SECTION("dense mask, H 1, H 128, SQ 8") {
    a.mask = MaskType::kDense;
    a.heads = 128;
    a.sq = 8;
    a.rebuild();
    CHECK_NOTHROW(a.validate());
    a.heads = 1;
    a.sq = 1;
    a.rebuild();
    CHECK_NOTHROW(a.validate());
  }
  SECTION("max_seq_len at the limit 2^31 - 32768") {
    a.max_seq_len = (1LL << 31) - 32768;
    a.rebuild();
    a.block_tables = at(a.block_tables, 0x100000000ULL);  // 128 MiB of table: keep it clear of the others
    CHECK_NOTHROW(a.validate());
  }
}

TEST_CASE("mla validation: kv_lora_rank and qk_rope_head_dim are fixed", "[unit]") {
  Args a;
  a.kv_lora_rank = 256;
  expect_unsupported(a, "kv_lora_rank", "256");
  a.kv_lora_rank = 512;
  a.qk_rope_head_dim = 128;
  expect_unsupported(a, "qk_rope_head_dim", "128");
}

TEST_CASE("mla validation: ranks and the 576-wide last dimension", "[unit]") {
  Args a;
  SECTION("fixed query must be rank 4") {
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {8, 16, 576});
    expect_invalid(a, "query", "rank 4");
  }
  SECTION("packed query must be rank 3") {
    a.make_packed(5, 2);
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {5, 1, 16, 576});
    expect_invalid(a, "query", "rank 3");
  }
  SECTION("query last dim") {
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {4, 2, 16, 512});
    expect_invalid(a, "query", "576");
  }
  SECTION("cache rank") {
    a.kv_cache = TensorView::contiguous(addr(kCache), DType::kBf16, {300 * 64, 576});
    expect_invalid(a, "kv_cache", "rank 3 or 4");
  }
  SECTION("cache last dim") {
    a.kv_cache = TensorView::contiguous(addr(kCache), DType::kBf16, {300, 64, 512});
    expect_invalid(a, "kv_cache", "576");
  }
  SECTION("rank-4 cache with axis 1 != 1") {
    a.kv_cache = TensorView::contiguous(addr(kCache), DType::kBf16, {300, 2, 64, 576});
    expect_invalid(a, "kv_cache", "dimension 1");
  }
  SECTION("block_tables rank") {
    a.block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {4 * 64});
    expect_invalid(a, "block_tables", "rank 2");
  }
  SECTION("seq_lens rank") {
    a.seq_lens = TensorView::contiguous(addr(kLens), DType::kI32, {4, 1});
    expect_invalid(a, "seq_lens", "rank 1");
  }
  SECTION("qo_indptr rank") {
    a.make_packed(5, 2);
    a.qo_indptr = TensorView::contiguous(addr(kIndptr), DType::kI32, {5, 1});
    expect_invalid(a, "qo_indptr", "rank 1");
  }
}

TEST_CASE("mla validation: dtypes", "[unit]") {
  Args a;
  SECTION("query fp16") {
    a.query.dtype = DType::kF16;
    expect_invalid(a, "query", "float16");
  }
  SECTION("query uint8 gets the DLPack fp8 hint") {
    a.query.dtype = DType::kU8;
    expect_invalid(a, "query", "DType::kE4m3");
  }
  SECTION("bf16 query with an e4m3 cache") {
    a.kv_cache.dtype = DType::kE4m3;
    expect_invalid(a, "kv_cache", "bfloat16");
  }
  SECTION("e4m3 query with a bf16 cache") {
    a.dtype = DType::kE4m3;
    a.rebuild();
    a.kv_cache.dtype = DType::kBf16;
    expect_invalid(a, "kv_cache", "float8_e4m3fn");
  }
  SECTION("block_tables int64") {
    a.block_tables.dtype = DType::kI64;
    expect_invalid(a, "block_tables", "int32");
  }
  SECTION("seq_lens int64") {
    a.seq_lens.dtype = DType::kI64;
    expect_invalid(a, "seq_lens", "int32");
  }
  SECTION("qo_indptr int64") {
    a.make_packed(5, 2);
    a.qo_indptr->dtype = DType::kI64;
    expect_invalid(a, "qo_indptr", "int32");
  }
  SECTION("workspace int32") {
    a.workspace.dtype = DType::kI32;
    expect_invalid(a, "workspace_buffer", "uint8 or int8");
  }
  SECTION("out fp32") {
    a.out->dtype = DType::kF32;
    expect_invalid(a, "out", "bfloat16");
  }
  SECTION("out_dtype fp16 is not implemented") {
    a.out_dtype = DType::kF16;
    a.out->dtype = DType::kF16;
    expect_unsupported(a, "out_dtype", "float16");
  }
}

TEST_CASE("mla validation: page size", "[unit]") {
  Args a;
  for (int ps : {8, 48, 256}) {
    a.kv_cache = TensorView::contiguous(addr(kCache), DType::kBf16, {300, ps, 576});
    expect_unsupported(a, "kv_cache", "page_size " + std::to_string(ps));
  }
}

TEST_CASE("mla validation: contiguity and alignment", "[unit]") {
  Args a;
  SECTION("query not contiguous") {
    a.query = with_stride(a.query, 2, 640);
    expect_invalid(a, "query", "contiguous");
  }
  SECTION("cache not contiguous (padded rows)") {
    a.kv_cache = with_stride(a.kv_cache, 1, 640);
    expect_invalid(a, "kv_cache", "contiguous");
  }
  SECTION("out not contiguous") {
    a.out = with_stride(*a.out, 0, 2 * 16 * 512 + 64);
    expect_invalid(a, "out", "contiguous");
  }
  SECTION("seq_lens not contiguous") {
    a.seq_lens = with_stride(a.seq_lens, 0, 2);
    expect_invalid(a, "seq_lens", "contiguous");
  }
  SECTION("workspace not contiguous") {
    a.workspace = TensorView::contiguous(addr(kWork), DType::kU8, {2, static_cast<std::int64_t>(a.workspace_bytes())});
    a.workspace.strides[0] = static_cast<std::int64_t>(a.workspace_bytes()) + 256;
    expect_invalid(a, "workspace_buffer", "contiguous");
  }
  SECTION("query 16-byte alignment") {
    a.query = shifted(a.query, 8);
    expect_invalid(a, "query", "16-byte aligned");
  }
  SECTION("cache 16-byte alignment") {
    a.kv_cache = shifted(a.kv_cache, 2);
    expect_invalid(a, "kv_cache", "16-byte aligned");
  }
  SECTION("out 16-byte alignment") {
    a.out = shifted(*a.out, 8);
    expect_invalid(a, "out", "16-byte aligned");
  }
  SECTION("workspace 32-byte alignment") {
    a.workspace = shifted(a.workspace, 16);
    expect_invalid(a, "workspace_buffer", "32-byte aligned");
  }
  SECTION("null query") {
    a.query.data = nullptr;
    expect_invalid(a, "query", "null");
  }
}

TEST_CASE("mla validation: block tables", "[unit]") {
  Args a;
  SECTION("row count != B") {
    a.block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {3, 64});
    expect_invalid(a, "block_tables", "size 4 in dimension 0");
  }
  SECTION("inner stride 2") {
    a.block_tables = with_stride(a.block_tables, 1, 2);
    a.block_tables.strides[0] = 128;
    expect_invalid(a, "block_tables", "stride(1) == 1");
  }
  SECTION("row stride < max_pages") {
    a.block_tables = with_stride(a.block_tables, 0, 32);
    expect_invalid(a, "block_tables", "row stride >= max_pages = 64");
  }
  SECTION("max_pages < ceil(max_seq_len / page_size)") {
    a.max_seq_len = 4097;  // needs 65 pages of 64
    expect_invalid(a, "block_tables", "= 65");
  }
  SECTION("element count over int32") {
    a.block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {4, 1LL << 30});
    expect_invalid(a, "block_tables", "2^31 - 1 elements");
  }
}

TEST_CASE("mla validation: seq_lens and qo_indptr sizes", "[unit]") {
  Args a;
  SECTION("seq_lens length != B") {
    a.seq_lens = TensorView::contiguous(addr(kLens), DType::kI32, {5});
    expect_invalid(a, "seq_lens", "size 4");
  }
  SECTION("qo_indptr length != B + 1") {
    a.make_packed(5, 2);
    a.qo_indptr = TensorView::contiguous(addr(kIndptr), DType::kI32, {4});
    expect_invalid(a, "qo_indptr", "size 5");
  }
  SECTION("packed total_q > B * max_seq_len_q") {
    a.make_packed(9, 2);
    expect_invalid(a, "query", "4 * 2 = 8 tokens");
  }
}

TEST_CASE("mla validation: workspace size and overlap", "[unit]") {
  Args a;
  const auto need = static_cast<std::int64_t>(a.workspace_bytes());
  SECTION("one byte short") {
    a.workspace = TensorView::contiguous(addr(kWork), DType::kU8, {need - 1});
    expect_invalid(a, "workspace_buffer", std::to_string(need) + " bytes");
  }
  SECTION("overlaps query") {
    a.workspace = at(a.workspace, kQuery + 4096);
    expect_invalid(a, "workspace_buffer", "'query'");
  }
  SECTION("overlaps kv_cache") {
    a.workspace = at(a.workspace, kCache);
    expect_invalid(a, "workspace_buffer", "'kv_cache'");
  }
  SECTION("overlaps block_tables") {
    a.workspace = at(a.workspace, kTables - 256);
    expect_invalid(a, "workspace_buffer", "'block_tables'");
  }
  SECTION("overlaps seq_lens") {
    a.workspace = at(a.workspace, kLens - 32);
    expect_invalid(a, "workspace_buffer", "'seq_lens'");
  }
  SECTION("overlaps qo_indptr") {
    a.make_packed(5, 2);
    a.workspace = at(a.workspace, kIndptr - 64);
    expect_invalid(a, "workspace_buffer", "'qo_indptr'");
  }
  SECTION("overlaps out") {
    a.workspace = at(a.workspace, kOut + 1024);
    expect_invalid(a, "workspace_buffer", "'out'");
  }
}

TEST_CASE("mla validation: out shape, dtype and overlap with inputs", "[unit]") {
  Args a;
  SECTION("fixed out with 576 columns") {
    a.out = TensorView::contiguous(addr(kOut), DType::kBf16, {4, 2, 16, 576});
    expect_invalid(a, "out", "[4, 2, 16, 512]");
  }
  SECTION("fixed out with the wrong SQ") {
    a.out = TensorView::contiguous(addr(kOut), DType::kBf16, {4, 1, 16, 512});
    expect_invalid(a, "out", "[4, 2, 16, 512]");
  }
  SECTION("packed out with the wrong token count") {
    a.make_packed(5, 2);
    a.out = TensorView::contiguous(addr(kOut), DType::kBf16, {6, 16, 512});
    expect_invalid(a, "out", "[5, 16, 512]");
  }
  SECTION("out overlaps query") {
    a.out = at(*a.out, kQuery + 1024);
    expect_invalid(a, "out", "'query'");
  }
  SECTION("out overlaps kv_cache") {
    a.out = at(*a.out, kCache + 4096);
    expect_invalid(a, "out", "'kv_cache'");
  }
  SECTION("out overlaps block_tables") {
    a.out = at(*a.out, kTables);
    expect_invalid(a, "out", "'block_tables'");
  }
  SECTION("out overlaps seq_lens") {
    a.out = at(*a.out, kLens - 64);
    expect_invalid(a, "out", "'seq_lens'");
  }
  SECTION("out overlaps qo_indptr") {
    a.make_packed(5, 2);
    a.out = at(*a.out, kIndptr - 128);
    expect_invalid(a, "out", "'qo_indptr'");
  }
}

TEST_CASE("mla validation: bmm scales finite and > 0 as float32", "[unit]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {0.0, -1.0, nan, inf, -inf, 1e-50 /* 0 as float */, 1e39 /* inf as float */}) {
    Args a;
    a.bmm1_scale = bad;
    expect_invalid(a, "bmm1_scale");
    a.bmm1_scale = 1.0;
    a.bmm2_scale = bad;
    expect_invalid(a, "bmm2_scale");
  }
}

TEST_CASE("mla validation: query length bounds (packed / fixed)", "[unit]") {
  Args a;
  SECTION("packed without max_seq_len_q") {
    a.make_packed(5, 2);
    a.max_seq_len_q.reset();
    expect_invalid(a, "max_seq_len_q", "required");
  }
  SECTION("fixed with max_seq_len_q != SQ") {
    a.max_seq_len_q = 3;
    expect_invalid(a, "max_seq_len_q", "SQ = query.size(1) = 2");
  }
  SECTION("fixed SQ 65 is not implemented, SQ 0 is invalid") {
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {4, 65, 16, 576});
    expect_unsupported(a, "query", "SQ 65");
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {4, 0, 16, 576});
    expect_invalid(a, "query", "1..64");
  }
  SECTION("packed max_seq_len_q 65 / 0") {
    a.make_packed(5, 2);
    a.max_seq_len_q = 65;
    expect_unsupported(a, "max_seq_len_q", "65");
    a.max_seq_len_q = 0;
    expect_invalid(a, "max_seq_len_q", "0");
  }
  SECTION("heads 129 is not implemented, 0 is invalid") {
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {4, 2, 129, 576});
    expect_unsupported(a, "query", "129 heads");
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {4, 2, 0, 576});
    expect_invalid(a, "query", "1..128");
  }
  SECTION("B * max_seq_len_q * H over int32") {
    // 2^22 requests * 8 * 128 = 2^32 rows (the view is never dereferenced).
    const std::int64_t b = 1LL << 22;
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {b, 8, 128, 576});
    a.seq_lens = TensorView::contiguous(addr(kLens), DType::kI32, {b});
    a.block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {b, 64});
    expect_invalid(a, "query", "2^31 - 1");
  }
  SECTION("batch over the grid limit") {
    const std::int64_t b = 65536;
    a.query = TensorView::contiguous(addr(kQuery), DType::kBf16, {b, 1, 1, 576});
    a.seq_lens = TensorView::contiguous(addr(kLens), DType::kI32, {b});
    a.block_tables = TensorView::contiguous(addr(kTables), DType::kI32, {b, 64});
    expect_unsupported(a, "query", "65535");
  }
}

TEST_CASE("mla validation: max_seq_len range", "[unit]") {
  Args a;
  for (long long bad : {0LL, -1LL, (1LL << 31) - 32767, 1LL << 40}) {
    a.max_seq_len = bad;
    expect_invalid(a, "max_seq_len", std::to_string(bad));
  }
}

TEST_CASE("mla validation: bad mask value", "[unit]") {
  Args a;
  a.mask = static_cast<MaskType>(7);
  expect_invalid(a, "mask_type");
}

TEST_CASE("mla launch with no query rows returns without a driver", "[unit]") {
  // No GPU is needed: an empty launch never reaches the kernel service or the driver.
  kiln::mla::register_mla_family();
  Args a;
  SECTION("packed total_q == 0, out given") {
    a.make_packed(0, 2);
    const TensorView o = a.launch();
    CHECK(o.data == addr(kOut));
    CHECK(o.numel() == 0);
  }
  SECTION("packed total_q == 0, out absent: nothing allocated") {
    a.make_packed(0, 2);
    a.out.reset();
    const TensorView o = a.launch();
    CHECK(o.data == nullptr);
    CHECK(o.rank == 3);
    CHECK(o.size(0) == 0);
    CHECK(o.size(1) == 16);
    CHECK(o.size(2) == 512);
  }
  SECTION("packed total_q == 0 still validates its arguments") {
    a.make_packed(0, 2);
    a.bmm1_scale = 0.0;
    expect_invalid(a, "bmm1_scale");
  }
  SECTION("fixed B == 0") {
    a.batch = 0;
    a.rebuild();
    a.out.reset();
    const TensorView o = a.launch();
    CHECK(o.data == nullptr);
    CHECK(o.numel() == 0);
  }
}

TEST_CASE("mla workspace size helper", "[unit]") {
  using kiln::mla::mla_workspace_size;
  const auto size = [](int heads, int sq, bool packed, DType dt, int batch) {
    return mla_workspace_size(heads, 64, 163840, sq, packed, dt, DType::kBf16, MaskType::kCausal, batch);
  };
  kiln::mla::MlaDecodePolicy p;
  p.heads = 128;
  p.page_size = 64;
  p.max_seq_len = 163840;
  p.max_seq_len_q = 2;
  p.dtype = DType::kE4m3;
  CHECK(size(128, 2, false, DType::kE4m3, 8) == kiln::mla::workspace_size(p, 8));
  CHECK(size(128, 2, false, DType::kE4m3, 0) == 0);
  // A single short request never splits: nothing to store.
  CHECK(mla_workspace_size(16, 64, 32, 1, false, DType::kBf16, DType::kBf16, MaskType::kDense, 1) == 0);
  CHECK(size(16, 1, false, DType::kBf16, 1) > 0);

  const auto expect = [](auto&& f, ErrorCode code, const std::string& arg) {
    try {
      f();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == code);
      CHECK_THAT(e.what(), Catch::Contains("argument '" + arg + "'"));
    }
  };
  expect([&] { size(0, 1, false, DType::kBf16, 1); }, ErrorCode::kInvalidArgument, "heads");
  expect([&] { size(256, 1, false, DType::kBf16, 1); }, ErrorCode::kUnsupported, "heads");
  expect([&] { size(16, 65, false, DType::kBf16, 1); }, ErrorCode::kUnsupported, "max_seq_len_q");
  expect([&] { size(16, 1, false, DType::kF16, 1); }, ErrorCode::kUnsupported, "dtype");
  expect([&] { size(16, 1, false, DType::kBf16, -1); }, ErrorCode::kInvalidArgument, "batch");
  expect([&] { mla_workspace_size(16, 48, 4096, 1, false, DType::kBf16, DType::kBf16, MaskType::kCausal, 1); },
         ErrorCode::kUnsupported, "page_size");
  expect([&] { mla_workspace_size(16, 64, 0, 1, false, DType::kBf16, DType::kBf16, MaskType::kCausal, 1); },
         ErrorCode::kInvalidArgument, "max_seq_len");
  expect([&] { mla_workspace_size(16, 64, 4096, 1, false, DType::kBf16, DType::kF16, MaskType::kCausal, 1); },
         ErrorCode::kUnsupported, "out_dtype");
}

TEST_CASE("mla_decode family: policy canonicalisation, keys and rendered names", "[unit]") {
  kiln::mla::register_mla_family();
  using nlohmann::json;
  const kiln::Family& f = kiln::find_family("mla_decode");

  const json canonical = f.canonicalize({{"heads", 128}, {"max_seq_len", 163840}});
  CHECK(canonical == json{{"heads", 128},
                          {"page_size", 64},
                          {"max_seq_len", 163840},
                          {"max_seq_len_q", 1},
                          {"packed", false},
                          {"dtype", "bf16"},
                          {"out_dtype", "bf16"},
                          {"mask", "causal"},
                          {"kernel", "auto"},
                          {"precision", "exact"}});

  const auto rejects = [&](const json& policy, const std::string& needle) {
    INFO(policy.dump());
    try {
      f.canonicalize(policy);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(needle));
    }
  };
  rejects({{"max_seq_len", 4096}}, "'heads'");
  rejects({{"heads", 16}}, "'max_seq_len'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"head", 1}}, "no field 'head'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"dtype", "fp16"}}, "'dtype'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"out_dtype", "fp16"}}, "'out_dtype'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"mask", "sliding"}}, "'mask'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"packed", 1}}, "'packed'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"page_size", 48}}, "'page_size'");
  rejects({{"heads", 16}, {"max_seq_len", 0}}, "'max_seq_len'");
  rejects({{"heads", 129}, {"max_seq_len", 4096}}, "'heads'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"max_seq_len_q", 65}}, "'max_seq_len_q'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"kernel", "tcgen05"}}, "'kernel'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"dtype", "fp8_e4m3"}, {"kernel", "wgmma_kv"}}, "'kernel'");
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"precision", "fp32"}}, "'precision'");
  // fp8 pages run on one f16 P: only the exact precision names them.
  rejects({{"heads", 16}, {"max_seq_len", 4096}, {"dtype", "fp8_e4m3"}, {"precision", "bf16"}}, "use \"exact\"");
  CHECK(f.canonicalize({{"heads", 16}, {"max_seq_len", 4096}, {"precision", "bf16"}})["precision"] == "bf16");

  kiln::mla::MlaDecodePolicy p;
  p.heads = 64;
  p.page_size = 64;
  p.max_seq_len = 163840;
  p.max_seq_len_q = 2;
  p.dtype = DType::kE4m3;
  p.mask = MaskType::kDense;
  const kiln::SemanticKey key = p.key("sm_90a");
  CHECK(kiln::SemanticKey::parse(key.str()) == key);
  CHECK(key.policy()["dtype"] == "fp8_e4m3");
  CHECK(key.policy()["mask"] == "dense");

  const kiln::KernelSource src = f.render(key.policy());
  CHECK_THAT(src.source, Catch::Contains("mla_decode/kernel.cuh"));
  REQUIRE(src.name_expressions.size() == 1);
  CHECK(src.name_expressions[kiln::kMlaDecodeEntry] == kiln::mla::decode_kernel_name(p));
  // H and SQ are run-time values. e4m3 pages compile one kernel for every row count; bf16 pages one
  // per row class (mla_row_class), here 128 rows: two 64-row tiles, a cluster pair.
  CHECK_THAT(src.name_expressions[0], Catch::StartsWith("kiln::mla_decode_kernel<64, 64, false, true,"));
  const auto name = [&](const kiln::mla::MlaDecodePolicy& q) { return f.render(q.key("sm_90a").policy()).name_expressions; };
  kiln::mla::MlaDecodePolicy other = p;
  other.heads = 16;
  other.max_seq_len_q = 1;
  CHECK(name(other) == src.name_expressions);
  kiln::mla::MlaDecodePolicy bf16 = p;
  bf16.dtype = DType::kBf16;
  CHECK_THAT(name(bf16)[0], Catch::StartsWith("kiln::mla_decode_kernel<128, 64, false, false,"));
  other = bf16;
  other.heads = 128;
  other.max_seq_len_q = 1;
  CHECK(name(other) == name(bf16));
  other.max_seq_len_q = 2;  // 256 rows: four tiles, still paired
  CHECK(name(other) == name(bf16));
  other.heads = 96;  // 192 rows: three tiles, no pairs
  CHECK(name(other) != name(bf16));
  // The combine is the companion key's module: heads, max_seq_len_q and packed, nothing else.
  const kiln::mla::MlaCombinePolicy cp{p.heads, p.max_seq_len_q, p.packed};
  const std::vector<kiln::SemanticKey> companions = kiln::companion_keys(key);
  REQUIRE(companions.size() == 1);
  CHECK(companions[0] == cp.key("sm_90a"));
  CHECK(companions[0].str().rfind("mla_combine:sm_90a:heads=64,max_seq_len_q=2,packed=false:", 0) == 0);
  CHECK(kiln::companion_keys(companions[0]).empty());
  const kiln::KernelSource combine = kiln::find_family("mla_combine").render(companions[0].policy());
  CHECK_THAT(combine.source, Catch::Contains("mla_decode/combine.cuh"));
  REQUIRE(combine.name_expressions.size() == 2);
  CHECK(combine.name_expressions[kiln::kMlaCombineEntry] == kiln::mla::combine_kernel_name(cp));
  CHECK(combine.name_expressions[kiln::kMlaCombineWideEntry] == kiln::mla::combine_kernel_name(cp, true));
  CHECK(combine.name_expressions[0] == "kiln::mla_combine_kernel<64, 2, false>");
  CHECK(combine.name_expressions[1] == "kiln::mla_combine_wide_kernel<64, 2, false>");
  try {
    kiln::mla::MlaCombinePolicy{0, 1, false}.validate();
    FAIL("heads 0 accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("argument 'heads'") && Catch::Contains("1..128"));
  }

  // Every key field changes the fast-path fingerprint.
  kiln::mla::MlaDecodePolicy q = p;
  CHECK(q.fingerprint() == p.fingerprint());
  q.mask = MaskType::kCausal;
  CHECK(q.fingerprint() != p.fingerprint());
  q = p;
  q.max_seq_len += 1;
  CHECK(q.fingerprint() != p.fingerprint());
  q = p;
  q.packed = true;
  CHECK(q.fingerprint() != p.fingerprint());
  q = p;
  q.dtype = DType::kBf16;
  CHECK(q.fingerprint() != p.fingerprint());
  q = p;
  q.kernel = kiln::mla::MlaKernel::kMmaSync;
  CHECK(q.fingerprint() != p.fingerprint());
  q.dtype = DType::kBf16;
  q.kernel = kiln::mla::MlaKernel::kWgmma;
  const std::uint64_t wgmma_print = q.fingerprint();
  q.kernel = kiln::mla::MlaKernel::kWgmmaKv;
  CHECK(q.fingerprint() != wgmma_print);
  CHECK(q.key("sm_90a").policy()["kernel"] == "wgmma_kv");
  q.precision = kiln::mla::MlaPrecision::kBf16;
  CHECK(q.fingerprint() != p.fingerprint());
  const kiln::SemanticKey one_p = q.key("sm_90a");
  CHECK(one_p.policy()["precision"] == "bf16");
  CHECK(kiln::SemanticKey::parse(one_p.str()) == one_p);
  // The precision is the decode kernel's last template argument (the combine does not depend on it).
  CHECK_THAT(kiln::mla::decode_kernel_name(q), Catch::EndsWith(", 3, 1>"));
  CHECK_THAT(kiln::mla::decode_kernel_name(p), Catch::EndsWith(", 0>"));
  CHECK(kiln::companion_keys(q.key("sm_90a")) == kiln::companion_keys(p.key("sm_90a")));
}

// The decode kernel is instantiated for mla_row_class(H, SQ) rows and takes H and SQ at run time, so
// everything compiled into it from the row count must be the same for the class as for (H, SQ).
TEST_CASE("mla row class: the same variant and TMA cluster as the heads and query rows it stands for", "[unit]") {
  int classes_seen = 0;
  for (int heads = 1; heads <= 128; ++heads) {
    for (int sq = 1; sq <= kiln::kMlaMaxSeqLenQ; ++sq) {
      for (int kernel = kiln::kMlaKernelAuto; kernel <= kiln::kMlaKernelWgmmaKv; ++kernel) {
        for (int bits = 0; bits < 16; ++bits) {
          const bool fp8 = bits & 1, split_p = bits & 2, sm90a = bits & 4, packed = bits & 8;
          if (fp8 && kernel == kiln::kMlaKernelWgmmaKv) continue;  // a policy the family refuses
          const int cls = kiln::mla_row_class(kernel, heads, sq, fp8);
          INFO("H " << heads << ", SQ " << sq << ", kernel " << kernel << ", bits " << bits << ", class " << cls);
          REQUIRE(kiln::mla_row_class(kernel, cls, 1, fp8) == cls);
          classes_seen |= 1 << (cls / 16);
          const kiln::MlaVariant a = kiln::mla_variant(kernel, heads, sq, fp8, split_p, sm90a);
          const kiln::MlaVariant b = kiln::mla_variant(kernel, cls, 1, fp8, split_p, sm90a);
          REQUIRE(a.wgmma == b.wgmma);
          REQUIRE(a.kv_rows == b.kv_rows);
          REQUIRE(a.kv_warpgroups == b.kv_warpgroups);
          REQUIRE(a.tile.row_groups == b.tile.row_groups);
          REQUIRE(a.tile.col_groups == b.tile.col_groups);
          REQUIRE(a.tile.tile_tokens == b.tile.tile_tokens);
          REQUIRE(a.tile.stages == b.tile.stages);
          for (int page : {1, 8, 16, 64}) {
            REQUIRE(kiln::mla_kv_tma_ctas(a, fp8, heads, sq, packed, page) ==
                    kiln::mla_kv_tma_ctas(b, fp8, cls, 1, packed, page));
          }
        }
      }
    }
  }
  // 16, 32, 64, 128 (an even number of 64-row tiles) and 192 (an odd number above one)
  CHECK(classes_seen == ((1 << 1) | (1 << 2) | (1 << 4) | (1 << 8) | (1 << 12)));
  // e4m3 pages and the mma.sync kernel: one class for every row count
  CHECK(kiln::mla_row_class(kiln::kMlaKernelAuto, 128, 2, true) == kiln::mla_row_class(kiln::kMlaKernelAuto, 1, 1, true));
  CHECK(kiln::mla_row_class(kiln::kMlaKernelMmaSync, 128, 2, false) == kiln::mla_row_class(kiln::kMlaKernelMmaSync, 1, 1, false));
}

// The kernels take a row's query index as a multiply and shift by mla_heads_recip(H); it must equal
// row / H for every head count and every row a request can have.
TEST_CASE("mla query of row: the reciprocal of H divides exactly over every H and row", "[unit]") {
  for (int heads = 1; heads <= 128; ++heads) {
    const unsigned recip = kiln::mla_heads_recip(heads);
    int wrong = 0, first_wrong = -1;
    for (int row = 0; row < heads * kiln::kMlaMaxSeqLenQ; ++row) {
      if (kiln::mla_query_of_row(row, recip) != row / heads && wrong++ == 0) first_wrong = row;
    }
    INFO("H " << heads << ", first wrong row " << first_wrong);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("mla planner: kernel variant per arch, parts, geometry, workspace bound", "[unit]") {
  using kiln::mla::MlaDecodePolicy;
  const kiln::DeviceLimits h200{.sm_count = 132, .smem_per_sm = 233472, .smem_per_block_optin = 232448,
                                .smem_reserved_per_block = 1024};
  const kiln::DeviceLimits sm120{.sm_count = 84, .smem_per_sm = 102400, .smem_per_block_optin = 101376,
                                 .smem_reserved_per_block = 1024};
  MlaDecodePolicy p;
  p.heads = 128;
  p.page_size = 64;
  p.max_seq_len = 163840;

  // bf16 H 128: the wgmma kernel on sm_90a, two 64-row tiles, one CTA per SM.
  const kiln::mla::MlaPlan w = kiln::mla::plan(p, 4, h200, "sm_90a");
  CHECK(w.variant.wgmma);
  CHECK(w.decode.grid[0] == 66);
  CHECK(w.decode.grid[1] == 2);
  CHECK(w.decode.block[0] == 256);
  CHECK(w.decode.smem_bytes <= 232448);
  CHECK(w.needs_combine);
  CHECK(w.decode.pdl);
  CHECK(w.combine.pdl);
  // KV by TMA: two row tiles as a cluster pair; one row tile on its own CTA (no cluster), in either
  // precision; e4m3 pages are widened by a producer warpgroup instead.
  CHECK(w.kv_tma);
  CHECK(w.decode.cluster[1] == 2);
  for (const auto precision : {kiln::mla::MlaPrecision::kExact, kiln::mla::MlaPrecision::kBf16}) {
    MlaDecodePolicy one_tile = p;
    one_tile.heads = 64;
    one_tile.precision = precision;
    const kiln::mla::MlaPlan t = kiln::mla::plan(one_tile, 4, h200, "sm_90a");
    CHECK(t.kv_tma);
    CHECK(t.decode.grid[1] == 1);
    CHECK(t.decode.cluster[1] == 0);
  }
  MlaDecodePolicy e4m3 = p;
  e4m3.dtype = kiln::DType::kE4m3;
  CHECK_FALSE(kiln::mla::plan(e4m3, 4, h200, "sm_90a").kv_tma);
  // Batch 4 over 66 parts (~17 pieces per request): four warps per row, one row per CTA; one request
  // (66 pieces): the eight-warp form.
  CHECK(w.combine_entry == kiln::kMlaCombineEntry);
  CHECK(w.combine_row_warps == 4);
  CHECK(w.combine.grid[0] == 128);
  CHECK(w.combine.grid[1] == 4);
  CHECK(w.combine.block[0] == 128);
  const kiln::mla::MlaPlan w1 = kiln::mla::plan(p, 1, h200, "sm_90a");
  CHECK(w1.combine_entry == kiln::kMlaCombineWideEntry);
  CHECK(w1.combine_row_warps == 0);
  CHECK(w1.combine.grid[0] == 128);
  CHECK(w1.combine.block[0] == 256);
  // Batch 64 over 66 parts (about 2 pieces per request): a warp per row, four rows per CTA ...
  const kiln::mla::MlaPlan w64 = kiln::mla::plan(p, 64, h200, "sm_90a");
  CHECK(w64.combine_entry == kiln::kMlaCombineEntry);
  CHECK(w64.combine_row_warps == 1);
  CHECK(w64.combine.grid[0] == 32);
  CHECK(w64.combine.grid[1] == 64);
  CHECK(w64.combine.block[0] == 128);
  // ... but not with fewer than 8 rows per SM (H 16 over 132 parts, B 64: 1,024 rows).
  MlaDecodePolicy h16 = p;
  h16.heads = 16;
  const kiln::mla::MlaPlan w16 = kiln::mla::plan(h16, 64, h200, "sm_90a");
  CHECK(w16.num_parts == 132);
  CHECK(w16.combine_row_warps == 4);
  CHECK(w16.combine.grid[0] == 16);
  CHECK(kiln::mla::plan(h16, 128, h200, "sm_90a").combine_row_warps == 1);
  CHECK(w.workspace.max_parts >= w.num_parts);

  // fp8 H 128: the wgmma kernel with its producer warpgroup (384 threads), within the opt-in limit.
  MlaDecodePolicy f8 = p;
  f8.dtype = DType::kE4m3;
  const kiln::mla::MlaPlan w8 = kiln::mla::plan(f8, 4, h200, "sm_90a");
  CHECK(w8.variant.wgmma);
  CHECK(w8.decode.grid[1] == 2);
  CHECK(w8.decode.block[0] == 384);
  CHECK(w8.decode.smem_bytes <= 232448);
  CHECK(w8.decode.smem_bytes != w.decode.smem_bytes);

  // The same key on sm_120a: the 16-row mma.sync configuration.
  const kiln::mla::MlaPlan s = kiln::mla::plan(p, 4, sm120, "sm_120a");
  CHECK_FALSE(s.variant.wgmma);
  CHECK(s.decode.grid[1] == 8);
  CHECK(s.workspace.max_parts >= s.num_parts);

  // Every head count, query length and dtype fits sm_120's ~99 KB per block.
  for (int heads : {1, 7, 16, 64, 128})
    for (int sq : {1, 8, 64})
      for (bool fp8 : {false, true}) {
        MlaDecodePolicy q = p;
        q.heads = heads;
        q.max_seq_len_q = sq;
        q.dtype = fp8 ? DType::kE4m3 : DType::kBf16;
        INFO("heads " << heads << " sq " << sq << " fp8 " << fp8);
        CHECK(kiln::mla::plan(q, 1, sm120, "sm_120a").decode.smem_bytes <= 101376);
        q.kernel = kiln::mla::MlaKernel::kMmaSync;  // forced on the H200: the same configuration
        CHECK(kiln::mla::plan(q, 1, h200, "sm_90a").decode.smem_bytes <= 101376);
      }

  // Small head counts: bf16 up to 32 rows on the KV-on-M kernel, more rows and every fp8 key on the
  // heads-on-M wgmma kernel; wgmma off sm_90a is refused.
  MlaDecodePolicy small = p;
  small.heads = 16;
  for (int sq : {1, 2, 3}) {
    small.max_seq_len_q = sq;
    const kiln::MlaVariant v = kiln::mla::plan(small, 1, h200, "sm_90a").variant;
    INFO("H 16 SQ " << sq);
    CHECK(v.wgmma);
    CHECK(v.kv_rows == (sq == 1 ? 16 : sq == 2 ? 32 : 0));
    small.dtype = DType::kE4m3;
    const kiln::MlaVariant v8 = kiln::mla::plan(small, 1, h200, "sm_90a").variant;
    CHECK(v8.wgmma);
    CHECK(v8.kv_rows == 0);
    small.dtype = DType::kBf16;
  }
  small.max_seq_len_q = 1;
  small.kernel = kiln::mla::MlaKernel::kWgmma;
  CHECK(kiln::mla::plan(small, 1, h200, "sm_90a").variant.wgmma);
  CHECK(kiln::mla::plan(small, 1, h200, "sm_90a").variant.kv_rows == 0);
  try {
    kiln::mla::plan(small, 1, sm120, "sm_120a");
    FAIL("wgmma accepted on sm_120a");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnsupported);
    CHECK_THAT(e.what(), Catch::Contains("'kernel'"));
  }

  // The KV-on-M kernel: 16 or 32 query rows per CTA, one CTA per SM; any row count folds into row
  // tiles of that size. One warpgroup, but two at 32 rows with P as hi + lo (exact). Refused off
  // sm_90a like wgmma.
  small.kernel = kiln::mla::MlaKernel::kWgmmaKv;
  for (const auto precision : {kiln::mla::MlaPrecision::kExact, kiln::mla::MlaPrecision::kBf16}) {
    for (int sq : {1, 2, 3, 64}) {
      small.max_seq_len_q = sq;
      small.precision = precision;
      const kiln::mla::MlaPlan kv = kiln::mla::plan(small, 3, h200, "sm_90a");
      const int n = 16 * sq <= 16 ? 16 : 32;
      const int warpgroups = n == 32 && precision == kiln::mla::MlaPrecision::kExact ? 2 : 1;
      INFO("H 16 SQ " << sq << " precision " << static_cast<int>(precision));
      CHECK(kv.variant.wgmma);
      CHECK(kv.variant.kv_rows == n);
      CHECK(kv.variant.kv_warpgroups == warpgroups);
      CHECK(kv.decode.block[0] == static_cast<unsigned>(128 * warpgroups));
      CHECK(kv.decode.grid[1] == static_cast<unsigned>((16 * sq + n - 1) / n));
      CHECK(kv.decode.grid[0] == 132 / kv.decode.grid[1]);
      CHECK(kv.decode.smem_bytes <= 232448);
      CHECK(kv.workspace.max_parts >= kv.num_parts);
    }
  }
  small.precision = kiln::mla::MlaPrecision::kExact;
  CHECK_THROWS_AS(kiln::mla::plan(small, 1, sm120, "sm_120a"), Error);

  // One KV block per request can never split: no combine, no workspace.
  MlaDecodePolicy one_block = p;
  one_block.max_seq_len = 32;
  CHECK(kiln::mla::workspace_size(one_block, 8) == 0);
  CHECK_FALSE(kiln::mla::plan(one_block, 8, h200, "sm_90a").needs_combine);

  // The workspace holds a record per request and a slot per (request or part boundary) and row.
  const kiln::mla::WorkspaceLayout ws = kiln::mla::workspace_layout(p, 4);
  CHECK(ws.lse_bytes == static_cast<std::size_t>(4 + ws.max_parts - 1) * 128 * 4);
  CHECK(ws.o_bytes == ws.lse_bytes * 512);
  CHECK(ws.total_bytes >= ws.o_offset + ws.o_bytes);
}

TEST_CASE("mla family: keys that differ only in the mask share one cubin", "[unit]") {
  kiln::register_builtin_families();
  kiln::mla::MlaDecodePolicy dense;
  dense.heads = 128;
  dense.page_size = 64;
  dense.max_seq_len = 163840;
  dense.mask = MaskType::kDense;
  kiln::mla::MlaDecodePolicy causal = dense;
  causal.mask = MaskType::kCausal;
  for (const int sq : {1, 2}) {
    for (const bool packed : {false, true}) {
      dense.max_seq_len_q = causal.max_seq_len_q = sq;
      dense.packed = causal.packed = packed;
      CHECK(causal.key("sm_90a") != dense.key("sm_90a"));  // the keys stay what the engine asked for
      CHECK(causal.fingerprint() != dense.fingerprint());
      const kiln::BuildRequest a = kiln::make_build_request(dense.key("sm_90a"));
      const kiln::BuildRequest b = kiln::make_build_request(causal.key("sm_90a"));
      CHECK(b.source.name_expressions[kiln::kMlaDecodeEntry] == kiln::mla::decode_kernel_name(causal));
      CHECK(a.source.name_expressions == b.source.name_expressions);
      CHECK(a.cache_key == b.cache_key);
      // The mask then reaches the kernel as a parameter: on for a causal key with rows to mask,
      // off with one query row, where every piece ends at the request's last key anyway.
      kiln::MlaDecodeParams pd{}, pc{};
      kiln::mla::set_policy_params(dense, pd);
      kiln::mla::set_policy_params(causal, pc);
      CHECK(!pd.causal);
      CHECK(pc.causal == (sq > 1));
      CHECK(pc.heads == 128);
      CHECK(pc.max_seq_len_q == sq);
      CHECK(pc.heads_recip == kiln::mla_heads_recip(128));
    }
  }
}
