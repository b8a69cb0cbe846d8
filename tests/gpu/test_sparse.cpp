// Sparse MLA decode over the NVFP4 cache on the GPU, through the public launcher only
// (runtime/sparse_nvfp4/launcher.h), against the fp32 oracle (tests/support/sparse_reference: Q's
// NoPE dims NVFP4-round-tripped) at the spec's tolerances: output atol = rtol = 5e-2, LSE 2e-2.
//
// Every launch gets NaN-poisoned output, out_lse, mid_out and mid_lse. Cache bytes the kernels must
// not use are NaN too: the padding between pages (page stride > minimum), and one NaN token per
// pool that only masked slots point at (slots past topk_length; the rest of those slots hold an
// out-of-range index, which the spec says is never read).
//
// Data scale: the spec's (DeepSeek V4) -- unit-normal latents and queries, with some 16-value groups
// scaled by 0, 1e-3, 0.1 or 2 to reach the scale edge cases, sm_scale = 512^-0.5. Latent groups of
// magnitude ~30 have their own test: the spec stores each split's partial output in bf16, which
// costs up to 2^-9 of the largest candidate value of a dim, so the split path gets a stated bound.
//
// Split plans launch the merge kernel as a programmatic dependent of the decode kernel, so every
// split case (and the graph replays) covers that overlap. Every case runs the launcher's kernel for
// the call and, forced, the compact configuration that fits sm_120's 99 KiB and (on sm_90a) the
// warpgroup-MMA kernel, also with a split's chunks dealt to a CTA cluster forced on; planned calls
// also the mma.sync kernel, and on sm_90a that kernel with a split's chunks shared by a CTA cluster
// forced on and off (the launcher picks a cluster where the grid leaves SMs idle, so small-T cases
// run it by default too). Expected plans come from the library's planners (resolve_plan), which the
// unit suite checks against the contract's reference points and properties.
//
// The matrix (tests/support/sparse_matrix) touches every value of every conformance axis at least
// once without building the cross product; the unit suite asserts that coverage on every CI run. Every key the matrix launches is warmed
// up front in parallel (as a server would), so compiles stay out of the per-case times.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/sparse_nvfp4/family.h"
#include "kiln/runtime/sparse_nvfp4/launch_plan.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "tests/support/h200_residency.h"
#include "tests/support/case_filter.h"
#include "tests/support/device_buffer.h"
#include "tests/support/graph_capture.h"
#include "tests/support/nvfp4_device.h"
#include "tests/support/nvfp4_reference.h"
#include "tests/support/rng.h"
#include "tests/support/sparse_decode.h"
#include "tests/support/sparse_matrix.h"
#include "tests/support/sparse_reference.h"
#include "tests/support/parallel.h"

using namespace kiln::testing::sparse_matrix;  // SparseCase, the conformance matrix and its helpers

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::sparse::SparseKernel;
using kiln::sparse::SparseOptions;
using kiln::sparse::SplitPlanResult;
using kiln::testing::base_seed;
using kiln::testing::DeviceBuffer;
using kiln::testing::Rng;
namespace kt = kiln::testing;

constexpr int kDims = 512;
constexpr int kMaxChunksPerBlock = 16;
// 0xff is NaN in bf16 (0xffff), fp32 (0xffffffff) and e4m3fn (0xff): one poison byte for all buffers.
constexpr std::uint8_t kNanByte = 0xff;
constexpr float kLn2 = 0.69314718055994531f;
constexpr kt::Tolerance kOutTol{5e-2, 5e-2};
constexpr kt::Tolerance kLseTol{2e-2, 0};
// An index no pool reaches: placed only in slots past topk_length, which the spec says are never read.
constexpr std::int32_t kFarIndex = 0x7fffff00;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// One paged pool in the 384-byte format, host image and device copy. The last token is the NaN
// token; padding between pages is NaN; scale padding bytes 28..31 are zero as the format requires.
struct Pool {
  int page_size = 0;
  long long page_stride = 0;
  long long pages = 0;
  int valid_tokens = 0;  // tokens 0 .. valid_tokens-1 hold data; token valid_tokens is the NaN token
  int nan_token = 0;
  std::vector<std::uint8_t> host;
  std::unique_ptr<DeviceBuffer> dev;

  TensorView view(Layout layout) const {
    TensorView v;
    v.data = dev->get();
    v.dtype = DType::kU8;
    if (layout == Layout::kCompact) {
      v.rank = 3;
      v.shape = {pages, page_size, 384};
      v.strides = {page_stride, 384, 1};
    } else if (layout == Layout::kHnd) {
      v.rank = 4;
      v.shape = {pages, 1, page_size, 384};
      v.strides = {page_stride, static_cast<std::int64_t>(page_size) * 384, 384, 1};
    } else {
      v.rank = 4;
      v.shape = {pages, page_size, 1, 384};
      v.strides = {page_stride, 384, 384, 1};
    }
    return v;
  }
};

// Latent rows at the spec's scale: unit normal, some groups scaled to the scale edge cases; with
// `large`, most groups at magnitude ~30.
void random_latent(Rng& rng, std::uint16_t* row, bool large) {
  static constexpr float kGroupScales[] = {0.f, 1e-3f, 0.1f, 1.f, 1.f, 1.f, 2.f};
  static constexpr float kLargeScales[] = {30.f, 30.f, 30.f, 30.f, 1.f, 0.1f, 20.f};
  for (int g = 0; g < 28; ++g) {
    const float m = large ? kLargeScales[rng.below(7)] : kGroupScales[rng.below(7)];
    for (int j = 0; j < 16; ++j) row[g * 16 + j] = kt::float_to_bf16(rng.normal() * m);
  }
  for (int j = 448; j < kDims; ++j) row[j] = kt::float_to_bf16(rng.normal());
}

Pool make_pool(int page_size, int stride_pad, int min_tokens, std::uint64_t seed, bool large) {
  Pool p;
  p.page_size = page_size;
  p.page_stride = static_cast<long long>(page_size) * 384 + stride_pad;
  p.pages = (min_tokens + 1 + page_size - 1) / page_size;
  p.nan_token = static_cast<int>(p.pages * page_size - 1);
  p.valid_tokens = p.nan_token;
  p.host.assign(static_cast<std::size_t>(p.pages * p.page_stride), kNanByte);
  for (long long pg = 0; pg < p.pages; ++pg) {  // scale region zero: its bytes 28..31 stay zero
    std::memset(&p.host[pg * p.page_stride + static_cast<long long>(page_size) * 352], 0, static_cast<std::size_t>(page_size) * 32);
  }
  Rng rng(seed);
  std::vector<std::uint16_t> row(kDims);
  for (int t = 0; t < p.valid_tokens; ++t) {
    random_latent(rng, row.data(), large);
    kt::nvfp4_write_token(p.host.data(), p.page_stride, page_size, t, row.data());
  }
  {  // NaN token: codes and RoPE all 0xff, the 28 scales NaN (0xff), padding zero
    const long long pg = p.nan_token / page_size, r = p.nan_token % page_size;
    std::uint8_t* base = &p.host[pg * p.page_stride];
    std::memset(base + r * 352, kNanByte, 352);
    std::memset(base + static_cast<long long>(page_size) * 352 + r * 32, kNanByte, 28);
  }
  p.dev = std::make_unique<DeviceBuffer>(p.host.size());
  p.dev->upload(p.host.data(), p.host.size());
  return p;
}

// Pools by page size, built on first use inside one test case and freed at its end (inside main's
// context, so no driver call outlives it). Page strides are above the minimum (read from the view).
class ScopedPools {
 public:
  ScopedPools() { current_ = this; }
  ~ScopedPools() { current_ = nullptr; }
  ScopedPools(const ScopedPools&) = delete;
  ScopedPools& operator=(const ScopedPools&) = delete;

  static const Pool& get(int page_size, bool large) {
    if (current_ == nullptr) throw std::logic_error("sparse test: pool() used outside a ScopedPools");
    const std::pair<int, bool> key{page_size, large};
    auto it = current_->pools_.find(key);
    if (it != current_->pools_.end()) return it->second;
    const int pad = page_size == 2 ? 16 : page_size == 32 ? 32 : page_size == 64 ? 48 : 256;
    return current_->pools_.emplace(key, make_pool(page_size, pad, 4096, 0x9001u + page_size + (large ? 77 : 0), large)).first->second;
  }

 private:
  static inline ScopedPools* current_ = nullptr;
  std::map<std::pair<int, bool>, Pool> pools_;
};

const Pool& pool(int page_size, bool large = false) { return ScopedPools::get(page_size, large); }

// A launch of one case: plan overrides (none = the planners'), the kernel (none = the launcher's).
struct Variant {
  std::optional<int> num_splits;
  std::optional<int> head_tiles;
  std::optional<SparseKernel> kernel;
  std::optional<bool> cluster;  // SparseOptions::cluster
  std::optional<bool> bulk_gather;  // SparseOptions::bulk_gather
  bool planned() const { return !num_splits && !head_tiles; }
  std::string name() const {
    std::ostringstream s;
    s << (num_splits ? "splits=" + std::to_string(*num_splits) : std::string("planned splits"))
      << (head_tiles ? " tiles=" + std::to_string(*head_tiles) : std::string(""))
      << " kernel " << (kernel ? kiln::sparse::sparse_kernel_name(*kernel) : "default")
      << (cluster ? (*cluster ? " cluster on" : " cluster off") : "")
      << (bulk_gather ? (*bulk_gather ? " bulk gather" : " cp.async gather") : "");
    return s.str();
  }
};

int sm_count() { return kiln::KernelService::global().device_sm_count(0); }

// The plan the spec prescribes for this launch on this GPU.
SplitPlanResult variant_plan(const SparseCase& c, const Variant& v) {
  return kiln::sparse::resolve_plan(c.tokens, c.heads, c.topk, c.xtopk(), sm_count(), v.num_splits, 16, v.head_tiles);
}

// The key a launch of `v` uses (what warm-up must compile).
kiln::SemanticKey variant_key(const SparseCase& c, const Variant& v, const std::string& arch) {
  const SplitPlanResult plan = variant_plan(c, v);
  const kiln::sparse::SparseDevice device = kiln::sparse::sparse_device(kiln::KernelService::global(), 0);
  // DeviceCase's scratch holds one split per chunk.
  const int chunks = kiln::sparse::num_chunks(c.topk, c.xtopk());
  const kiln::sparse::SparseLaunch l =
      kiln::sparse::plan_sparse_launch(device, c.tokens, c.heads, chunks, plan, !v.num_splits, v.kernel, v.cluster, chunks);
  return kiln::sparse::sparse_policy(c.heads, c.has_extra, l.runs, l.kernel).key(arch);
}

bool on_sm90() { return kiln::KernelService::global().device_arch(0) == "sm_90a"; }

// The variants a case launches: the planned call, and for sweeps every forced num_splits that the
// spec's normalisation keeps (a count normalised to another one is covered by that one), with each
// valid head_tiles. Counts below ceil(chunks / 16) are rejected on the host (checked separately).
// Every variant runs with the launcher's kernel, the forced compact configuration and (sm_90a) the
// forced warpgroup-MMA kernel (one head tiling: it maps both onto its own blocks), also with dealing
// forced on; planned calls also with the mma.sync kernel. On sm_90a the mma.sync kernel also runs
// with the cluster forced on and off (planned calls and every sweep variant), and with each gather
// forced (planned calls; sweeps: the one the planner does not pick for that tiling, cp.async with one
// head tile and bulk copies with two).
std::vector<Variant> variants(const SparseCase& c) {
  std::vector<Variant> v = {Variant{}, Variant{std::nullopt, std::nullopt, SparseKernel::kMmaSmall},
                            Variant{std::nullopt, std::nullopt, SparseKernel::kMma}};
  if (on_sm90()) {
    v.push_back(Variant{std::nullopt, std::nullopt, SparseKernel::kSm90});
    v.push_back(Variant{std::nullopt, std::nullopt, SparseKernel::kSm90, true});
    v.push_back(Variant{std::nullopt, std::nullopt, SparseKernel::kMma, true});
    v.push_back(Variant{std::nullopt, std::nullopt, SparseKernel::kMma, false});
    v.push_back(Variant{std::nullopt, std::nullopt, SparseKernel::kMma, std::nullopt, true});
    v.push_back(Variant{std::nullopt, std::nullopt, SparseKernel::kMma, std::nullopt, false});
  }
  if (!c.sweep) return v;
  const int chunks = c.chunks();
  const int min_splits = (chunks + kMaxChunksPerBlock - 1) / kMaxChunksPerBlock;
  for (int tiles : {1, 2}) {
    if (tiles == 2 && c.heads % 32 != 0) continue;
    for (int ns = min_splits; ns <= chunks; ++ns) {
      if (kiln::sparse::resolve_splits(c.topk, c.xtopk(), ns).num_splits != ns) continue;
      v.push_back(Variant{ns, tiles});
      v.push_back(Variant{ns, tiles, SparseKernel::kMmaSmall});
      if (on_sm90() && tiles == 1) {
        v.push_back(Variant{ns, tiles, SparseKernel::kSm90});
        v.push_back(Variant{ns, tiles, SparseKernel::kSm90, true});
      }
      if (on_sm90()) {
        v.push_back(Variant{ns, tiles, SparseKernel::kMma, true});
        v.push_back(Variant{ns, tiles, SparseKernel::kMma, false});
        v.push_back(Variant{ns, tiles, SparseKernel::kMma, std::nullopt, tiles == 2});
      }
    }
  }
  return v;
}

// Host image of one launch's inputs and the oracle's answer.
struct HostCase {
  SparseCase c;
  std::vector<std::uint16_t> q;
  std::vector<std::int32_t> idx, xidx, len, xlen;
  std::vector<float> sink;
  float sm_scale = 0.f;
  std::vector<float> ref, ref_lse;
};

// Slot values: random rows, ~8% -1, ~2% other negatives (INT_MIN, -12345), ~5% duplicates of the
// previous slot; token 2 all negative. With lengths, slots past the token's length point at the NaN
// token or far out of range (never read).
void fill_indices(Rng& rng, const Pool& p, int tokens, int topk, int row_stride, const std::vector<std::int32_t>* lens,
                  std::vector<std::int32_t>& idx) {
  idx.assign(static_cast<std::size_t>(tokens) * row_stride, kFarIndex);  // row padding: never read
  for (int t = 0; t < tokens; ++t) {
    const int len = lens ? std::clamp((*lens)[t], 0, topk) : topk;
    std::int32_t* row = &idx[static_cast<std::size_t>(t) * row_stride];
    for (int j = 0; j < topk; ++j) {
      if (j >= len) {
        row[j] = (j % 2) ? p.nan_token : kFarIndex;
        continue;
      }
      const int r = rng.below(100);
      std::int32_t v = rng.below(p.valid_tokens);
      if (r < 8) v = -1;
      else if (r < 9) v = INT_MIN;
      else if (r < 10) v = -12345;
      else if (r < 15 && j > 0) v = row[j - 1];
      row[j] = v;
    }
    if (t == 2) {
      for (int j = 0; j < len; ++j) row[j] = -1 - rng.below(3);  // an all-negative row
    }
  }
}

// Per-token active prefix: random in [0, topk], token 1 zero, token 3 past topk and token 4
// negative (both clamped by the contract).
std::vector<std::int32_t> make_lengths(Rng& rng, int tokens, int topk) {
  std::vector<std::int32_t> len(tokens);
  for (int t = 0; t < tokens; ++t) len[t] = rng.below(topk + 1);
  if (tokens > 1) len[1] = 0;
  if (tokens > 3) len[3] = topk + 7;
  if (tokens > 4) len[4] = -3;
  return len;
}

// The oracle, parallel over (token, 16-head block) units.
void run_oracle(HostCase& h) {
  const SparseCase& c = h.c;
  const Pool& mp = pool(c.page, c.large);
  const int row_stride = c.topk + c.idx_pad;
  kt::SparseProblem pr;
  pr.tokens = c.tokens;
  pr.heads = c.heads;
  pr.q = h.q.data();
  pr.main = {mp.host.data(), mp.page_stride, mp.page_size, h.idx.data(), row_stride, c.topk, h.len.empty() ? nullptr : h.len.data()};
  if (c.has_extra) {
    const Pool& xp = pool(c.extra_page, c.large);
    pr.extra = {xp.host.data(), xp.page_stride, xp.page_size, h.xidx.data(), c.extra_topk, c.extra_topk,
                h.xlen.empty() ? nullptr : h.xlen.data()};
  }
  pr.attn_sink = c.sink == Sink::kOff ? nullptr : h.sink.data();
  pr.sm_scale = h.sm_scale;
  pr.lse_scale = c.ln2 ? kLn2 : 1.f;
  pr.q_reciprocals = &kt::nvfp4_device_reciprocals();  // Q is rounded as the writers round
  h.ref.assign(static_cast<std::size_t>(c.tokens) * c.heads * kDims, 0.f);
  h.ref_lse.assign(static_cast<std::size_t>(c.tokens) * c.heads, 0.f);
  kt::parallel_head_blocks(c.tokens, c.heads, [&](int t, int h0, int hn) {
    kt::SparseProblem s = pr;
    s.tokens = 1;
    s.heads = hn;
    s.q = pr.q + (static_cast<std::size_t>(t) * c.heads + h0) * kDims;
    s.main.indices = pr.main.indices + static_cast<std::size_t>(t) * row_stride;
    if (s.main.lengths) s.main.lengths += t;
    if (c.has_extra) {
      s.extra.indices = pr.extra.indices + static_cast<std::size_t>(t) * c.extra_topk;
      if (s.extra.lengths) s.extra.lengths += t;
    }
    if (s.attn_sink) s.attn_sink += h0;
    kt::sparse_nvfp4_reference(s, h.ref.data() + (static_cast<std::size_t>(t) * c.heads + h0) * kDims,
                               h.ref_lse.data() + static_cast<std::size_t>(t) * c.heads + h0);
  });
}

// Draws the inputs that change between rounds (Q, indices, lengths); the sinks and scale stay.
void draw_inputs(HostCase& h, Rng& rng) {
  const SparseCase& c = h.c;
  h.q.resize(static_cast<std::size_t>(c.tokens) * c.heads * kDims);
  for (auto& v : h.q) v = kt::float_to_bf16(rng.normal() * c.q_scale);
  const bool main_len = c.lengths == Lengths::kMain || c.lengths == Lengths::kBoth;
  const bool extra_len = c.has_extra && (c.lengths == Lengths::kExtra || c.lengths == Lengths::kBoth);
  h.len = main_len ? make_lengths(rng, c.tokens, c.topk) : std::vector<std::int32_t>{};
  fill_indices(rng, pool(c.page, c.large), c.tokens, c.topk, c.topk + c.idx_pad, main_len ? &h.len : nullptr, h.idx);
  if (c.has_extra) {
    h.xlen = extra_len ? make_lengths(rng, c.tokens, c.extra_topk) : std::vector<std::int32_t>{};
    fill_indices(rng, pool(c.extra_page, c.large), c.tokens, c.extra_topk, c.extra_topk, extra_len ? &h.xlen : nullptr, h.xidx);
  }
}

HostCase make_host_case(const SparseCase& c, std::uint64_t seed) {
  HostCase h;
  h.c = c;
  Rng rng(seed);
  h.sm_scale = 1.f / std::sqrt(512.f);  // DeepSeek V4's
  h.sink.resize(c.heads);
  for (int i = 0; i < c.heads; ++i) h.sink[i] = (c.sink == Sink::kDominated && i % 4 == 1) ? 40.f : rng.uniform(-2.f, 4.f);
  draw_inputs(h, rng);
  return h;
}

// Device buffers of one case; the launcher's tensor views over them.
struct DeviceCase : kt::SparseDecodeBuffers {
  const SparseCase c;

  explicit DeviceCase(const HostCase& h) : SparseDecodeBuffers(h.c.tokens, h.c.heads, h.c.chunks(), h.idx.size(), h.xidx.size()), c(h.c) {
    upload(h);
    sink.upload(h.sink);
  }

  TensorView q_view() const { return TensorView::contiguous(q.get(), DType::kBf16, {c.tokens, c.heads, kDims}); }
  TensorView out_view() const { return TensorView::contiguous(out.get(), DType::kBf16, {c.tokens, c.heads, kDims}); }
  TensorView lse_view() const { return TensorView::contiguous(lse.get(), DType::kF32, {c.tokens, c.heads}); }
  TensorView indices_view() const {
    TensorView v;
    v.data = idx.get();
    v.dtype = DType::kI32;
    const std::int64_t stride = c.topk + c.idx_pad;
    if (c.rank3_indices) {
      v.rank = 3;
      v.shape = {c.tokens, 1, c.topk};
      v.strides = {stride, stride, 1};
    } else {
      v.rank = 2;
      v.shape = {c.tokens, c.topk};
      v.strides = {stride, 1};
    }
    return v;
  }
  SparseOptions options(const Variant& v, bool with_scratch) const {
    SparseOptions o;
    const bool main_len = c.lengths == Lengths::kMain || c.lengths == Lengths::kBoth;
    const bool extra_len = c.has_extra && (c.lengths == Lengths::kExtra || c.lengths == Lengths::kBoth);
    if (main_len) o.topk_length = TensorView::contiguous(len.get(), DType::kI32, {c.tokens});
    if (c.sink != Sink::kOff) o.attn_sink = TensorView::contiguous(sink.get(), DType::kF32, {c.heads});
    if (c.has_extra) {
      o.extra_kv_cache = pool(c.extra_page, c.large).view(c.extra_layout);
      o.extra_indices = TensorView::contiguous(xidx.get(), DType::kI32, {c.tokens, c.extra_topk});
      if (extra_len) o.extra_topk_length = TensorView::contiguous(xlen.get(), DType::kI32, {c.tokens});
    }
    if (with_scratch) {
      o.mid_out = TensorView::contiguous(mid_out.get(), DType::kBf16, {c.tokens, c.heads, split_stride, kDims});
      o.mid_lse = TensorView::contiguous(mid_lse.get(), DType::kF32, {c.tokens, c.heads, split_stride});
    }
    o.lse_scale = c.ln2 ? kLn2 : 1.0;
    o.num_splits = v.num_splits;
    o.head_tiles = v.head_tiles;
    o.kernel = v.kernel;
    o.cluster = v.cluster;
    o.bulk_gather = v.bulk_gather;
    return o;
  }
  SplitPlanResult launch(const Variant& v, float sm_scale, bool with_scratch, CUstream stream) const {
    return kiln::sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(q_view(), pool(c.page, c.large).view(c.layout), indices_view(), out_view(),
                                                                 lse_view(), sm_scale, options(v, with_scratch), stream);
  }
};

kt::SparseDecodeErrors compare(const kt::SparseDecodeOutputs& o, const HostCase& h) {
  return kt::compare_outputs(o, h.ref, h.ref_lse, kOutTol, kLseTol);
}

struct Outputs : kt::SparseDecodeOutputs {
  SplitPlanResult plan;
};

// Poison, launch on the legacy stream, download.
Outputs run_variant(DeviceCase& dev, const HostCase& h, const Variant& v, bool with_scratch) {
  dev.poison();
  const SplitPlanResult plan = dev.launch(v, h.sm_scale, with_scratch, nullptr);
  const kiln::Driver& d = kiln::Driver::get();
  d.check(d.cuCtxSynchronize(), "cuCtxSynchronize after sparse launch");
  return {kt::download_outputs(dev), plan};
}

// CHECKs one launch against the oracle; returns whether it passed. Prints only failures (the
// per-case summary line is printed by the caller).
bool check_against_oracle(const HostCase& h, const Outputs& o, const std::string& what, kt::SparseDecodeErrors* worst) {
  const kt::SparseDecodeErrors cmp = compare(o, h);
  if (worst != nullptr) {
    worst->max_err = std::max(worst->max_err, cmp.max_err);
    worst->max_lse_err = std::max(worst->max_lse_err, cmp.max_lse_err);
    worst->bad += cmp.bad;
    worst->bad_lse += cmp.bad_lse;
    worst->nan += cmp.nan;
  }
  if (!cmp.ok()) {
    std::printf("FAIL sparse %s [%s] plan tiles %d splits %d cpb %d: %zu bad outputs (%zu NaN), max|err| %.3g at %s (got %g, want %g); "
                "%zu bad LSE, max %.3g at %s (got %g, want %g)\n",
                h.c.label().c_str(), what.c_str(), o.plan.head_tiles, o.plan.num_splits, o.plan.chunks_per_block, cmp.bad, cmp.nan,
                cmp.max_err, kt::output_position(h.c.heads, cmp.worst, false).c_str(), cmp.worst_got, cmp.worst_ref, cmp.bad_lse,
                cmp.max_lse_err, kt::output_position(h.c.heads, cmp.worst_lse, true).c_str(), o.lse[cmp.worst_lse], h.ref_lse[cmp.worst_lse]);
    std::fflush(stdout);
  }
  INFO(h.c.label() << " [" << what << "] plan tiles " << o.plan.head_tiles << " splits " << o.plan.num_splits << " cpb "
                   << o.plan.chunks_per_block);
  INFO(cmp.bad << " outputs out of tolerance (" << cmp.nan << " NaN), max|err| " << cmp.max_err << " at "
               << kt::output_position(h.c.heads, cmp.worst, false) << "; " << cmp.bad_lse << " LSE out of tolerance, max "
               << cmp.max_lse_err << " at " << kt::output_position(h.c.heads, cmp.worst_lse, true));
  CHECK(cmp.ok());
  return cmp.ok();
}

// One case: oracle, then every variant (planned twice: bitwise repeat), then host rejection of
// num_splits below the minimum. One summary line per case.
void run_case(const SparseCase& c, std::uint64_t seed, int case_number) {
  const auto t0 = Clock::now();
  HostCase h = make_host_case(c, seed);
  run_oracle(h);
  const double oracle_ms = ms_since(t0);
  DeviceCase dev(h);
  kt::SparseDecodeErrors worst;
  int launches = 0, failed = 0;
  SplitPlanResult planned;
  for (const Variant& v : variants(c)) {
    const SplitPlanResult expect = variant_plan(c, v);
    // Scratch only where the plan splits on odd cases: a one-split plan must not need it.
    const bool with_scratch = expect.num_splits > 1 || case_number % 2 == 0;
    const Outputs o = run_variant(dev, h, v, with_scratch);
    ++launches;
    CHECK(o.plan == expect);
    failed += check_against_oracle(h, o, v.name(), &worst) ? 0 : 1;
    if (v.planned()) {
      planned = o.plan;
      const Outputs again = run_variant(dev, h, v, with_scratch);
      ++launches;
      INFO(c.label() << ": a repeat of the planned launch (tiles " << o.plan.head_tiles << ", splits " << o.plan.num_splits
                     << ") is not bitwise identical");
      const bool same = same_bits(o, again);
      if (!same) {
        std::printf("FAIL sparse %s: repeat of one plan not bitwise identical\n", c.label().c_str());
        ++failed;
      }
      CHECK(same);
    }
  }
  if (c.sweep) {
    const int min_splits = (c.chunks() + kMaxChunksPerBlock - 1) / kMaxChunksPerBlock;
    for (int ns = 1; ns < min_splits; ++ns) {
      INFO(c.label() << ": num_splits " << ns << " leaves > 16 chunks per block and must be rejected on the host");
      try {
        dev.launch(Variant{ns, std::nullopt}, h.sm_scale, true, nullptr);
        FAIL_CHECK("no error");
      } catch (const kiln::Error& e) {
        CHECK(e.code() == kiln::ErrorCode::kInvalidArgument);
        CHECK_THAT(e.what(), Catch::Contains("num_splits"));
      }
    }
  }
  const double macs = static_cast<double>(c.tokens) * c.heads * (c.topk + c.xtopk()) * 1024;
  std::printf("%s sparse %-100s plan %d/%d/%d  %3d launches  max|err| %.2e  max lse err %.2e  bad %zu/%zu  nan %zu  oracle %.0f ms (%.2f GMAC)  total %.0f ms\n",
              failed ? "FAIL" : "PASS", c.label().c_str(), planned.head_tiles, planned.num_splits, planned.chunks_per_block, launches,
              worst.max_err, worst.max_lse_err, worst.bad, worst.bad_lse, worst.nan, oracle_ms, macs * 1e-9, ms_since(t0));
  std::fflush(stdout);
}

// Every key the cases will launch, warmed up front.
void warm_all(const std::vector<SparseCase>& cases) {
  const std::string arch = kiln::KernelService::global().device_arch(0);
  std::vector<kiln::SemanticKey> keys;
  for (const SparseCase& c : cases) {
    for (const Variant& v : variants(c)) keys.push_back(variant_key(c, v, arch));
  }
  kt::warm_distinct(keys, "sparse");
}

}  // namespace

// The launch planner reads cluster residency from the driver. On the H200 it must be what the
// planner's rules were measured with (tests/support/h200_residency.h); on any GPU a count can only
// fall as clusters grow, and n-CTA clusters never hold more than the SMs.
TEST_CASE("sparse: cluster residency read from the driver", "[gpu][sparse]") {
  const kiln::sparse::SparseDevice d = kiln::sparse::sparse_device(kiln::KernelService::global(), 0);
  if (d.arch != "sm_90a") {
    WARN("not run: kiln launches clusters on sm_90a only, this GPU is " << d.arch);
    return;
  }
  std::printf("cluster residency (one-SM CTAs, sizes 1-8):");
  for (int n = 1; n <= kiln::kMaxResidentClusterSize; ++n) std::printf(" %d", d.residency[n]);
  std::printf("\n");
  CHECK(d.residency[1] == d.sms);
  for (int n = 2; n <= kiln::kMaxResidentClusterSize; ++n) {
    CHECK(d.residency[n] <= d.residency[n - 1]);
    CHECK(d.residency[n] * n <= d.sms);
    CHECK(d.residency[n] > 0);
  }
  const kiln::Driver& drv = kiln::Driver::get();
  CUdevice cu = 0;
  char name[256] = {};
  drv.check(drv.cuDeviceGet(&cu, 0), "cuDeviceGet");
  drv.check(drv.cuDeviceGetName(name, sizeof(name), cu), "cuDeviceGetName");
  if (std::string(name).find("H200") != std::string::npos) CHECK(d.residency == kiln::testing::h200_residency());
  // The same answer from the cache, and for dsv41 launches through it.
  CHECK(kiln::sparse::sparse_device(kiln::KernelService::global(), 0).residency == d.residency);
}

TEST_CASE("sparse: conformance matrix against the fp32 oracle", "[gpu][sparse]") {
  ScopedPools pools;
  const auto all = conformance_matrix();
  std::vector<SparseCase> m;
  const std::vector<std::size_t> picked = kiln::testing::selected_cases(all, "sparse");
  for (std::size_t i : picked) m.push_back(all[i]);
  warm_all(m);
  const auto t0 = Clock::now();
  for (std::size_t i : picked) run_case(all[i], base_seed() + 101 * i, static_cast<int>(i));
  std::printf("sparse: %zu cases in %.0f ms\n", m.size(), ms_since(t0));
}

// A few launches covering the split path, the extra pool, the sink and lengths, for
// compute-sanitizer memcheck (slow under it: keep small).
TEST_CASE("sparse: sanitizer subset", "[gpu][sparse][sanitizer]") {
  ScopedPools pools;
  SparseCase split_extra = with_extra(3, 32, 128, 64, 64, 2, kH, kC, kDom, kBothLen, kLn2Lse);
  const std::vector<SparseCase> cases = {
      main_only(2, 16, 65, 32, kN, kOn, kMainLen, kUnitLse),
      split_extra,
      main_only(2, 64, 512, 128, kC, kOff, kNoLen, kUnitLse),
      main_only(1, 8, 1, 64, kC, kOff, kNoLen, kUnitLse),
      // H > 64: the Hopper kernel's two head groups share the decode as a cluster pair.
      main_only(2, 128, 200, 32, kC, kOn, kMainLen, kUnitLse),
  };
  warm_all(cases);
  for (std::size_t i = 0; i < cases.size(); ++i) run_case(cases[i], base_seed() + 7 * i, static_cast<int>(i));
  // The split path with the extra pool and the sink, forced (3 splits of 1 chunk), both tilings and
  // the compact configuration.
  HostCase h = make_host_case(split_extra, base_seed() + 99);
  run_oracle(h);
  DeviceCase dev(h);
  std::vector<Variant> forced = {Variant{3, 1}, Variant{3, 2}, Variant{3, 1, SparseKernel::kMmaSmall}};
  if (on_sm90()) {
    forced.push_back(Variant{3, 1, SparseKernel::kSm90});
    // The staged mma.sync configuration's bulk gathers, both tilings.
    forced.push_back(Variant{3, 1, SparseKernel::kMma, std::nullopt, true});
    forced.push_back(Variant{3, 2, SparseKernel::kMma, std::nullopt, true});
  }
  for (const Variant& v : forced) {
    kiln::KernelService::global().warm(variant_key(split_extra, v, kiln::KernelService::global().device_arch(0)), 0);
    const Outputs o = run_variant(dev, h, v, true);
    CHECK(o.plan.num_splits == 3);
    check_against_oracle(h, o, v.name(), nullptr);
  }
  // The cluster epilogue, forced: one split of 3 chunks over 3 CTAs (the final output with the sink),
  // 2 splits of 2 chunks (a CTA with none) with both tilings and with each gather, and the same
  // dealing on the sm90 kernel.
  if (on_sm90()) {
    for (const Variant& v : {Variant{1, 1, SparseKernel::kMma, true}, Variant{2, 1, SparseKernel::kMma, true},
                             Variant{2, 2, SparseKernel::kMma, true}, Variant{2, 1, SparseKernel::kMma, true, false},
                             Variant{1, 1, SparseKernel::kSm90, true}, Variant{2, 1, SparseKernel::kSm90, true}}) {
      kiln::KernelService::global().warm(variant_key(split_extra, v, kiln::KernelService::global().device_arch(0)), 0);
      const Outputs o = run_variant(dev, h, v, true);
      CHECK(o.plan.num_splits == *v.num_splits);
      check_against_oracle(h, o, v.name(), nullptr);
    }
  }
}

// Latent groups of magnitude ~30. The bound on the split path, per output element (token t, dim d):
//   |got - ref| <= 5e-2 + 5e-2 |ref| + 2^-8 M(t, d),  M = max over t's candidates of |v[d]|.
// Each split's partial row is a convex combination of candidate rows, so |o_s[d]| <= M; the spec
// stores it in bf16 (error <= 2^-9 |o_s[d]|) and the merge is a convex combination of the stored
// rows, which adds at most 2^-9 M; 2^-8 leaves a factor 2 for the kernels' f16 P and fp32 sums.
// Unsplit launches keep the spec's plain tolerance.
TEST_CASE("sparse: magnitude-30 cache groups, split-path error bound", "[gpu][sparse]") {
  ScopedPools pools;
  SparseCase c = with_extra(4, 64, 512, 128, 64, 32, kC, kN, kOn, kNoLen, kUnitLse);
  c.large = true;
  HostCase h = make_host_case(c, base_seed() + 3030);
  run_oracle(h);
  std::vector<float> m(static_cast<std::size_t>(c.tokens) * kDims, 0.f);
  std::vector<float> row(kDims);
  for (int t = 0; t < c.tokens; ++t) {
    for (int pi = 0; pi < 2; ++pi) {
      const Pool& p = pool(pi == 0 ? c.page : c.extra_page, true);
      const std::vector<std::int32_t>& idx = pi == 0 ? h.idx : h.xidx;
      const int topk = pi == 0 ? c.topk : c.extra_topk, stride = pi == 0 ? c.topk + c.idx_pad : c.extra_topk;
      for (int j = 0; j < topk; ++j) {
        const std::int32_t i = idx[static_cast<std::size_t>(t) * stride + j];
        if (i < 0) continue;
        kt::nvfp4_dequantize_token(p.host.data(), p.page_stride, p.page_size, i, row.data());
        for (int d = 0; d < kDims; ++d) m[t * kDims + d] = std::max(m[t * kDims + d], std::fabs(row[d]));
      }
    }
  }
  DeviceCase dev(h);
  std::vector<Variant> runs = {Variant{}, Variant{10, std::nullopt}, Variant{10, std::nullopt, SparseKernel::kMmaSmall},
                               Variant{1, std::nullopt}, Variant{1, std::nullopt, SparseKernel::kMmaSmall}};
  if (on_sm90()) {
    runs.push_back(Variant{10, std::nullopt, SparseKernel::kSm90});
    runs.push_back(Variant{1, std::nullopt, SparseKernel::kSm90});
  }
  const std::string arch = kiln::KernelService::global().device_arch(0);
  std::vector<kiln::SemanticKey> keys;
  for (const Variant& v : runs) keys.push_back(variant_key(c, v, arch));
  kiln::KernelService::global().warm(keys, {0});
  for (const Variant& v : runs) {
    const Outputs o = run_variant(dev, h, v, true);
    CHECK(o.plan == variant_plan(c, v));
    std::size_t past_tol = 0, past_bound = 0;
    double worst_ratio = 0;  // |err| / bound
    for (std::size_t i = 0; i < h.ref.size(); ++i) {
      const double ref = h.ref[i], got = kt::bf16_to_float(o.out[i]);
      const double err = std::fabs(got - ref), tol = kOutTol.bound(ref);
      const double bound = tol + std::ldexp(static_cast<double>(m[(i / kDims / c.heads) * kDims + i % kDims]), -8);
      past_tol += !(err <= tol);
      past_bound += !(err <= bound);
      worst_ratio = std::max(worst_ratio, std::isnan(err) ? 1e30 : err / bound);
    }
    const bool split = o.plan.num_splits > 1;
    std::printf("%s sparse large [%s] splits %d: %zu of %zu past the plain tolerance, %zu past the bound (worst err/bound %.3f)\n",
                (split ? past_bound : past_tol) ? "FAIL" : "PASS", v.name().c_str(), o.plan.num_splits, past_tol, h.ref.size(), past_bound,
                worst_ratio);
    INFO(v.name() << ": splits " << o.plan.num_splits);
    if (split) CHECK(past_bound == 0);
    else CHECK(past_tol == 0);
    const kt::SparseDecodeErrors lse = compare(o, h);
    CHECK(lse.bad_lse == 0);
  }
}

namespace {

// Record `record`'s test pattern in token `token` of `p` (host image): NoPE group g holds the 16 E2M1
// codes in order under E4M3 scale byte 28 * record + g (mod 256; the NaN bytes 0x7f / 0xff as 0x00),
// so ten records cover every code under every finite scale; RoPE value j is a normal bf16 of
// exponent field 1 + (64 * record + j) % 254 (four records cover all 254), with a spread of
// mantissas and both signs. bf16 subnormals are left out: RoPE latents are never near 2^-126, and
// whether the tensor cores keep them is not what this pattern is for.
void write_exact_token(Pool& p, int token, int record) {
  std::uint8_t* page = p.host.data() + static_cast<long long>(token / p.page_size) * p.page_stride;
  const int r = token % p.page_size;
  std::uint8_t* data = page + static_cast<long long>(r) * 352;
  std::uint8_t* scales = page + static_cast<long long>(p.page_size) * 352 + r * 32;
  for (int i = 0; i < 224; ++i) data[i] = static_cast<std::uint8_t>((2 * i) % 16 | ((2 * i + 1) % 16) << 4);
  for (int j = 0; j < 64; ++j) {
    const int exponent = 1 + (64 * record + j) % 254, mantissa = (37 * j + 11 * record) & 0x7f;
    const std::uint16_t bits = static_cast<std::uint16_t>((j & 1) << 15 | exponent << 7 | mantissa);
    data[224 + 2 * j] = static_cast<std::uint8_t>(bits & 0xff);
    data[225 + 2 * j] = static_cast<std::uint8_t>(bits >> 8);
  }
  for (int g = 0; g < 28; ++g) {
    const int scale = (28 * record + g) % 256;
    scales[g] = static_cast<std::uint8_t>((scale & 0x7f) == 0x7f ? 0 : scale);
  }
}

}  // namespace

// One valid candidate per token and a zero query: every score is 0 and the one weight exactly 1, so
// each output row must be the candidate's record decoded, which the reference decoder gives exactly
// (every value is a bf16 value, which the test checks first). The matrix's tolerance would hide an
// error in one code, scale byte or RoPE value; this shows it. Ten records (write_exact_token) in
// tokens 1..10 of one pool, which serves as main and extra cache: tokens 0..9 name record t through
// the main indices, at positions spread over every chunk and both halves of it (the sm90 producer
// and WG1 may decode different halves); with the extra cache, tokens 10..19 name record t - 10
// through the extra indices only. Every variant of the matrix's list runs, split counts swept.
TEST_CASE("sparse: one candidate per token gives its decoded record bit for bit", "[gpu][sparse]") {
  ScopedPools pools;  // DeviceCase::options reads the matrix's pools; the cache views below replace them
  constexpr int kRecords = 10;
  Pool exact = make_pool(64, 48, 64, base_seed() + 4711, false);
  for (int r = 0; r < kRecords; ++r) write_exact_token(exact, 1 + r, r);
  exact.dev->upload(exact.host.data(), exact.host.size());
  std::vector<float> records(static_cast<std::size_t>(kRecords) * kDims);
  for (int r = 0; r < kRecords; ++r) {
    kt::nvfp4_dequantize_token(exact.host.data(), exact.page_stride, exact.page_size, 1 + r, records.data() + static_cast<std::size_t>(r) * kDims);
  }
  std::size_t not_bf16 = 0;
  for (const float v : records) not_bf16 += !(std::isfinite(v) && kt::bf16_to_float(kt::float_to_bf16(v)) == v);
  REQUIRE(not_bf16 == 0);  // the premise: every decoded value is an exact bf16 value

  const std::string arch = kiln::KernelService::global().device_arch(0);
  for (const bool extra : {false, true}) {
    for (const int heads : {16, 64, 128}) {
      const int tokens = extra ? 2 * kRecords : kRecords;
      const SparseCase c = extra ? with_extra(tokens, heads, 256, 64, 64, 64, kC, kC, kOff, kNoLen, kUnitLse, kSweep)
                                 : main_only(tokens, heads, 256, 64, kC, kOff, kNoLen, kUnitLse, kSweep);
      HostCase h;
      h.c = c;
      h.sm_scale = 1.f / std::sqrt(512.f);
      h.q.assign(static_cast<std::size_t>(tokens) * heads * kDims, 0);
      h.idx.assign(static_cast<std::size_t>(tokens) * c.topk, -1);
      if (extra) h.xidx.assign(static_cast<std::size_t>(tokens) * c.extra_topk, -1);
      for (int t = 0; t < tokens; ++t) {
        if (t < kRecords) h.idx[static_cast<std::size_t>(t) * c.topk + (t * 37 + 5) % c.topk] = 1 + t;
        else h.xidx[static_cast<std::size_t>(t) * c.extra_topk + (t * 11 + 40) % c.extra_topk] = 1 + t - kRecords;
      }
      DeviceCase dev(h);
      std::vector<kiln::SemanticKey> keys;
      for (const Variant& v : variants(c)) keys.push_back(variant_key(c, v, arch));
      kt::warm_distinct(keys, "sparse");
      for (const Variant& v : variants(c)) {
        dev.poison();
        SparseOptions opt = dev.options(v, true);
        if (extra) opt.extra_kv_cache = exact.view(kC);
        const SplitPlanResult plan = kiln::sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(
            dev.q_view(), exact.view(kC), dev.indices_view(), dev.out_view(), dev.lse_view(), h.sm_scale, opt, nullptr);
        const kt::SparseDecodeOutputs o = kt::download_outputs(dev);
        CHECK(plan == variant_plan(c, v));
        std::size_t wrong = 0, lse_wrong = 0;
        std::string first;
        for (int t = 0; t < tokens; ++t) {
          const float* want = records.data() + static_cast<std::size_t>(t % kRecords) * kDims;
          for (int hd = 0; hd < heads; ++hd) {
            const std::size_t row = static_cast<std::size_t>(t) * heads + hd;
            lse_wrong += !(std::fabs(o.lse[row]) <= kLseTol.atol);
            for (int d = 0; d < kDims; ++d) {
              const float got = kt::bf16_to_float(o.out[row * kDims + d]);
              if (got == want[d]) continue;  // -0 and +0 alike: the row sum adds the product to +0
              if (wrong++ == 0) {
                std::ostringstream m;
                m << "token " << t << " head " << hd << " dim " << d << ": got " << got << ", want " << want[d];
                first = m.str();
              }
            }
          }
        }
        INFO(c.label() << " [" << v.name() << "] plan tiles " << plan.head_tiles << " splits " << plan.num_splits << ": " << wrong
                       << " outputs differ from the decoded record" << (wrong ? " (first: " + first + ")" : "") << ", " << lse_wrong
                       << " LSE values off 0 by more than " << kLseTol.atol);
        CHECK(wrong == 0);
        CHECK(lse_wrong == 0);
      }
      std::printf("sparse decode bit for bit: %s, %zu launches\n", c.label().c_str(), variants(c).size());
      std::fflush(stdout);
    }
  }
}

// Q groups holding NaN (either sign), +-Inf, the largest finite bf16 and -0: the kernels round Q
// as the writers do (NaN elements +6 and out of amax, Inf and huge values saturated to +-6 at scale
// 448), which the oracle takes from the reference quantizer. The other elements of such a group are
// scaled by 32, so that a NaN rounded to -6 instead of +6 moves its row's logits by several units.
// Only NoPE dims: RoPE is kept in bf16, where a NaN stays NaN.
TEST_CASE("sparse: Q groups with NaN, +-Inf, huge and -0 elements", "[gpu][sparse]") {
  ScopedPools pools;
  const SparseCase c = main_only(4, 64, 512, 64, kC, kOn, kNoLen, kUnitLse);
  HostCase h = make_host_case(c, base_seed() + 4040);
  const std::uint16_t specials[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x7f7f, 0xff7f, 0x8000, 0x7fff};
  for (int t = 0; t < c.tokens; ++t) {
    for (int head = t % 3; head < c.heads; head += 3) {
      std::uint16_t* row = h.q.data() + (static_cast<std::size_t>(t) * c.heads + head) * kDims;
      const int g = (head + t) % 28;
      for (int i = 0; i < 16; ++i) row[g * 16 + i] = kt::float_to_bf16(kt::bf16_to_float(row[g * 16 + i]) * 32.f);
      row[g * 16 + head % 16] = specials[(head + t) % 8];
      if (head % 5 == 0) std::fill(row + ((g + 1) % 28) * 16, row + ((g + 1) % 28) * 16 + 16, std::uint16_t{0x7fc0});  // all NaN: scale 0
    }
  }
  run_oracle(h);
  std::size_t nan_ref = 0;
  for (const float r : h.ref) nan_ref += std::isnan(r);
  REQUIRE(nan_ref == 0);
  DeviceCase dev(h);
  std::vector<Variant> runs = {Variant{}, Variant{1, std::nullopt, SparseKernel::kMmaSmall}, Variant{2, std::nullopt, SparseKernel::kMma}};
  if (on_sm90()) runs.push_back(Variant{2, std::nullopt, SparseKernel::kSm90});
  const std::string arch = kiln::KernelService::global().device_arch(0);
  for (const Variant& v : runs) {
    kiln::KernelService::global().warm(variant_key(c, v, arch), 0);
    const Outputs o = run_variant(dev, h, v, true);
    check_against_oracle(h, o, v.name(), nullptr);
  }
}

TEST_CASE("sparse: T == 0 returns the plan without launching, even on a capturing stream with a cold key", "[gpu][sparse][sanitizer]") {
  ScopedPools pools;
  // H = 120 appears nowhere else in this suite: its keys are never warm, so any launch attempt
  // during capture would throw kNotWarm, and any compile or load would move the counters.
  const int heads = 120, topk = 2048;
  DeviceBuffer q(4096), out(4096), lse(4096), idx(4096), xidx(4096), mid(4096);
  const Pool& p = pool(64);
  SparseOptions opt;
  opt.extra_kv_cache = pool(2).view(Layout::kCompact);
  opt.extra_indices = TensorView::contiguous(xidx.get(), DType::kI32, {0, 512});
  opt.num_splits = 4;
  const kt::Stream stream;
  const auto before = kiln::KernelService::global().counters();
  SplitPlanResult plan;
  const kt::CapturedGraph graph(stream.get(), [&] {
    plan = kiln::sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(
        TensorView::contiguous(q.get(), DType::kBf16, {0, heads, kDims}), p.view(Layout::kCompact),
        TensorView::contiguous(idx.get(), DType::kI32, {0, topk}), TensorView::contiguous(out.get(), DType::kBf16, {0, heads, kDims}),
        TensorView::contiguous(lse.get(), DType::kF32, {0, heads}), 1.0 / std::sqrt(512.0), opt, stream.get());
  });
  const auto after = kiln::KernelService::global().counters();
  CHECK(after.compiles == before.compiles);
  CHECK(after.loads == before.loads);
  CHECK(after.memory_hits == before.memory_hits);
  CHECK(plan.num_splits == 4);  // 40 chunks forced into 4 splits of 10
  CHECK(plan.chunks_per_block == 10);
}

namespace {

// Replays `graph` (one captured launch of `v` on `dev`) `rounds` times, with new Q, indices and
// lengths at the same addresses before every round after the first: each replay against the oracle
// and bit for bit against an eager launch. `what` names the test in its lines.
void check_replays(const kt::CapturedGraph& graph, CUstream stream, const SplitPlanResult& captured, DeviceCase& dev, HostCase& h,
                   const Variant& v, Rng& rng, int rounds, const char* what) {
  const kiln::Driver& d = kiln::Driver::get();
  for (int round = 0; round < rounds; ++round) {
    if (round > 0) {
      draw_inputs(h, rng);
      run_oracle(h);
      dev.upload(h);
    }
    dev.poison();
    d.check(d.cuCtxSynchronize(), "cuCtxSynchronize (uploads and poison before replay)");
    graph.launch(stream);
    d.check(d.cuStreamSynchronize(stream), "cuStreamSynchronize after replay");
    const Outputs replayed{kt::download_outputs(dev), captured};
    const Outputs eager = run_variant(dev, h, v, true);
    const std::string round_name = std::string(what) + " round " + std::to_string(round);
    INFO(h.c.label() << " " << round_name << ": replay differs from eager");
    CHECK(same_bits(replayed, eager));
    const bool ok = check_against_oracle(h, replayed, round_name, nullptr);
    std::printf("%s sparse %s %-90s %s plan %d/%d/%d\n", ok && same_bits(replayed, eager) ? "PASS" : "FAIL", what, h.c.label().c_str(),
                round_name.c_str(), captured.head_tiles, captured.num_splits, captured.chunks_per_block);
    std::fflush(stdout);
  }
}

}  // namespace

// A server warms at start-up and then captures: the first decode of the process runs inside a
// capture, and every fact it reads (kernels, companions, the device's cluster residency) must have
// been read by warm_sparse alone. Hidden: after any other test's eager launch it could not fail, so
// ctest runs it as the only test of its process.
TEST_CASE("sparse: first call of a process captured after warm_sparse alone", "[.][gpu][sparse][first-call]") {
  ScopedPools pools;
  const SparseCase c = with_extra(4, 64, 512, 128, 64, 2, kC, kH, kOn, kBothLen, kUnitLse);
  const std::string& arch = kiln::KernelService::global().device_arch(0);
  for (const SparseKernel kernel : kiln::sparse::sparse_kernels_for(arch, c.heads)) {
    for (const int tiles : {1, 2}) {
      if (tiles == 2 && (kernel != SparseKernel::kMma || c.heads % 32 != 0)) continue;
      for (const bool split : {false, true}) kiln::sparse::warm_sparse({c.heads, tiles, c.has_extra, split, kernel}, {0});
    }
  }
  Rng rng(base_seed() + 5151);
  HostCase h = make_host_case(c, base_seed() + 5151);
  run_oracle(h);
  DeviceCase dev(h);
  const kt::Stream stream;
  SplitPlanResult captured;
  kt::CapturedGraph graph(stream.get(), [&] { captured = dev.launch(Variant{}, h.sm_scale, true, stream.get()); });
  graph.instantiate();
  check_replays(graph, stream.get(), captured, dev, h, Variant{}, rng, 2, "first-call graph");
}

// Captures one launch after warming its exact policy, then replays after rewriting Q, indices and
// lengths in place; every replay must equal an eager launch bit for bit and the oracle within tolerance.
TEST_CASE("sparse: graph replay after in-place index and length changes equals eager", "[gpu][sparse]") {
  ScopedPools pools;
  struct GraphCase {
    SparseCase c;
    Variant v;
  };
  const std::vector<GraphCase> cases = {
      {with_extra(4, 64, 512, 128, 64, 2, kC, kH, kOn, kBothLen, kUnitLse), Variant{}},                // planned (splits)
      {main_only(16, 128, 128, 128, kN, kDom, kMainLen, kLn2Lse), Variant{1, 2}},                      // one split, 2 tiles
      {with_extra(2, 16, 2048, 64, 32, 32, kH, kN, kOff, kExtraLen, kUnitLse), Variant{5, std::nullopt}},  // forced split
      {main_only(3, 64, 512, 64, kC, kOn, kMainLen, kUnitLse), Variant{std::nullopt, std::nullopt, SparseKernel::kMmaSmall}},
      {with_extra(4, 128, 512, 128, 64, 2, kC, kH, kOn, kBothLen, kLn2Lse), Variant{std::nullopt, std::nullopt, SparseKernel::kSm90}},
  };
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const SparseCase& c = cases[ci].c;
    const Variant& v = cases[ci].v;
    Rng rng(base_seed() + 4242 + ci);
    HostCase h = make_host_case(c, base_seed() + 4242 + ci);
    run_oracle(h);
    DeviceCase dev(h);
    // The plan of this call on this device (the spec's), then the launch's key warmed.
    const SparseOptions opt = dev.options(v, true);
    const SplitPlanResult plan = kiln::sparse::plan_sparse_decode(dev.q_view(), pool(c.page, c.large).view(c.layout), dev.indices_view(),
                                                                  dev.out_view(), dev.lse_view(), h.sm_scale, opt, sm_count());
    CHECK(plan == variant_plan(c, v));
    kiln::KernelService::global().warm(variant_key(c, v, kiln::KernelService::global().device_arch(0)), 0);

    const kt::Stream stream;
    SplitPlanResult captured;
    kt::CapturedGraph graph(stream.get(), [&] { captured = dev.launch(v, h.sm_scale, true, stream.get()); });
    graph.instantiate();
    CHECK(captured == plan);

    check_replays(graph, stream.get(), captured, dev, h, v, rng, 3, "graph");
  }
}
