// Sparse MLA decode over the DeepSeek-V4.1 caches (528-byte FP8 main, 288-byte FP4 extra) on the GPU,
// through the public launcher only (runtime/sparse_dsv41/launcher.h), against the oracle
// (tests/support/dsv41_reference: the exactly dequantized rows, the bf16 query as given, attention in
// double) at the contract's tolerance: output and LSE atol = rtol = 1e-2.
//
// Inputs (tests/support/dsv41_inputs, checked by the unit suite): per-case pools whose every byte
// that no valid candidate names is NaN (slot 0 and page padding included), masked and out-of-length
// slots naming slot 0 or an index far outside the pool, data rows of random finite codes over the
// writers' scale range.
//
// Every launch gets NaN-poisoned output, out_lse, mid_out and mid_lse. The matrix
// (tests/support/dsv41_matrix) touches every value of every conformance axis; each case runs the
// decode's own choice (twice: bitwise repeat), every variant the device has forced ("default" on
// sm_90a too, with its compact and its staged body), and for sweeps every forced num_splits, with
// enable_pdl on, off and unset in turn.
// The other tests check the bitwise rules: views of the same bytes, lse_scale, graph replay and
// enable_pdl, stale and shared split scratch, and T == 0.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_dsv41/family.h"
#include "kiln/runtime/sparse_dsv41/launch_plan.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "kiln/runtime/sparse_dsv41/planner.h"
#include "tests/support/case_filter.h"
#include "tests/support/device_buffer.h"
#include "tests/support/dsv41_inputs.h"
#include "tests/support/dsv41_matrix.h"
#include "tests/support/dsv41_reference.h"
#include "tests/support/graph_capture.h"
#include "tests/support/nvfp4_reference.h"
#include "tests/support/rng.h"
#include "tests/support/sparse_decode.h"

using namespace kiln::testing::dsv41_matrix;  // Dsv41Case, Launch, HostCase, the matrix and its helpers

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::dsv41::Dsv41Options;
using kiln::dsv41::Dsv41Plan;
using kiln::dsv41::Dsv41Variant;
using kiln::testing::base_seed;
using kiln::testing::DeviceBuffer;
namespace kt = kiln::testing;

constexpr int kDims = 512;
constexpr kt::Tolerance kTol{1e-2, 1e-2};  // output and LSE

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

kiln::KernelService& service() { return kiln::KernelService::global(); }
const std::string& device_arch() { return service().device_arch(0); }
bool on_sm90() { return device_arch() == "sm_90a"; }
kiln::dsv41::Dsv41Device device() {
  const kiln::sparse::SparseDevice d = kiln::sparse::sparse_device(service(), 0);
  return {d.arch, d.sms, false, d.residency};
}

Dsv41Variant to_kiln(Variant v) { return v == Variant::kDefault ? Dsv41Variant::kDefault : Dsv41Variant::kSm90; }

// Split scratch from elsewhere (a shared workspace): mid_out and mid_lse for S splits.
struct Scratch {
  void* mid_out = nullptr;
  void* mid_lse = nullptr;
  int splits = 0;
};

// Device buffers of one case; the launcher's tensor views over them.
struct DeviceCase : kt::SparseDecodeBuffers {
  const HostCase& h;
  const Dsv41Case& c;
  DeviceBuffer main_pool, extra_pool;
  TensorView main_view, extra_view;
  double lse_scale;
  std::optional<Scratch> external;  // used instead of mid_out / mid_lse when set

  explicit DeviceCase(const HostCase& hc, int round = 0)
      : SparseDecodeBuffers(hc.c.tokens, hc.c.heads, hc.c.chunks(), hc.rounds[0].idx.size(), hc.rounds[0].xidx.size()),
        h(hc),
        c(hc.c),
        main_pool(hc.main.bytes.size()),
        extra_pool(std::max<std::size_t>(hc.extra.bytes.size(), 1)),
        main_view(hc.main.view(main_pool.get(), hc.c.view)),
        extra_view(hc.c.has_extra ? hc.extra.view(extra_pool.get(), hc.c.extra_view) : TensorView{}),
        lse_scale(hc.c.lse_scale) {
    main_pool.upload(h.main.bytes);
    if (c.has_extra) extra_pool.upload(h.extra.bytes);
    upload(h.rounds[round]);
    sink.upload(h.sink);
  }

  CallBuffers buffers(bool with_scratch) const {
    CallBuffers b;
    b.main_cache = main_view;
    b.extra_cache = extra_view;
    b.q = q.get();
    b.indices = idx.get();
    b.extra_indices = xidx.get();
    b.lengths = len.get();
    b.extra_lengths = xlen.get();
    b.sink = sink.get();
    b.out = out.get();
    b.lse = lse.get();
    if (with_scratch) {
      const Scratch s = external.value_or(Scratch{mid_out.get(), mid_lse.get(), split_stride});
      b.mid_out = s.mid_out;
      b.mid_lse = s.mid_lse;
      b.splits = s.splits;
    }
    return b;
  }
  Dsv41Plan launch(const Launch& l, bool with_scratch, CUstream stream) const {
    const Call call = make_call(c, l, buffers(with_scratch), lse_scale);
    return kiln::dsv41::cake_sparse_mla_sm120_dsv41_mixed_decode(call.q, call.kv_cache, call.indices, call.output, call.out_lse, h.sm_scale,
                                                                call.opt, stream);
  }
  // The plan the launcher resolves for this call on this device, without launching.
  Dsv41Plan plan(const Launch& l, bool with_scratch = true) const {
    const Call call = make_call(c, l, buffers(with_scratch), lse_scale);
    return kiln::dsv41::plan_dsv41_decode(call.q, call.kv_cache, call.indices, call.output, call.out_lse, h.sm_scale, call.opt, device());
  }
};

struct Outputs : kt::SparseDecodeOutputs {
  Dsv41Plan plan;
};

// Poison, launch on the legacy stream, download.
Outputs run(DeviceCase& dev, const Launch& l, bool with_scratch) {
  dev.poison();
  const Dsv41Plan plan = dev.launch(l, with_scratch, nullptr);
  const kiln::Driver& d = kiln::Driver::get();
  d.check(d.cuCtxSynchronize(), "cuCtxSynchronize after dsv41 launch");
  return {kt::download_outputs(dev), plan};
}

std::string plan_string(const Dsv41Plan& p) {
  std::ostringstream s;
  s << kiln::dsv41::dsv41_variant_name(p.variant) << " " << p.head_tiles << "/" << p.num_splits << "/" << p.chunks_per_block;
  return s.str();
}

// ---- comparison ----

kt::SparseDecodeErrors compare(const Outputs& o, const Reference& ref, const Dsv41Case& c) {
  kt::SparseDecodeErrors r = kt::compare_outputs(o, ref.out, ref.lse, kTol, kTol);
  // A token with no candidate: exactly zero output, and -inf without a sink.
  for (int t = 0; t < c.tokens; ++t) {
    if (!ref.empty[t]) continue;
    for (int hd = 0; hd < c.heads; ++hd) {
      const std::size_t row = static_cast<std::size_t>(t) * c.heads + hd;
      for (int d = 0; d < kDims; ++d) r.bad_empty += (o.out[row * kDims + d] & 0x7fff) != 0;
      if (!c.sink) r.bad_empty += o.lse[row] != -std::numeric_limits<float>::infinity();
    }
  }
  return r;
}

// Errors over every launch of the suite against the oracle: the accuracy table the README quotes.
struct AccuracyTally {
  std::size_t launches = 0, elements = 0, outside = 0, lse_values = 0, lse_outside = 0;
  double max_err = 0, max_lse_err = 0, max_ratio = 0;
  std::string worst;

  void add(const Dsv41Case& c, const Launch& l, const kt::SparseDecodeErrors& cmp, std::size_t n, std::size_t n_lse) {
    ++launches;
    elements += n;
    lse_values += n_lse;
    outside += cmp.bad;
    lse_outside += cmp.bad_lse;
    max_err = std::max(max_err, cmp.max_err);
    max_lse_err = std::max(max_lse_err, cmp.max_lse_err);
    if (cmp.max_ratio > max_ratio) {
      max_ratio = cmp.max_ratio;
      worst = c.label() + " [" + l.name() + "]";
    }
  }
  void print(const char* what) const {
    std::printf("ACCURACY dsv41 %s: launches %zu  max|err| %.3e  max LSE err %.3e (atol = rtol = %.0e)  max err/tol %.3f  outputs outside "
                "%zu of %zu, LSE outside %zu of %zu\n  worst err/tol: %s\n",
                what, launches, max_err, max_lse_err, kTol.atol, max_ratio, outside, elements, lse_outside, lse_values, worst.c_str());
    std::fflush(stdout);
  }
};

// CHECKs one launch against the oracle; returns whether it passed (prints failures only).
bool check_against_oracle(const Dsv41Case& c, const Reference& ref, const Outputs& o, const Launch& l, AccuracyTally* tally) {
  const kt::SparseDecodeErrors cmp = compare(o, ref, c);
  if (tally) tally->add(c, l, cmp, ref.out.size(), ref.lse.size());
  if (!cmp.ok()) {
    std::printf("FAIL dsv41 %s [%s] plan %s: %zu bad outputs (%zu NaN), max|err| %.3g at %s (got %g, want %g); %zu bad LSE, max %.3g at %s "
                "(got %g, want %g); %zu wrong values in empty rows\n",
                c.label().c_str(), l.name().c_str(), plan_string(o.plan).c_str(), cmp.bad, cmp.nan, cmp.max_err,
                kt::output_position(c.heads, cmp.worst, false).c_str(), cmp.worst_got, cmp.worst_ref, cmp.bad_lse, cmp.max_lse_err,
                kt::output_position(c.heads, cmp.worst_lse, true).c_str(), o.lse[cmp.worst_lse], ref.lse[cmp.worst_lse], cmp.bad_empty);
    std::fflush(stdout);
  }
  INFO(c.label() << " [" << l.name() << "] plan " << plan_string(o.plan));
  INFO(cmp.bad << " outputs out of tolerance (" << cmp.nan << " NaN), max|err| " << cmp.max_err << " at "
               << kt::output_position(c.heads, cmp.worst, false) << "; " << cmp.bad_lse << " LSE out of tolerance, max " << cmp.max_lse_err
               << " at " << kt::output_position(c.heads, cmp.worst_lse, true) << "; " << cmp.bad_empty
               << " wrong values in rows without candidates");
  CHECK(cmp.ok());
  return cmp.ok();
}

// The plan a launch must report: the launcher's plan-only answer for the same call, the variant
// forced or kiln's choice for the device and the plan, that variant's tile count, a forced num_splits
// as normalised, precision 0.
void check_plan(const DeviceCase& dev, const Launch& l, const Dsv41Plan& got) {
  const Dsv41Case& c = dev.c;
  INFO(c.label() << " [" << l.name() << "] plan " << plan_string(got));
  CHECK(got == dev.plan(l));
  if (l.variant) CHECK(got.variant == to_kiln(*l.variant));
  if (!l.variant && !on_sm90()) CHECK(got.variant == Dsv41Variant::kDefault);
  const int tiles = got.variant == Dsv41Variant::kDefault ? 1 : (c.heads >= 32 ? 2 : 1);
  CHECK(got.head_tiles == tiles);
  if (l.num_splits) CHECK(got.num_splits == normalised_splits(c.chunks(), *l.num_splits));
  CHECK(got.chunks_per_block == (c.chunks() + got.num_splits - 1) / got.num_splits);
  CHECK(got.precision == 0);
}

// Every key a list of cases launches, warmed up front. Plans from shapes (the launcher's own rule).
void warm_all(const std::vector<Dsv41Case>& cases) {
  std::vector<kiln::SemanticKey> keys;
  for (const Dsv41Case& c : cases) {
    for (const Launch& l : launches(c, on_sm90())) {
      const std::optional<Dsv41Variant> v = l.variant ? std::optional(to_kiln(*l.variant)) : std::nullopt;
      const Dsv41Plan plan = kiln::dsv41::resolve_dsv41_plan(c.tokens, c.heads, c.topk, c.xtopk(), device(), v, l.num_splits, 16,
                                                             c.main_lengths_given() || c.extra_lengths_given());
      keys.push_back(kiln::dsv41::dsv41_policy(c.heads, c.has_extra, plan).key(device_arch()));
      // With DeviceCase's scratch (one split per chunk) a planned sm90 launch may run more splits.
      const Dsv41Plan runs = kiln::dsv41::dsv41_launch_plan(device(), c.tokens, c.heads, c.chunks(), plan, !l.num_splits, std::nullopt, c.chunks());
      keys.push_back(kiln::dsv41::dsv41_policy(c.heads, c.has_extra, runs).key(device_arch()));
    }
  }
  kt::warm_distinct(keys, "dsv41");
}

// One case: oracle, every launch (the first twice: bitwise repeat), host rejection of num_splits
// below the minimum for sweeps. One summary line per case.
void run_case(const Dsv41Case& c, std::uint64_t seed, int case_number, AccuracyTally& tally) {
  const auto t0 = Clock::now();
  const HostCase h(c, seed);
  const Reference ref = run_oracle(h, h.rounds[0], c.lse_scale);
  const double oracle_ms = ms_since(t0);
  DeviceCase dev(h);
  int count = 0, failed = 0;
  Dsv41Plan first;
  const std::vector<Launch> ls = launches(c, on_sm90());
  for (std::size_t i = 0; i < ls.size(); ++i) {
    const Launch& l = ls[i];
    // Scratch where the plan splits, and on even cases also where it does not (it must not be needed).
    const bool with_scratch = dev.plan(l).num_splits > 1 || case_number % 2 == 0;
    const Outputs o = run(dev, l, with_scratch);
    ++count;
    check_plan(dev, l, o.plan);
    failed += check_against_oracle(c, ref, o, l, &tally) ? 0 : 1;
    if (i == 0) {
      first = o.plan;
      const Outputs again = run(dev, l, with_scratch);
      ++count;
      INFO(c.label() << ": a repeat of " << l.name() << " (plan " << plan_string(o.plan) << ") is not bitwise identical");
      const bool same = same_bits(o, again);
      failed += same ? 0 : 1;
      CHECK(same);
    }
  }
  if (c.sweep) {
    const int min_splits = (c.chunks() + 15) / 16;
    for (int n = 1; n < min_splits; ++n) {
      INFO(c.label() << ": num_splits " << n << " leaves more than 16 chunks per CTA and must be refused on the host");
      try {
        dev.launch(Launch{n, std::nullopt, std::nullopt}, true, nullptr);
        FAIL_CHECK("no error");
      } catch (const kiln::Error& e) {
        CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
        CHECK_THAT(e.what(), Catch::Contains("at most"));
      }
    }
  }
  std::printf("%s dsv41 %-110s plan %-14s %3d launches  oracle %.0f ms (%.2f GMAC)  total %.0f ms\n", failed ? "FAIL" : "PASS",
              c.label().c_str(), plan_string(first).c_str(), count, oracle_ms, oracle_gmacs(c), ms_since(t0));
  std::fflush(stdout);
}

// The variants this device has, forced ("default" twice on sm_90a: its staged and its compact body).
std::vector<Launch> forced_variants(std::optional<int> num_splits = std::nullopt) {
  return kiln::testing::dsv41_matrix::forced_variants(num_splits, on_sm90());
}

Dsv41Case dual(int t, int h, int topk, int xtopk, int page, int xpage) {
  Dsv41Case c;
  c.tokens = t;
  c.heads = h;
  c.topk = topk;
  c.page = page;
  c.has_extra = xtopk > 0;
  c.extra_topk = xtopk;
  c.extra_page = xpage;
  return c;
}

}  // namespace

TEST_CASE("dsv41: conformance matrix against the oracle", "[gpu][dsv41]") {
  const auto all = conformance_matrix();
  std::vector<Dsv41Case> m;
  const std::vector<std::size_t> picked = kiln::testing::selected_cases(all, "dsv41");
  for (std::size_t i : picked) m.push_back(all[i]);
  warm_all(m);
  AccuracyTally tally;
  const auto t0 = Clock::now();
  for (std::size_t i : picked) run_case(all[i], base_seed() + 101 * i, static_cast<int>(i), tally);
  std::printf("dsv41: %zu cases in %.0f ms\n", m.size(), ms_since(t0));
  tally.print("matrix");
  CHECK(tally.outside == 0);
  CHECK(tally.lse_outside == 0);
}

namespace {

// ---- the decode, bit for bit ----

// UE8M0 scale bytes whose products with every finite E4M3 value lie in bf16's normal range: below 10
// the smallest code times 2^(b - 127) falls under 2^-126, above 246 448 * 2^(b - 127) passes bf16's
// largest value. The writers emit far fewer (2^-22 .. 2^-8 for latents in [-1, 1]).
constexpr int kFirstMainScale = 10, kLastMainScale = 246;
// Main records: each covers the 256 E4M3 codes twice, under two scale bytes (groups 0-7 and 8-15).
constexpr int kMainRecords = (kLastMainScale - kFirstMainScale + 2) / 2;
// Extra records: each group of 16 covers the 16 E2M1 codes; 32 scale bytes per record cover the 256.
constexpr int kExtraRecords = 8;

bool is_nan_code(int byte) { return (byte & 0x7f) == 0x7f; }  // E4M3 NaN, as code or FP4 scale

void write_main_record(PoolImage& pool, long long slot, int record) {
  std::uint8_t* data = pool.bytes.data() + kt::dsv41_data_offset(pool.format, pool.page_stride, pool.page_size, slot);
  std::uint8_t* scales = pool.bytes.data() + kt::dsv41_scale_offset(pool.format, pool.page_stride, pool.page_size, slot);
  for (int d = 0; d < kDims; ++d) {
    const int code = (d / 32 % 8) * 32 + d % 32;
    data[d] = static_cast<std::uint8_t>(is_nan_code(code) ? 0 : code);  // a NaN code would make every score NaN
  }
  for (int g = 0; g < 16; ++g) scales[g] = static_cast<std::uint8_t>(std::min(kLastMainScale, kFirstMainScale + 2 * record + g / 8));
}

void write_extra_record(PoolImage& pool, long long slot, int record) {
  std::uint8_t* data = pool.bytes.data() + kt::dsv41_data_offset(pool.format, pool.page_stride, pool.page_size, slot);
  std::uint8_t* scales = pool.bytes.data() + kt::dsv41_scale_offset(pool.format, pool.page_stride, pool.page_size, slot);
  for (int i = 0; i < kDims / 2; ++i) data[i] = static_cast<std::uint8_t>((2 * i) % 16 | ((2 * i + 1) % 16) << 4);
  for (int g = 0; g < 32; ++g) {
    const int scale = 32 * record + g;
    scales[g] = static_cast<std::uint8_t>(is_nan_code(scale) ? 0 : scale);
  }
}

}  // namespace

// One valid candidate per token and a zero query: every score is 0 and the one weight exactly 1, so
// each output row must be the candidate's record decoded, which the oracle's element decoders give
// exactly (every product above is a bf16 value, which the test checks first). The attention
// tolerance of the matrix would hide an error in one code or scale byte; this shows it. Main
// records cover every finite E4M3 code under every UE8M0 byte from 10 to 246, extra records every
// E2M1 code under every finite E4M3 scale. Tokens 0.. name main slots 1.., at positions spread over
// every chunk and both halves of it (the sm90 producer and WG1 decode different halves); with the
// extra cache, the last tokens name only extra slots. Every launch of the matrix's list for the
// case runs: planned, each variant forced, split counts swept.
TEST_CASE("dsv41: one candidate per token gives its decoded record bit for bit", "[gpu][dsv41]") {
  for (const bool with_extra : {false, true}) {
    for (const int heads : {16, 64, 128}) {
      Dsv41Case c = dual(kMainRecords + (with_extra ? kExtraRecords : 0), heads, 256, with_extra ? 64 : 0, 64, 64);
      c.sweep = true;
      HostCase h(c, base_seed() + 31337);
      Inputs& in = h.rounds[0];
      std::fill(in.q.begin(), in.q.end(), std::uint16_t{0});
      std::fill(in.idx.begin(), in.idx.end(), -1);
      std::fill(in.xidx.begin(), in.xidx.end(), -1);
      std::vector<float> want(static_cast<std::size_t>(c.tokens) * kDims);
      for (int t = 0; t < c.tokens; ++t) {
        float* row = want.data() + static_cast<std::size_t>(t) * kDims;
        if (t < kMainRecords) {
          write_main_record(h.main, 1 + t, t);
          in.idx[static_cast<std::size_t>(t) * c.topk + (t * 37 + 5) % c.topk] = 1 + t;
          kt::dsv41_dequantize_slot(h.main.cache(), 1 + t, row);
        } else {
          const int r = t - kMainRecords;
          write_extra_record(h.extra, 1 + r, r);
          in.xidx[static_cast<std::size_t>(t) * c.extra_topk + (r * 11 + 40) % c.extra_topk] = 1 + r;
          kt::dsv41_dequantize_slot(h.extra.cache(), 1 + r, row);
        }
      }
      std::size_t not_bf16 = 0;
      for (const float v : want) not_bf16 += !(std::isfinite(v) && kt::bf16_to_float(kt::float_to_bf16(v)) == v);
      REQUIRE(not_bf16 == 0);  // the premise: every decoded value is an exact bf16 value

      warm_all({c});
      DeviceCase dev(h);
      for (const Launch& l : launches(c, on_sm90())) {
        const Outputs o = run(dev, l, true);
        check_plan(dev, l, o.plan);
        std::size_t wrong = 0, lse_wrong = 0;
        std::string first;
        for (int t = 0; t < c.tokens; ++t) {
          for (int hd = 0; hd < heads; ++hd) {
            const std::size_t row = static_cast<std::size_t>(t) * heads + hd;
            lse_wrong += !(std::fabs(o.lse[row]) <= kTol.atol);
            for (int d = 0; d < kDims; ++d) {
              const float got = kt::bf16_to_float(o.out[row * kDims + d]), exp = want[static_cast<std::size_t>(t) * kDims + d];
              if (got == exp) continue;  // -0 and +0 alike: the row sum adds the product to +0
              if (wrong++ == 0) {
                std::ostringstream m;
                m << "token " << t << " head " << hd << " dim " << d << ": got " << got << ", want " << exp;
                first = m.str();
              }
            }
          }
        }
        INFO(c.label() << " [" << l.name() << "] plan " << plan_string(o.plan) << ": " << wrong << " outputs differ from the decoded record"
                       << (wrong ? " (first: " + first + ")" : "") << ", " << lse_wrong << " LSE values off 0 by more than " << kTol.atol);
        CHECK(wrong == 0);
        CHECK(lse_wrong == 0);
      }
      std::printf("dsv41 decode bit for bit: %s, %zu launches\n", c.label().c_str(), launches(c, on_sm90()).size());
      std::fflush(stdout);
    }
  }
}

// A few launches covering the split path, both caches, the sink, lengths and empty rows, each
// variant, for compute-sanitizer (slow under it: keep small).
TEST_CASE("dsv41: sanitizer subset", "[gpu][dsv41][sanitizer]") {
  Dsv41Case split_extra = dual(3, 32, 128, 64, 61, 2);
  split_extra.sink = true;
  split_extra.lengths = Lengths::kBoth;
  split_extra.view = View::kNhd;
  split_extra.extra_stride_pad = 32;
  split_extra.num_splits = 3;
  Dsv41Case main_only = dual(2, 16, 65, 0, 32, 0);
  main_only.lengths = Lengths::kMain;
  Dsv41Case big = dual(2, 128, 200, 512, 1, 53);
  big.empty_rows = {EmptyRow::kExtra};
  big.sink = true;
  const std::vector<Dsv41Case> cases = {split_extra, main_only, big};
  warm_all(cases);
  AccuracyTally tally;
  for (std::size_t i = 0; i < cases.size(); ++i) run_case(cases[i], base_seed() + 7 * i, static_cast<int>(i), tally);
  tally.print("sanitizer subset");
}

// The same bytes through every accepted view (2-D, 3-D, HND, NHD; a padded page stride with 0xab
// padding) give the same bits, per variant, on a split and an unsplit plan.
TEST_CASE("dsv41: every view of the same bytes gives the same bits", "[gpu][dsv41]") {
  Dsv41Case c = dual(5, 64, 128, 512, 64, 32);
  c.sink = true;
  c.lengths = Lengths::kBoth;
  const HostCase h(c, base_seed() + 505);
  const Reference ref = run_oracle(h, h.rounds[0], c.lse_scale);
  const PoolImage main_padded = restride(h.main, 128, 0xab), extra_padded = restride(h.extra, 128, 0xab);
  DeviceBuffer main_padded_dev(main_padded.bytes.size()), extra_padded_dev(extra_padded.bytes.size());
  main_padded_dev.upload(main_padded.bytes);
  extra_padded_dev.upload(extra_padded.bytes);
  DeviceCase dev(h);
  for (const std::optional<int> splits : {std::optional<int>{}, std::optional<int>{1}, std::optional<int>{5}}) {
    for (const Launch& l : forced_variants(splits)) {
      dev.main_view = h.main.view(dev.main_pool.get(), View::kHnd);
      dev.extra_view = h.extra.view(dev.extra_pool.get(), View::kHnd);
      const Outputs base = run(dev, l, true);
      check_against_oracle(c, ref, base, l, nullptr);
      for (const View mv : {View::k2d, View::k3d, View::kHnd, View::kNhd}) {
        for (const View xv : {View::k2d, View::k3d, View::kHnd, View::kNhd}) {
          for (const bool padded : {false, true}) {
            dev.main_view = padded ? main_padded.view(main_padded_dev.get(), mv) : h.main.view(dev.main_pool.get(), mv);
            dev.extra_view = padded ? extra_padded.view(extra_padded_dev.get(), xv) : h.extra.view(dev.extra_pool.get(), xv);
            const Outputs o = run(dev, l, true);
            INFO(l.name() << ": main " << view_name(mv) << ", extra " << view_name(xv) << (padded ? ", page stride +128 (0xab padding)" : "")
                           << " differs from HND");
            CHECK(o.plan == base.plan);
            CHECK(same_bits(o, base));
          }
        }
      }
    }
  }
}

// lse_scale multiplies out_lse and changes no output bit (T = 7; 0.5, 2 and ln 2 against 1), on the
// direct and the split path of each variant, with a sink and an empty row.
TEST_CASE("dsv41: lse_scale changes the LSE only", "[gpu][dsv41]") {
  Dsv41Case c = dual(7, 64, 128, 512, 64, 2);
  c.sink = true;
  c.lengths = Lengths::kBoth;
  c.empty_rows = {EmptyRow::kExtra, EmptyRow::kAllMasked};
  const HostCase h(c, base_seed() + 707);
  DeviceCase dev(h);
  for (const std::optional<int> splits : {std::optional<int>{}, std::optional<int>{1}, std::optional<int>{10}}) {
    for (const Launch& l : forced_variants(splits)) {
      dev.lse_scale = 1.0;
      const Outputs base = run(dev, l, true);
      for (const double s : {0.5, 2.0, 0.69314718055994531}) {
        dev.lse_scale = s;
        const Outputs o = run(dev, l, true);
        INFO(l.name() << " lse_scale " << s);
        CHECK(std::memcmp(o.out.data(), base.out.data(), o.out.size() * 2) == 0);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < o.lse.size(); ++i) {
          const double want = s * static_cast<double>(base.lse[i]);
          const bool same_inf = std::isinf(want) && o.lse[i] == want;
          bad += !(same_inf || std::fabs(o.lse[i] - want) <= 1e-6 + 1e-6 * std::fabs(want));
        }
        CHECK(bad == 0);
      }
    }
  }
}

namespace {

// Replays `graph` (one captured launch of `l` on `dev`) over every round of the case's inputs,
// uploaded at the same addresses: each replay against the oracle and bit for bit against an eager
// launch. `what` names the test in its lines.
void check_replays(const kt::CapturedGraph& graph, CUstream stream, const Dsv41Plan& captured, DeviceCase& dev, const Launch& l,
                   const char* what) {
  const kiln::Driver& d = kiln::Driver::get();
  const HostCase& h = dev.h;
  const Dsv41Case& c = dev.c;
  for (std::size_t round = 0; round < h.rounds.size(); ++round) {
    dev.upload(h.rounds[round]);
    const Reference ref = run_oracle(h, h.rounds[round], c.lse_scale);
    dev.poison();
    d.check(d.cuCtxSynchronize(), "cuCtxSynchronize (uploads and poison before replay)");
    graph.launch(stream);
    d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize after replay");
    const Outputs replayed{kt::download_outputs(dev), captured};
    const Outputs eager = run(dev, l, true);
    INFO(c.label() << " [" << l.name() << "] " << what << " round " << round << ": replay differs from eager");
    CHECK(same_bits(replayed, eager));
    const bool ok = check_against_oracle(c, ref, replayed, l, nullptr);
    std::printf("%s dsv41 %s %-90s round %zu plan %s\n", ok && same_bits(replayed, eager) ? "PASS" : "FAIL", what, c.label().c_str(), round,
                plan_string(captured).c_str());
    std::fflush(stdout);
  }
}

}  // namespace

// Captures a launch after warming its key, then replays after rewriting Q, indices and lengths in
// place: every replay equals an eager launch bit for bit and the oracle within tolerance. Eager
// launches with enable_pdl on, off and unset give the same bits.
TEST_CASE("dsv41: graph replay and enable_pdl give the same bits as eager launches", "[gpu][dsv41]") {
  struct GraphCase {
    Dsv41Case c;
    Launch l;
  };
  Dsv41Case a = dual(4, 64, 128, 512, 64, 2);
  a.sink = true;
  a.lengths = Lengths::kBoth;
  Dsv41Case b = dual(3, 16, 2048, 0, 61, 0);
  b.lengths = Lengths::kMain;
  Dsv41Case e = dual(6, 128, 512, 128, 53, 32);
  e.empty_rows = {EmptyRow::kBoth};
  std::vector<GraphCase> cases = {{a, Launch{}}, {a, Launch{5, Variant::kDefault, false}}, {b, Launch{std::nullopt, Variant::kDefault, true}},
                                   {e, Launch{3, std::nullopt, std::nullopt}}};
  if (on_sm90()) {
    cases.push_back({a, Launch{10, Variant::kSm90, true}});
    cases.push_back({a, Launch{5, Variant::kDefault, std::nullopt, std::nullopt, false}});
  }
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const Dsv41Case& c = cases[ci].c;
    const Launch& l = cases[ci].l;
    const HostCase h(c, base_seed() + 4242 + ci, 3);
    DeviceCase dev(h);
    const Outputs eager0 = run(dev, l, true);  // compiles and loads the key: capture never does
    check_plan(dev, l, eager0.plan);
    for (const std::optional<bool> pdl : {std::optional<bool>{true}, std::optional<bool>{false}, std::optional<bool>{}}) {
      Launch lp = l;
      lp.enable_pdl = pdl;
      const Outputs o = run(dev, lp, true);
      INFO(c.label() << " [" << lp.name() << "]: enable_pdl changed the bits");
      CHECK(same_bits(o, eager0));
    }

    const kt::Stream stream;
    Dsv41Plan captured;
    kt::CapturedGraph graph(stream.get(), [&] { captured = dev.launch(l, true, stream.get()); });
    graph.instantiate();
    CHECK(captured == eager0.plan);
    check_replays(graph, stream.get(), captured, dev, l, "graph");
  }
}

// A server warms at start-up and then captures: the first decode of the process runs inside a
// capture, and every fact it reads (kernels, companions, the device's cluster residency) must have
// been read by warm_sparse_dsv41 alone. Hidden: after any other test's eager launch it could not fail,
// so ctest runs it as the only test of its process.
TEST_CASE("dsv41: first call of a process captured after warm_sparse_dsv41 alone", "[.][gpu][dsv41][first-call]") {
  Dsv41Case c = dual(4, 32, 128, 512, 61, 32);
  c.sink = true;
  c.lengths = Lengths::kBoth;
  for (const bool split : {false, true}) {
    for (const Dsv41Variant v : kiln::dsv41::dsv41_variants_for(device_arch(), c.heads)) {
      kiln::dsv41::warm_sparse_dsv41(kiln::dsv41::Dsv41Policy{c.heads, c.has_extra, split, v}, {0});
    }
  }
  const HostCase h(c, base_seed() + 5151, 2);
  DeviceCase dev(h);
  const kt::Stream stream;
  Dsv41Plan captured;
  kt::CapturedGraph graph(stream.get(), [&] { captured = dev.launch(Launch{}, true, stream.get()); });
  graph.instantiate();
  check_replays(graph, stream.get(), captured, dev, Launch{}, "first-call graph");
}

// Split scratch needs no zeroing: whatever mid_out and mid_lse hold before a launch (zeros, NaN,
// large finite values, another launch's partials) the results are the same bits. One workspace
// shared by a sequence of shapes gives the same bits as fresh scratch for each.
TEST_CASE("dsv41: stale and shared split scratch never changes a result", "[gpu][dsv41]") {
  Dsv41Case c = dual(4, 64, 128, 512, 64, 32);
  c.sink = true;
  c.lengths = Lengths::kBoth;
  c.empty_rows = {EmptyRow::kMain};
  const HostCase h(c, base_seed() + 909);
  DeviceCase dev(h);
  for (const Launch& l : forced_variants(10)) {
    const Outputs base = run(dev, l, true);
    REQUIRE(base.plan.num_splits == 10);
    for (const std::uint8_t fill : {std::uint8_t{0x00}, std::uint8_t{0x7f}, std::uint8_t{0x47}, std::uint8_t{0xc7}}) {
      dev.out.fill(kNanByte);
      dev.lse.fill(kNanByte);
      dev.mid_out.fill(fill);
      dev.mid_lse.fill(fill);
      dev.launch(l, true, nullptr);
      const kt::SparseDecodeOutputs o = kt::download_outputs(dev);
      INFO(l.name() << ": scratch filled with 0x" << std::hex << int(fill));
      CHECK(same_bits(o, base));
    }
    // Scratch left by the previous launch (no poison between): same bits again.
    dev.launch(l, true, nullptr);
    const kt::SparseDecodeOutputs again = kt::download_outputs(dev);
    CHECK(same_bits(again, base));
  }

  // One workspace, carved as the functional API does (mid_out, then mid_lse at a 16-byte-aligned
  // offset), reused across (T, H, topk, extra_topk) = (32,64,128,512), (1,8,128,0), (32,64,128,512),
  // (5,128,512,512); each launch against the same launch with fresh poisoned scratch.
  const std::vector<Dsv41Case> seq = {dual(32, 64, 128, 512, 64, 64), dual(1, 8, 128, 0, 64, 0), dual(32, 64, 128, 512, 64, 64),
                                      dual(5, 128, 512, 512, 64, 64)};
  std::int64_t bytes = 0;
  for (const Dsv41Case& s : seq) bytes = std::max(bytes, kiln::dsv41::scratch_bytes(s.tokens, s.heads, s.topk, s.xtopk()));
  DeviceBuffer workspace(static_cast<std::size_t>(bytes));
  workspace.fill(kNanByte);
  for (std::size_t i = 0; i < seq.size(); ++i) {
    const HostCase hs(seq[i], base_seed() + 9090 + (i % 2 == 0 ? 0 : i));  // cases 0 and 2: the same inputs
    DeviceCase fresh(hs);
    DeviceCase shared(hs);
    const std::size_t mid_out_bytes = static_cast<std::size_t>(seq[i].tokens) * seq[i].heads * seq[i].chunks() * kDims * 2;
    shared.external = Scratch{workspace.get(), static_cast<char*>(workspace.get()) + (mid_out_bytes + 15) / 16 * 16, seq[i].chunks()};
    const Launch l{};
    const Outputs want = run(fresh, l, true);
    shared.out.fill(kNanByte);
    shared.lse.fill(kNanByte);
    shared.launch(l, true, nullptr);
    const kt::SparseDecodeOutputs got = kt::download_outputs(shared);
    INFO(seq[i].label() << " (step " << i << ", plan " << plan_string(want.plan) << "): shared workspace differs from fresh scratch");
    CHECK(same_bits(got, want));
  }
}

TEST_CASE("dsv41: T == 0 returns the plan without launching, even on a capturing stream", "[gpu][dsv41][sanitizer]") {
  const int heads = 112, topk = 2048;
  DeviceBuffer q(4096), out(4096), lse(4096), idx(4096), xidx(4096), cache(528 * 64), xcache(288 * 64);
  Dsv41Options opt;
  opt.extra_kv_cache = TensorView::contiguous(xcache.get(), DType::kU8, {1, 64, 288});
  opt.extra_indices = TensorView::contiguous(xidx.get(), DType::kI32, {0, 512});
  opt.num_splits = 4;
  const kt::Stream stream;
  const auto before = service().counters();
  Dsv41Plan plan;
  const kt::CapturedGraph graph(stream.get(), [&] {
    plan = kiln::dsv41::cake_sparse_mla_sm120_dsv41_mixed_decode(
        TensorView::contiguous(q.get(), DType::kBf16, {0, heads, kDims}), TensorView::contiguous(cache.get(), DType::kU8, {1, 64, 528}),
        TensorView::contiguous(idx.get(), DType::kI32, {0, topk}), TensorView::contiguous(out.get(), DType::kBf16, {0, heads, kDims}),
        TensorView::contiguous(lse.get(), DType::kF32, {0, heads}), 1.0 / std::sqrt(512.0), opt, stream.get());
  });
  const auto after = service().counters();
  CHECK(after.compiles == before.compiles);
  CHECK(after.loads == before.loads);
  CHECK(after.memory_hits == before.memory_hits);
  CHECK(plan.num_splits == 4);  // 40 chunks forced into 4 splits of 10
  CHECK(plan.chunks_per_block == 10);
  CHECK(plan.precision == 0);
}
