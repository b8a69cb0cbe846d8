// Paged MLA decode on the GPU, through the public launcher only, against the fp64 CPU oracle
// (tests/support/mla_reference) at the spec's tolerances. Every launch gets fresh random inputs,
// a NaN-poisoned output and workspace, and NaN in every cache slot it must not read (block-table
// padding, entries past the live length, the tail of each request's last page).
//
// The conformance matrix (tests/support/mla_matrix) touches every value of every axis of the contract
// (runtime/mla_decode/README.md) at least once without building the cross product; the unit suite
// checks that coverage on every CI run, so trimming the table cannot silently drop a value. The
// oracle is the bottleneck: sum(L * q_len) * H * 1088 MACs per launch, kept to ~1 G each (each
// launch's line prints its cost, so the table can be re-balanced).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/mla_decode/family.h"
#include "kiln/runtime/mla_decode/launcher.h"
#include "kiln/runtime/mla_decode/planner.h"
#include "tests/support/device_buffer.h"
#include "tests/support/graph_capture.h"
#include "tests/support/mla_matrix.h"
#include "tests/support/mla_reference.h"
#include "tests/support/rng.h"

using namespace kiln::testing::mla_matrix;  // MlaCase, the conformance matrix and its helpers

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::mla::MaskType;
using kiln::mla::MlaKernel;
using kiln::testing::base_seed;
using kiln::testing::DeviceBuffer;
using kiln::testing::Rng;

constexpr int kDimQk = 576;
constexpr int kDimV = 512;
// 0xff is NaN in bf16 (0xffff), e4m3fn (0xff) and fp32 (0xffffffff): one poison byte for every buffer.
constexpr std::uint8_t kNanByte = 0xff;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Random finite values: bf16 uniform in (-1, 1); e4m3 with magnitudes 2^-4 .. 1.875 and either sign
// (never NaN: exponent <= 7 with any mantissa is finite).
// `outliers`: every 16th column of a 576-wide row (d % 16 == 3, 36 of them, RoPE included) holds
// large values, as real latents have a few channels of tens: bf16 uniform in (-32, 32); e4m3 over
// the whole range, magnitudes 2^-9 .. 448 (exponent 0..15, all but the NaN code 0x7f).
constexpr int kOutlierPeriod = 16;
constexpr float kBf16OutlierMax = 32.f;
bool outlier_column(std::size_t element) { return element % kDimQk % kOutlierPeriod == 3; }

void fill_random(std::uint8_t* dst, std::size_t elements, bool fp8, Rng& rng, bool outliers = false) {
  if (fp8) {
    for (std::size_t i = 0; i < elements; ++i) {
      const std::uint64_t r = rng.next();
      if (outliers && outlier_column(i)) {
        std::uint8_t code = static_cast<std::uint8_t>((r >> 8) & 0x7f);
        if (code == 0x7f) code = 0x7e;  // 448, not NaN
        dst[i] = static_cast<std::uint8_t>(((r & 1) << 7) | code);
        continue;
      }
      const unsigned exponent = 3 + static_cast<unsigned>((r >> 8) % 5);  // 3..7: 2^-4 .. 2^0
      dst[i] = static_cast<std::uint8_t>(((r & 1) << 7) | (exponent << 3) | ((r >> 1) & 7));
    }
    return;
  }
  auto* p = reinterpret_cast<std::uint16_t*>(dst);
  for (std::size_t i = 0; i < elements; i += 4) {
    const std::uint64_t r = rng.next();
    for (std::size_t k = 0; k < 4 && i + k < elements; ++k) {
      const float u = static_cast<float>((r >> (16 * k)) & 0xffff) / 32768.f - 1.f;
      p[i + k] = kiln::testing::float_to_bf16_bits(outliers && outlier_column(i + k) ? u * kBf16OutlierMax : u);
    }
  }
}

// Host image of one launch's inputs.
struct HostProblem {
  MlaCase c;
  int batch = 0;
  std::vector<int> q_offsets;  // B + 1 (fixed: b * SQ)
  int total_q = 0;
  std::int64_t max_pages = 0, bt_stride = 0, num_pages = 0;
  int nan_page = 0;
  std::vector<std::uint8_t> q, kv;
  std::vector<std::int32_t> block_tables, seq_lens, qo_indptr;
  float bmm1 = 1.f, bmm2 = 1.f;

  std::size_t esize() const { return c.fp8 ? 1 : 2; }
  std::size_t out_elems() const { return static_cast<std::size_t>(total_q) * c.heads * kDimV; }
};

// (Re)draws the block tables (a fresh page permutation) and lengths' tails; the page pool keeps
// its size. Slots the kernel must not read are NaN: unmapped entries, padding, last-page tails.
void map_pages(HostProblem& p, Rng& rng) {
  const MlaCase& c = p.c;
  std::vector<int> order(static_cast<std::size_t>(p.num_pages));
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(static_cast<int>(i))]);
  p.nan_page = order.back();
  order.pop_back();
  p.block_tables.assign(static_cast<std::size_t>(p.batch * p.bt_stride), p.nan_page);
  std::size_t next = 0;
  const std::size_t row_bytes = kDimQk * p.esize();
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.seq_lens[b];
    const int pages = (len + c.page_size - 1) / c.page_size;
    for (int j = 0; j < pages; ++j) p.block_tables[b * p.bt_stride + j] = order.at(next++);
    // Tail of the last page: tokens len .. end of page hold NaN (as a stale cache slot could).
    const std::int64_t last = p.block_tables[b * p.bt_stride + pages - 1];
    for (int t = len % c.page_size ? len % c.page_size : c.page_size; t < c.page_size; ++t) {
      std::memset(&p.kv[(last * c.page_size + t) * row_bytes], kNanByte, row_bytes);
    }
  }
  std::memset(&p.kv[static_cast<std::size_t>(p.nan_page) * c.page_size * row_bytes], kNanByte,
              static_cast<std::size_t>(c.page_size) * row_bytes);
}

HostProblem make_host_problem(const MlaCase& c, std::uint64_t seed) {
  HostProblem p;
  p.c = c;
  p.batch = static_cast<int>(c.seq_lens.size());
  Rng rng(seed);
  p.q_offsets.assign(p.batch + 1, 0);
  for (int b = 0; b < p.batch; ++b) p.q_offsets[b + 1] = p.q_offsets[b] + c.q_len(b);
  p.total_q = p.q_offsets[p.batch];
  p.max_pages = (c.policy_max_seq_len() + c.page_size - 1) / c.page_size;
  p.bt_stride = p.max_pages + c.bt_pad;
  std::int64_t live_pages = 0;
  for (int len : c.seq_lens) live_pages += (len + c.page_size - 1) / c.page_size;
  p.num_pages = live_pages + 4 + 1;  // + unreferenced spares + the NaN page
  p.q.resize(static_cast<std::size_t>(p.total_q) * c.heads * kDimQk * p.esize());
  fill_random(p.q.data(), p.q.size() / p.esize(), c.fp8, rng);
  p.kv.resize(static_cast<std::size_t>(p.num_pages) * c.page_size * kDimQk * p.esize());
  fill_random(p.kv.data(), p.kv.size() / p.esize(), c.fp8, rng, c.outliers);
  p.seq_lens.assign(c.seq_lens.begin(), c.seq_lens.end());
  p.qo_indptr.assign(p.q_offsets.begin(), p.q_offsets.end());
  map_pages(p, rng);
  if (c.dominant_key) {
    // One live token per request gets the sign pattern of the sum of the request's query rows (all
    // heads) as its whole cache row: its score stands far above the rest in every row.
    for (int b = 0; b < p.batch; ++b) {
      const int q_len = c.q_len(b);
      if (q_len == 0) continue;
      const int t = rng.below(p.seq_lens[b]);
      const std::int64_t page = p.block_tables[b * p.bt_stride + t / c.page_size];
      std::uint8_t* row = &p.kv[static_cast<std::size_t>((page * c.page_size + t % c.page_size) * kDimQk) * p.esize()];
      for (int d = 0; d < kDimQk; ++d) {
        double sum = 0;
        for (int i = 0; i < q_len * c.heads; ++i) {
          const std::size_t e = (static_cast<std::size_t>(p.q_offsets[b]) * c.heads + i) * kDimQk + d;
          sum += c.fp8 ? kiln::testing::e4m3_bits_to_float(p.q[e])
                       : kiln::testing::bf16_bits_to_float(reinterpret_cast<const std::uint16_t*>(p.q.data())[e]);
        }
        if (c.fp8) {
          row[d] = sum >= 0 ? 0x38 : 0xb8;  // +-1.0 in e4m3
        } else {
          reinterpret_cast<std::uint16_t*>(row)[d] = sum >= 0 ? 0x3f80 : 0xbf80;  // +-1.0 in bf16
        }
      }
    }
  }
  p.bmm1 = c.bmm1 > 0 ? c.bmm1 : rng.uniform(0.04f, 0.2f);  // DeepSeek's 1/sqrt(192) = 0.072 is inside
  p.bmm2 = rng.uniform(0.5f, 2.f);
  return p;
}

std::vector<float> oracle(const HostProblem& p) {
  kiln::testing::MlaReferenceProblem r;
  r.batch = p.batch;
  r.heads = p.c.heads;
  r.page_size = p.c.page_size;
  r.fp8 = p.c.fp8;
  r.causal = p.c.causal;
  r.q_offsets = p.q_offsets;
  r.q = p.q.data();
  r.kv = p.kv.data();
  r.block_tables = p.block_tables.data();
  r.block_table_stride = p.bt_stride;
  r.seq_lens = p.seq_lens.data();
  r.bmm1_scale = p.bmm1;
  r.bmm2_scale = p.bmm2;
  return kiln::testing::mla_reference(r, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

// Device copies of a HostProblem plus the views the launcher takes.
struct DeviceProblem {
  explicit DeviceProblem(const HostProblem& p)
      : q(p.q.size()),
        kv(p.kv.size()),
        block_tables(p.block_tables.size() * 4),
        seq_lens(p.seq_lens.size() * 4),
        qo_indptr(p.qo_indptr.size() * 4),
        out(std::max<std::size_t>(p.out_elems() * 2, 16)),
        workspace(std::max<std::size_t>(kiln::mla::mla_workspace_size(p.c.policy(), p.batch), 32)) {
    upload(p);
  }

  // New values at the same addresses (what a server does between graph replays).
  void upload(const HostProblem& p) {
    q.upload(p.q);
    kv.upload(p.kv);
    upload_metadata(p);
  }
  void upload_metadata(const HostProblem& p) {
    block_tables.upload(p.block_tables);
    seq_lens.upload(p.seq_lens);
    qo_indptr.upload(p.qo_indptr);
    // cuMemcpyHtoD from pageable memory may return before its DMA lands, and it is ordered only on
    // the legacy stream: wait, so a launch on a non-blocking stream sees the new values.
    const kiln::Driver& d = kiln::Driver::get();
    d.check(d.cuCtxSynchronize(), "cuCtxSynchronize after upload");
  }
  void poison() const {
    out.fill(kNanByte);
    workspace.fill(kNanByte);  // the workspace needs no zeroing: prove it
  }

  TensorView launch(const HostProblem& p, CUstream stream, bool use_out = true) const {
    const MlaCase& c = p.c;
    const DType dt = c.fp8 ? DType::kE4m3 : DType::kBf16;
    const TensorView query = c.packed ? TensorView::contiguous(q.get(), dt, {p.total_q, c.heads, kDimQk})
                                      : TensorView::contiguous(q.get(), dt, {p.batch, c.sq, c.heads, kDimQk});
    const TensorView cache = c.rank4_cache ? TensorView::contiguous(kv.get(), dt, {p.num_pages, 1, c.page_size, kDimQk})
                                           : TensorView::contiguous(kv.get(), dt, {p.num_pages, c.page_size, kDimQk});
    TensorView bt = TensorView::contiguous(block_tables.get(), DType::kI32, {p.batch, p.max_pages});
    bt.strides[0] = p.bt_stride;  // padded rows
    const TensorView lens = TensorView::contiguous(seq_lens.get(), DType::kI32, {p.batch});
    const TensorView ws = TensorView::contiguous(workspace.get(), DType::kU8, {static_cast<std::int64_t>(workspace.bytes())});
    std::optional<TensorView> indptr, o;
    std::optional<int> msq;
    if (c.packed) {
      indptr = TensorView::contiguous(qo_indptr.get(), DType::kI32, {p.batch + 1});
      msq = c.sq;
    } else if (c.pass_max_seq_len_q) {
      msq = c.sq;
    }
    if (use_out) {
      o = c.packed ? TensorView::contiguous(out.get(), DType::kBf16, {p.total_q, c.heads, kDimV})
                   : TensorView::contiguous(out.get(), DType::kBf16, {p.batch, c.sq, c.heads, kDimV});
    }
    return kiln::mla::prims_ts_batch_decode_with_kv_cache_mla(
        query, cache, ws, 512, 64, bt, lens, c.policy_max_seq_len(), indptr, msq, o, p.bmm1, p.bmm2,
        c.causal ? MaskType::kCausal : MaskType::kDense, DType::kBf16, stream, kiln::KernelService::global(), c.kernel,
        c.precision);
  }

  std::vector<std::uint16_t> download_out(std::size_t elems) const { return out.download<std::uint16_t>(elems); }

  DeviceBuffer q, kv, block_tables, seq_lens, qo_indptr, out, workspace;
};

struct Comparison {
  double max_abs_err = 0, rel_l2 = 0;
  std::size_t bad = 0, nan = 0, worst = 0;
  std::size_t outside_spec = 0;  // elements outside the spec's atol + rtol |ref| (== bad for exact)
  float worst_got = 0, worst_ref = 0;
  bool ok = false;
};

// The largest |V| of each of the 512 output columns over the whole cache (NaN slots skipped).
std::vector<double> column_max_abs_v(const HostProblem& p) {
  std::vector<double> vmax(kDimV, 0.0);
  const std::size_t rows = p.kv.size() / p.esize() / kDimQk;
  for (std::size_t r = 0; r < rows; ++r) {
    for (int d = 0; d < kDimV; ++d) {
      const std::size_t e = r * kDimQk + d;
      const float v = p.c.fp8 ? kiln::testing::e4m3_bits_to_float(p.kv[e])
                              : kiln::testing::bf16_bits_to_float(reinterpret_cast<const std::uint16_t*>(p.kv.data())[e]);
      if (!std::isnan(v)) vmax[d] = std::max(vmax[d], static_cast<double>(std::fabs(v)));
    }
  }
  return vmax;
}

// Spec "Accuracy": upstream's tolerances against the oracle. The one-bf16-P precision is held to its
// own stated bound instead: rounding each p to bf16 moves it by at most 2^-9 p, so the output moves
// by at most bmm2 * 2^-9 * max|V| of its column on top of the spec's tolerances (the row sums stay
// exact); its share inside the spec's tolerances is reported, not asserted.
Comparison compare(const HostProblem& p, const std::vector<std::uint16_t>& got, const std::vector<float>& ref) {
  const bool fp8 = p.c.fp8;
  const double rtol = fp8 ? 5e-2 : 1e-2, atol = fp8 ? 1.5e-3 : 5e-4, l2tol = fp8 ? 0.1 : 0.02;
  std::vector<double> one_p(kDimV, 0.0);
  if (p.c.one_p()) {
    one_p = column_max_abs_v(p);
    for (double& v : one_p) v *= p.bmm2 * std::ldexp(1.0, -9);
  }
  Comparison r;
  double num = 0, den = 0, worst_excess = -1;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float o = kiln::testing::bf16_bits_to_float(got[i]);
    const double err = std::fabs(static_cast<double>(o) - ref[i]);
    const double spec = atol + rtol * std::fabs(ref[i]);
    const double excess = std::isnan(o) ? 1e30 : err - (spec + one_p[i % kDimV]);
    if (std::isnan(o) || err > spec) ++r.outside_spec;
    if (std::isnan(o)) ++r.nan;
    if (excess > 0) ++r.bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      r.worst = i;
      r.worst_got = o;
      r.worst_ref = ref[i];
    }
    if (!std::isnan(o)) {
      num += err * err;
      r.max_abs_err = std::max(r.max_abs_err, err);
    }
    den += static_cast<double>(ref[i]) * ref[i];
  }
  r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  r.ok = r.bad == 0 && r.nan == 0 && r.rel_l2 <= l2tol;
  return r;
}

// "token t, head h, column d" of a flat output index, for failure messages.
std::string where(const HostProblem& p, std::size_t index) {
  const std::size_t d = index % kDimV, h = index / kDimV % p.c.heads, tok = index / kDimV / p.c.heads;
  int b = 0;
  while (b + 1 <= p.batch && static_cast<std::size_t>(p.q_offsets[b + 1]) <= tok) ++b;
  std::ostringstream s;
  s << "token " << tok << " (request " << b << ", row " << tok - p.q_offsets[b] << ", seq_len "
    << (b < p.batch ? p.seq_lens[b] : -1) << "), head " << h << ", column " << d;
  return s.str();
}

const kiln::DeviceLimits& device_limits() { return kiln::KernelService::global().device_limits(0); }

// One precision's errors over many launches: the accuracy table the README quotes.
struct PrecisionTally {
  double max_abs_err = 0, max_rel_l2 = 0;
  std::size_t launches = 0, elements = 0, outside_spec = 0;
  std::string worst_abs, worst_l2;  // the launches with the largest max|err| and relL2

  void add(const MlaCase& c, const Comparison& cmp, std::size_t n) {
    ++launches;
    elements += n;
    outside_spec += cmp.outside_spec;
    if (cmp.max_abs_err > max_abs_err) {
      max_abs_err = cmp.max_abs_err;
      worst_abs = c.label();
    }
    if (cmp.rel_l2 > max_rel_l2) {
      max_rel_l2 = cmp.rel_l2;
      worst_l2 = c.label();
    }
  }
  void print(const char* name) const {
    std::printf("ACCURACY %-6s launches %zu  max|err| %.3e  max relL2 %.3e  inside spec atol/rtol %.4f%% (%zu of %zu "
                "outside)\n  worst max|err|: %s\n  worst relL2:   %s\n",
                name, launches, max_abs_err, max_rel_l2, 100.0 * (1.0 - static_cast<double>(outside_spec) / elements),
                outside_spec, elements, worst_abs.c_str(), worst_l2.c_str());
  }
};

struct AccuracyTally {
  PrecisionTally exact, one_p;
  void add(const MlaCase& c, const Comparison& cmp, std::size_t n) { (c.one_p() ? one_p : exact).add(c, cmp, n); }
};

// One launch whose oracle may still be running: the GPU side is done and its output downloaded.
struct PendingCase {
  AccuracyTally* tally = nullptr;
  MlaCase c;
  std::uint64_t seed = 0;
  std::shared_ptr<const HostProblem> p;
  std::vector<std::uint16_t> got;
  double gpu_ms = 0;
  Clock::time_point t0;
  std::future<std::pair<std::vector<float>, double>> ref;  // oracle output and its ms
};

// Draws fresh inputs, poisons, launches eagerly on the legacy stream and downloads the output, then
// starts the oracle on other threads (it is the bottleneck; the next launches overlap it).
PendingCase launch_case(const MlaCase& c, std::uint64_t seed) {
  kiln::mla::register_mla_family();  // idempotent; the suite's main may predate the family
  PendingCase pc;
  pc.c = c;
  pc.seed = seed;
  pc.t0 = Clock::now();
  auto p = std::make_shared<const HostProblem>(make_host_problem(c, seed));
  DeviceProblem dev(*p);
  dev.poison();
  const auto t_gpu = Clock::now();
  const TensorView out = dev.launch(*p, nullptr, !c.allocate_out);
  const kiln::Driver& d = kiln::Driver::get();
  d.check(d.cuCtxSynchronize(), "cuCtxSynchronize after mla launch");
  pc.gpu_ms = ms_since(t_gpu);  // includes the first launch's compile/load
  if (c.allocate_out) {
    REQUIRE(out.data != nullptr);
    REQUIRE(static_cast<std::size_t>(out.numel()) == p->out_elems());
    pc.got.resize(p->out_elems());
    const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(out.data);
    const CUresult r = d.cuMemcpyDtoH(pc.got.data(), ptr, pc.got.size() * 2);
    d.cuMemFree(ptr);  // the caller owns a launcher-allocated output
    d.check(r, "cuMemcpyDtoH(allocated out)");
  } else {
    CHECK(out.data == dev.out.get());
    pc.got = dev.download_out(p->out_elems());
  }
  pc.ref = std::async(std::launch::async, [p] {
    const auto t = Clock::now();
    std::vector<float> ref = oracle(*p);
    return std::make_pair(std::move(ref), ms_since(t));
  });
  pc.p = std::move(p);
  return pc;
}

// Waits for the oracle, compares, prints one line per launch (the run's log) and CHECKs with the
// details on failure. Runs on the test's thread (Catch2 assertions are not thread-safe).
void finish_case(PendingCase& pc) {
  const auto [ref, ref_ms] = pc.ref.get();
  const HostProblem& p = *pc.p;
  const MlaCase& c = pc.c;
  const Comparison cmp = compare(p, pc.got, ref);
  if (pc.tally != nullptr) pc.tally->add(c, cmp, ref.size());
  const kiln::mla::MlaPlan plan = kiln::mla::plan(c.policy(), p.batch, device_limits(),
                                                  kiln::KernelService::global().device_arch(0));
  const char* combine = !plan.needs_combine                               ? "-"
                        : plan.combine_entry == kiln::kMlaCombineWideEntry ? "8w"
                        : plan.combine_row_warps == 1                      ? "1w/row"
                                                                           : "4w";
  std::printf("%s %-96s %s parts %3d combine %s  max|err| %.2e  relL2 %.2e  bad %zu  nan %zu  scales %.3f/%.2f  gpu %.0f ms  oracle %.0f ms (%.2f GMAC)  total %.0f ms\n",
              cmp.ok ? "PASS" : "FAIL", c.label().c_str(),
              plan.variant.kv_rows > 0 ? "wgmma_kv" : plan.variant.wgmma ? "wgmma" : "mma", plan.num_parts, combine,
              cmp.max_abs_err, cmp.rel_l2, cmp.bad, cmp.nan, p.bmm1, p.bmm2, pc.gpu_ms, ref_ms, oracle_gmacs(c),
              ms_since(pc.t0));
  std::fflush(stdout);
  INFO(c.label() << " seed " << pc.seed << " parts " << plan.num_parts);
  INFO("max|err| " << cmp.max_abs_err << ", relL2 " << cmp.rel_l2 << ", " << cmp.bad << " elements out of tolerance, " << cmp.nan
                   << " NaN; worst at " << where(p, cmp.worst) << ": got " << cmp.worst_got << ", want " << cmp.worst_ref);
  CHECK(cmp.ok);
}

// Launches every case in order; up to kOraclesInFlight oracles run behind the GPU work. `tally`
// collects every launch's errors.
void run_cases(const std::vector<MlaCase>& cases, std::uint64_t seed0, AccuracyTally* tally = nullptr) {
  // Compile every key first, in parallel (the launches would compile them one at a time).
  {
    kiln::mla::register_mla_family();
    kiln::KernelService& service = kiln::KernelService::global();
    std::vector<kiln::SemanticKey> keys;
    for (const MlaCase& c : cases) keys.push_back(c.policy().key(service.device_arch(0)));
    service.warm(keys, {0});
  }
  constexpr std::size_t kOraclesInFlight = 3;
  std::deque<PendingCase> pending;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    pending.push_back(launch_case(cases[i], cases[i].seed != 0 ? cases[i].seed : seed0 + i));
    pending.back().tally = tally;
    if (pending.size() >= kOraclesInFlight) {
      finish_case(pending.front());
      pending.pop_front();
    }
  }
  for (; !pending.empty(); pending.pop_front()) finish_case(pending.front());
}

}  // namespace

TEST_CASE("mla: conformance matrix against the fp64 oracle", "[gpu][mla]") {
  const auto t0 = Clock::now();
  const auto m = conformance_matrix();
  run_cases(m, base_seed() * 1000);
  std::printf("mla conformance matrix: %zu launches in %.1f s\n", m.size(), ms_since(t0) / 1000);
}

namespace {

// Lengths drawn log-uniformly in [64, 32768] (a serving batch mixes short and long contexts).
std::vector<int> log_uniform_lens(int batch, Rng& rng) {
  std::vector<int> lens;
  for (int b = 0; b < batch; ++b) lens.push_back(static_cast<int>(std::exp(rng.uniform(std::log(64.f), std::log(32768.f)))));
  return lens;
}

bool device_is_sm90a() { return kiln::mla::is_sm90a(kiln::KernelService::global().device_arch(0)); }

// bmm1 1.0 puts the logits' spread at ~8 nats: a few keys carry each row. These are the rows where a
// P rounded once to bf16 leaves the contract's 5e-4 absolute tolerance; hi + lo P must not.
std::vector<MlaCase> peaked_cases() {
  std::vector<MlaCase> m = {
      fixed(16, 64, 1, false, true, kAllLens, 163840),
      fixed(128, 64, 1, false, true, {65, 1, 2049, 256, 2048, 63, 64}, 163840),
      fixed(128, 64, 2, false, true, {4097, 300, 1}),
      fixed(16, 32, 4, true, true, kAllLens),
      fixed(64, 64, 1, false, false, {32768}),
      fixed(32, 128, 1, false, true, {65, 2049}),
      fixed(48, 16, 2, false, true, {65, 2049, 1, 300}),
  };
  m[0].bmm1 = 1.0f;
  m[1].bmm1 = 1.0f;
  m[2].dominant_key = true;
  m[3].bmm1 = 0.5f;
  m[4].bmm1 = 0.3f;
  m[5].dominant_key = true;
  m[5].bmm1 = 0.3f;
  m[6].bmm1 = 2.0f;
  return m;
}

std::vector<MlaCase> mixed_length_cases() {
  Rng rng(base_seed() ^ 0x6d1c);
  return {
      fixed(16, 64, 1, false, true, log_uniform_lens(8, rng), 163840),
      fixed(128, 64, 1, false, true, log_uniform_lens(6, rng), 163840),
      fixed(128, 16, 2, false, true, log_uniform_lens(3, rng), 163840),
      fixed(64, 128, 1, true, true, log_uniform_lens(5, rng), 163840),
      packed(32, 64, 4, false, true, log_uniform_lens(5, rng), {4, 0, 1, 3, 4}, 163840),
  };
}

}  // namespace

TEST_CASE("mla: both precisions over the bf16 launches of the matrix and the peaked cases", "[gpu][mla]") {
  // Each launch twice on the same inputs (same seed): precision exact, held to the spec's tolerances,
  // and bf16 (one bf16 P), held to compare()'s stated bound; the table compares the two.
  std::vector<MlaCase> m;
  std::uint64_t seed = base_seed() * 1000 + 400;
  for (const auto& list : {conformance_matrix(), peaked_cases()}) {
    for (MlaCase c : list) {
      if (c.fp8) continue;
      c.seed = ++seed;
      m.push_back(c);
      c.precision = kiln::mla::MlaPrecision::kBf16;
      m.push_back(c);
    }
  }
  AccuracyTally tally;
  run_cases(m, 0, &tally);
  tally.exact.print("exact");
  tally.one_p.print("bf16");
  CHECK(tally.exact.launches == tally.one_p.launches);
}

TEST_CASE("mla: peaked softmax (large bmm1_scale, one dominant key, long rows)", "[gpu][mla]") {
  std::vector<MlaCase> m = peaked_cases();
  // The same rows through the portable mma.sync configuration (bf16, and fp8, which auto puts on the
  // wgmma kernel).
  for (const std::size_t i : {1, 3}) {
    MlaCase forced = m[i];
    forced.kernel = MlaKernel::kMmaSync;
    m.push_back(forced);
  }
  run_cases(m, base_seed() * 1000 + 500);
}

TEST_CASE("mla: mixed-length batches", "[gpu][mla]") { run_cases(mixed_length_cases(), base_seed() * 1000 + 600); }

TEST_CASE("mla: batches of more requests than a CTA has threads", "[gpu][mla]") {
  // The device scheduler reads the lengths in one pass when every request has a thread of its own,
  // and in several (a scan carried across passes) otherwise; 300-400 requests exceed every variant's
  // CTA (the fp8 kernel's 384 threads are the most). Short lengths keep the fp64 oracle cheap.
  Rng rng(base_seed() ^ 0x5c4e);
  const auto short_lens = [&](int batch) {
    std::vector<int> lens;
    for (int b = 0; b < batch; ++b) lens.push_back(static_cast<int>(std::exp(rng.uniform(0.f, std::log(200.f)))));
    return lens;
  };
  run_cases({fixed(16, 64, 1, false, true, short_lens(400), 163840), fixed(16, 64, 1, true, false, short_lens(400), 163840),
             fixed(64, 64, 2, false, true, short_lens(300), 163840)},
            base_seed() * 1000 + 650);
}

TEST_CASE("mla: the portable mma.sync configuration (sm_120's) over a third of the matrix", "[gpu][mla]") {
  // Forced on this GPU to prove the configuration every arch without wgmma runs is correct.
  std::vector<MlaCase> m;
  const auto all = conformance_matrix();
  for (std::size_t i = 0; i < all.size(); i += 3) {
    MlaCase c = all[i];
    c.kernel = MlaKernel::kMmaSync;
    m.push_back(c);
  }
  run_cases(m, base_seed() * 1000 + 700);
}

TEST_CASE("mla: the wgmma kernel forced on small head counts", "[gpu][mla]") {
  if (!device_is_sm90a()) {
    std::printf("SKIPPED: the wgmma kernel runs on sm_90a only\n");
    return;
  }
  std::vector<MlaCase> m = {
      fixed(16, 64, 1, false, true, kAllLens, 163840),
      fixed(8, 32, 2, false, false, kMidLens),
      packed(7, 16, 4, false, true, {1, 2049, 65, 4097}, {0, 4, 3, 1}),
      fixed(24, 128, 1, false, true, kAllLens),
  };
  for (MlaCase& c : m) c.kernel = MlaKernel::kWgmma;
  run_cases(m, base_seed() * 1000 + 750);
}

TEST_CASE("mla: the KV-on-M wgmma kernel forced on every bf16 launch of the matrix, peaked and mixed-length tests",
          "[gpu][mla]") {
  if (!device_is_sm90a()) {
    std::printf("SKIPPED: the KV-on-M wgmma kernel runs on sm_90a only\n");
    return;
  }
  // Every row count folds into tiles of 16 or 32 rows, so every bf16 key can run it, not only the
  // small head counts the planner gives it.
  std::vector<MlaCase> m;
  for (const auto& list : {conformance_matrix(), peaked_cases(), mixed_length_cases()}) {
    for (MlaCase c : list) {
      if (c.fp8) continue;
      c.kernel = MlaKernel::kWgmmaKv;
      m.push_back(c);
    }
  }
  run_cases(m, base_seed() * 1000 + 1100);
}

TEST_CASE("mla: sanitizer subset", "[gpu][mla][sanitizer]") {
  // Small launches that still reach every code path: split + combine, one split, two and more row
  // tiles, fp8 on both kernels, packed with an empty request, the rank-4 cache, padded block tables.
  std::vector<MlaCase> m = {
      fixed(16, 64, 1, false, true, {1, 65, 300}, 163840),
      fixed(128, 32, 2, true, false, {63, 129}),
      packed(7, 128, 8, false, true, {5, 200, 1}, {8, 0, 3}),
      fixed(24, 16, 4, true, true, {1, 32, 17}, 32),
      packed(64, 64, 2, false, false, {64, 65, 2}, {1, 0, 2}, 4096),
      fixed(128, 64, 1, false, true, {1, 65, 300}, 163840),
      fixed(24, 32, 16, false, true, {1, 200}),
      fixed(8, 64, 2, true, true, {1, 65, 300}, 163840),
      fixed(12, 16, 1, true, true, {64, 200, 1}, 163840),
      fixed(64, 64, 8, false, false, {65, 300, 129, 1}),
      // Equal lengths over 8 parts: 3 units per request, parts widened from 4 to 6 units (two whole
      // requests each, five parts at work).
      fixed(128, 64, 8, false, true, std::vector<int>(9, 256)),
  };
  m[7].kernel = MlaKernel::kMmaSync;
  m[0].bt_pad = 5;
  m[1].rank4_cache = true;
  m[2].bt_pad = 3;
  m[4].bt_pad = 11;
  // The KV-on-M kernel on the bf16 launches: one and several row tiles, split and whole, packed.
  if (device_is_sm90a()) {
    for (const std::size_t i : {0, 2, 4, 6}) {
      MlaCase c = m[i];
      c.kernel = MlaKernel::kWgmmaKv;
      m.push_back(c);
    }
  }
  // The one-P precision on every bf16 kernel: heads-on-M (H 128; packed H 7 x SQ 8 with padded tables;
  // packed H 64 x SQ 2 with an empty request; H 24 x SQ 16 in six row tiles), KV-on-M with 16 and 32
  // rows (H 16; H 64 x SQ 2 forced), mma.sync (forced).
  for (const auto& [i, kernel] : {std::pair{std::size_t{5}, MlaKernel::kAuto}, {std::size_t{2}, MlaKernel::kAuto},
                                  {std::size_t{4}, MlaKernel::kAuto}, {std::size_t{6}, MlaKernel::kAuto},
                                  {std::size_t{0}, MlaKernel::kAuto},
                                  {std::size_t{4}, MlaKernel::kWgmmaKv}, {std::size_t{0}, MlaKernel::kMmaSync}}) {
    if (kernel == MlaKernel::kWgmmaKv && !device_is_sm90a()) continue;
    MlaCase c = m[i];
    c.kernel = kernel;
    c.precision = kiln::mla::MlaPrecision::kBf16;
    m.push_back(c);
  }
  // Every form of the combine runs here (eight warps where a request is expected in >= 32 pieces, a
  // warp per row where in <= 4, else four warps per row).
  std::set<int> combines;
  for (const MlaCase& c : m) {
    const kiln::mla::MlaPlan plan = kiln::mla::plan(c.policy(), static_cast<int>(c.seq_lens.size()),
                                                    device_limits(), kiln::KernelService::global().device_arch(0));
    if (plan.needs_combine) combines.insert(plan.combine_row_warps);  // 0: the eight-warp form
  }
  CHECK(combines == std::set<int>{0, 1, 4});
  run_cases(m, base_seed() * 1000 + 900);
}

TEST_CASE("mla: packed launch with no query rows returns without launching", "[gpu][mla][sanitizer]") {
  kiln::mla::register_mla_family();
  kiln::KernelService& service = kiln::KernelService::global();
  const kiln::Driver& d = kiln::Driver::get();
  // A policy no other test warms (H 5, max_seq_len 777): a launch would have to compile, which is
  // refused during capture (kNotWarm), so returning cleanly while capturing proves nothing launched.
  const int heads = 5, page = 32, batch = 3;
  const long long max_seq_len = 777;
  const std::int64_t max_pages = (max_seq_len + page - 1) / page;
  // Validation still runs in full (the workspace must be large enough even when nothing launches).
  const std::size_t ws_bytes = std::max<std::size_t>(
      kiln::mla::mla_workspace_size(heads, page, max_seq_len, 4, true, DType::kBf16, DType::kBf16, MaskType::kCausal, batch), 32);
  DeviceBuffer q(64), kv(2 * page * kDimQk * 2), bt(batch * max_pages * 4), lens(batch * 4), indptr((batch + 1) * 4),
      out(64), ws(ws_bytes);
  const TensorView ws_view = TensorView::contiguous(ws.get(), DType::kU8, {static_cast<std::int64_t>(ws_bytes)});
  const std::vector<std::int32_t> zeros(batch + 1, 0), ones(batch, 1), table(batch * max_pages, 0);
  indptr.upload(zeros);
  lens.upload(ones);
  bt.upload(table);
  const kiln::testing::Stream owned;
  const CUstream stream = owned.get();
  const auto before = service.counters();
  const auto launch_empty = [&] {
    try {
      return kiln::mla::prims_ts_batch_decode_with_kv_cache_mla(
          TensorView::contiguous(q.get(), DType::kBf16, {0, heads, kDimQk}),
          TensorView::contiguous(kv.get(), DType::kBf16, {2, page, kDimQk}),
          ws_view, 512, 64,
          TensorView::contiguous(bt.get(), DType::kI32, {batch, max_pages}),
          TensorView::contiguous(lens.get(), DType::kI32, {batch}), max_seq_len,
          TensorView::contiguous(indptr.get(), DType::kI32, {batch + 1}), 4,
          TensorView::contiguous(out.get(), DType::kBf16, {0, heads, kDimV}), 0.1, 1.0, MaskType::kCausal,
          DType::kBf16, stream);
    } catch (const kiln::Error& e) {
      FAIL("an empty packed launch threw: " << e.what());
    }
    return TensorView{};
  };
  for (const bool capture : {false, true}) {
    INFO((capture ? "during capture" : "eager"));
    TensorView result;
    if (capture) {
      const kiln::testing::CapturedGraph graph(stream, [&] { result = launch_empty(); });
    } else {
      result = launch_empty();
    }
    CHECK(result.numel() == 0);
    CHECK(result.rank == 3);
  }
  // Without `out` the launcher returns an empty view and allocates nothing.
  const TensorView none = kiln::mla::prims_ts_batch_decode_with_kv_cache_mla(
      TensorView::contiguous(q.get(), DType::kBf16, {0, heads, kDimQk}),
      TensorView::contiguous(kv.get(), DType::kBf16, {2, page, kDimQk}), ws_view, 512, 64, TensorView::contiguous(bt.get(), DType::kI32, {batch, max_pages}),
      TensorView::contiguous(lens.get(), DType::kI32, {batch}), max_seq_len,
      TensorView::contiguous(indptr.get(), DType::kI32, {batch + 1}), 4, std::nullopt, 0.1, 1.0, MaskType::kCausal,
      DType::kBf16, stream);
  CHECK(none.numel() == 0);
  CHECK(none.data == nullptr);
  const auto after = service.counters();
  CHECK(after.compiles == before.compiles);
  CHECK(after.loads == before.loads);
  d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
}

namespace {

// Captures one launch after warming its key, then replays it after changing seq_lens, qo_indptr
// (packed) and block_tables in place; every replay must equal, bit for bit, an eager launch with
// the same values, and match the oracle.
void graph_replay(MlaCase c, std::uint64_t seed) {
  kiln::mla::register_mla_family();
  const kiln::Driver& d = kiln::Driver::get();
  kiln::KernelService& service = kiln::KernelService::global();
  Rng rng(seed);
  // The pool and the query are sized for the largest draw; rounds only move lengths and pages.
  const int max_len = static_cast<int>(std::min<long long>(c.policy_max_seq_len(), 2100));
  const int batch = static_cast<int>(c.seq_lens.size());
  for (int& len : c.seq_lens) len = max_len;
  HostProblem p = make_host_problem(c, seed);
  const int total_q = p.total_q;  // the captured query/out views fix total_q
  DeviceProblem dev(p);

  kiln::mla::warm_mla(c.policy(), {0});  // warm before capture: capture must never compile
  // The key's handle carries its warm combine module (the mla_combine companion), which a split
  // launch in the capture runs.
  const kiln::KernelHandle* handle = service.find(c.policy().fingerprint(), 0);
  REQUIRE(handle != nullptr);
  REQUIRE(handle->companions.size() == 1);
  const kiln::mla::MlaCombinePolicy combine{c.policy().heads, c.policy().max_seq_len_q, c.policy().packed};
  CHECK(handle->companion(0).key == combine.key(service.device_arch(0)).str());
  CHECK(handle->companion(0).functions.size() == 2);
  const kiln::testing::Stream stream;
  const auto before = service.counters();
  kiln::testing::CapturedGraph graph(stream.get(), [&] { dev.launch(p, stream.get()); });
  graph.instantiate();
  const auto after = service.counters();
  CHECK(after.compiles == before.compiles);
  CHECK(after.loads == before.loads);

  for (int round = 0; round < 3; ++round) {
    // New lengths (1 .. max_len, a short one every round), new query split, remapped pages.
    for (int b = 0; b < batch; ++b) p.seq_lens[b] = b == round % batch ? 1 + rng.below(70) : 1 + rng.below(max_len);
    if (c.packed) {
      // Redistribute the same total_q over the requests: uneven, some empty, each <= max_seq_len_q.
      std::vector<int> q_lens(batch, 0);
      for (int left = total_q; left > 0;) {
        const int b = rng.below(batch);
        if (q_lens[b] < c.sq) {
          ++q_lens[b];
          --left;
        }
      }
      for (int b = 0; b < batch; ++b) p.q_offsets[b + 1] = p.q_offsets[b] + q_lens[b];
      p.qo_indptr.assign(p.q_offsets.begin(), p.q_offsets.end());
      p.c.q_lens = q_lens;
    }
    p.c.seq_lens.assign(p.seq_lens.begin(), p.seq_lens.end());
    fill_random(p.kv.data(), p.kv.size() / p.esize(), c.fp8, rng);  // map_pages re-poisons the NaN slots
    map_pages(p, rng);
    dev.kv.upload(p.kv);
    dev.upload_metadata(p);
    std::ostringstream label;
    label << "graph round " << round << ": " << p.c.label();
    INFO(label.str());

    dev.poison();
    graph.launch(stream.get());
    d.check(d.cuStreamSynchronize(stream.get()), "cuStreamSynchronize after replay");
    const auto replayed = dev.download_out(p.out_elems());

    dev.poison();
    dev.launch(p, stream.get());
    d.check(d.cuStreamSynchronize(stream.get()), "cuStreamSynchronize after eager launch");
    const auto eager = dev.download_out(p.out_elems());

    std::size_t first_diff = replayed.size();
    for (std::size_t i = 0; i < replayed.size(); ++i) {
      if (replayed[i] != eager[i]) {
        first_diff = i;
        break;
      }
    }
    INFO("first bitwise difference between replay and eager at "
         << (first_diff < replayed.size() ? where(p, first_diff) : std::string("none")));
    CHECK(first_diff == replayed.size());
    const Comparison cmp = compare(p, replayed, oracle(p));
    std::printf("%s %-96s graph replay == eager: %s  max|err| %.2e  relL2 %.2e  bad %zu  nan %zu\n", cmp.ok ? "PASS" : "FAIL",
                label.str().c_str(), first_diff == replayed.size() ? "yes" : "NO", cmp.max_abs_err, cmp.rel_l2, cmp.bad, cmp.nan);
    std::fflush(stdout);
    INFO("max|err| " << cmp.max_abs_err << ", relL2 " << cmp.rel_l2 << ", " << cmp.bad << " bad, " << cmp.nan
                     << " NaN; worst at " << where(p, cmp.worst) << ": got " << cmp.worst_got << ", want " << cmp.worst_ref);
    CHECK(cmp.ok);
  }
}

}  // namespace

TEST_CASE("mla: packed graph replay after in-place seq_lens, qo_indptr and block_tables changes equals eager",
          "[gpu][mla]") {
  MlaCase c = packed(32, 32, 4, false, true, {1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2}, 8192);
  c.bt_pad = 7;
  graph_replay(c, base_seed() * 1000 + 800);
}

TEST_CASE("mla: fixed graph replay after in-place seq_lens and block_tables changes equals eager", "[gpu][mla]") {
  MlaCase c = fixed(128, 64, 1, true, true, {1, 1, 1, 1}, 163840);
  c.bt_pad = 3;
  c.rank4_cache = true;
  graph_replay(c, base_seed() * 1000 + 801);
  MlaCase dense = fixed(16, 16, 2, false, false, {1, 1, 1}, 2500);
  graph_replay(dense, base_seed() * 1000 + 802);
  MlaCase one_p = fixed(64, 64, 2, false, true, {1, 1, 1, 1}, 163840);
  one_p.precision = kiln::mla::MlaPrecision::kBf16;
  graph_replay(one_p, base_seed() * 1000 + 805);
  if (device_is_sm90a()) {
    MlaCase kv = fixed(16, 64, 1, false, true, {1, 1, 1, 1, 1, 1}, 163840);
    kv.kernel = MlaKernel::kWgmmaKv;
    graph_replay(kv, base_seed() * 1000 + 804);
  }
  MlaCase wide = fixed(128, 64, 1, false, true, {1, 1, 1, 1, 1}, 163840);
  wide.bt_pad = 2;
  graph_replay(wide, base_seed() * 1000 + 803);
}
