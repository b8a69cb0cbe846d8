// Launcher argument fuzz, host only. For each launcher a seeded generator builds a
// random VALID argument set (fake, aligned, disjoint device addresses: nothing is dereferenced), then
// applies 0..3 mutations from a catalogue. Each mutation is labelled from the spec (not from the
// launcher's code): it keeps the set valid, breaks a named rule, or is "spec-silent" (the spec does
// not say; either outcome is accepted, but only as success or kiln::Error kInvalidArgument/kUnsupported).
// Oracle: valid iff no applied mutation breaks a rule. Valid -> no exception (the writers, and the
// decode engine APIs past validation, need the driver: kDriver counts as accepted on a GPU-less
// machine); invalid -> kiln::Error with kInvalidArgument or kUnsupported. Anything else fails.
// A failure prints the launcher, the seed, the case index and the mutation labels, so
// `fuzz_one(launcher, seed, index)` reproduces it.
//
// Contracts: runtime/mla_decode/README.md ("Arguments"), runtime/sparse_nvfp4/README.md ("Arguments",
// "Chunks, splits, head tiles"), runtime/nvfp4_writer/README.md (the 384-byte format, the writer),
// runtime/dsv41_writer/README.md (the 528 B and 288 B formats, their views, the writers).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/dsv41_writer/writer.h"
#include "kiln/runtime/mla_decode/launcher.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "tests/support/fuzz_views.h"

namespace {

using kiln::DType;
using kiln::Error;
using kiln::ErrorCode;
using kiln::TensorView;
using namespace kiln::testing::fuzz;  // Rng, rnd, coin, region, make, cache_view

constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------------------------------------------
// Helpers

template <class T>
T pick(Rng& r, std::initializer_list<T> xs) {
  return *(xs.begin() + rnd(r, 0, static_cast<std::int64_t>(xs.size()) - 1));
}


std::uintptr_t ptr(const TensorView& v) { return reinterpret_cast<std::uintptr_t>(v.data); }
void set_ptr(TensorView& v, std::uintptr_t a) { v.data = reinterpret_cast<void*>(a); }
// Misaligns: `bytes` past the 256-byte boundary at or below the pointer (every generated pointer is
// 256-byte aligned), so applying it twice never lands back on an aligned address.
void shift(TensorView& v, std::int64_t bytes) { set_ptr(v, (ptr(v) & ~std::uintptr_t(255)) + std::uintptr_t(bytes)); }
// Replace the shape, keeping the pointer and dtype, with contiguous strides.
void reshape(TensorView& v, std::vector<std::int64_t> shape) { v = make(ptr(v), v.dtype, std::move(shape)); }
std::vector<std::int64_t> shape_of(const TensorView& v) { return {v.shape.begin(), v.shape.begin() + v.rank}; }
std::int64_t extent(const TensorView& v) {  // bytes addressed
  std::int64_t n = 1, last = 0;
  for (int d = 0; d < v.rank; ++d) n *= v.shape[d];
  if (n == 0) return 0;
  for (int d = 0; d < v.rank; ++d) last += (v.shape[d] - 1) * v.strides[d];
  return (last + 1) * kiln::dtype_bytes(v.dtype);
}
std::int64_t numel(const TensorView& v) {
  std::int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) n *= v.shape[d];
  return n;
}
// Strides of size-1 dimensions are never used: any value keeps a view contiguous (keeps validity).
void scramble_unit_strides(TensorView& v, Rng& r) {
  for (int d = 0; d < v.rank; ++d)
    if (v.shape[d] == 1) v.strides[d] = rnd(r, 0, 100000);
}
// Breaks contiguity: one dimension of size > 1 gets a different stride. False when impossible.
bool break_contiguity(TensorView& v, Rng& r) {
  std::vector<int> dims;
  for (int d = 0; d < v.rank; ++d)
    if (v.shape[d] > 1) dims.push_back(d);
  if (dims.empty()) return false;
  const int d = dims[rnd(r, 0, static_cast<std::int64_t>(dims.size()) - 1)];
  v.strides[d] = v.strides[d] * 2 + (coin(r) ? 0 : 1);
  return true;
}
// Places the non-empty view `a` so that it starts inside non-empty `b`, keeping `align`-byte alignment.
bool overlap_into(TensorView& a, const TensorView& b, int align) {
  if (numel(a) == 0 || extent(b) == 0 || ptr(b) % align != 0) return false;
  set_ptr(a, ptr(b) + std::uintptr_t((extent(b) - 1) / align / 2) * align);
  return true;
}
// An empty view's pointer placed inside another view: it addresses no byte, so it overlaps nothing.
bool alias_empty_into(TensorView& a, const TensorView& b, int align) {
  if (numel(a) != 0 || extent(b) < 2 * align || ptr(b) % align != 0) return false;
  set_ptr(a, ptr(b) + std::uintptr_t(align));
  return true;
}

enum class Kind { kKeeps, kBreaks, kSilent };

template <class Case>
struct Mutation {
  std::string name;
  Kind kind;
  std::function<bool(Case&, Rng&)> apply;  // false: not applicable to this case (not counted)
  // The broken rule depends on the device (e.g. the planned split count needs the SM count): an
  // engine entry point that must ask the driver first may then end in kDriver on a GPU-less machine.
  bool device_dependent = false;
};

enum class Outcome { kAccepted, kRejected, kWrong };
struct Result {
  Outcome outcome;
  std::string what;
};

// Runs `f`: success (or kDriver when `driver_ok`: the call validated and needed a GPU) is accepted;
// kiln::Error kInvalidArgument/kUnsupported is a rejection; anything else is wrong.
Result run_call(const std::function<void()>& f, bool driver_ok) {
  try {
    f();
    return {Outcome::kAccepted, "accepted"};
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kUnsupported)
      return {Outcome::kRejected, std::string(kiln::error_code_name(e.code())) + ": " + e.what()};
    if (e.code() == ErrorCode::kDriver && driver_ok) return {Outcome::kAccepted, "kDriver (validated, no GPU)"};
    return {Outcome::kWrong, std::string("kiln::Error ") + std::string(kiln::error_code_name(e.code())) + ": " + e.what()};
  } catch (const std::exception& e) {
    return {Outcome::kWrong, std::string("std::exception: ") + e.what()};
  } catch (...) {
    return {Outcome::kWrong, "unknown exception"};
  }
}

struct Stats {
  long tried = 0, valid = 0, invalid = 0, silent = 0, mismatches = 0;
  std::map<std::string, long> mismatch_by_label;
  std::vector<std::string> first;
};

// One fuzz case: generate, mutate, run every entry point `calls`, compare with the oracle.
template <class Case>
void fuzz_case(const char* launcher, std::uint64_t seed, long index, const std::function<Case(Rng&)>& generate,
               const std::vector<Mutation<Case>>& catalogue,
               const std::vector<std::pair<const char*, std::function<Result(const Case&)>>>& calls, Stats& st) {
  Rng r(seed * 0x9E3779B97F4A7C15ull + std::uint64_t(index));
  Case c = generate(r);
  // Pick 0..3 mutations, apply the validity-keeping ones first so a later one can never undo a break.
  std::vector<const Mutation<Case>*> chosen;
  const int n = static_cast<int>(rnd(r, 0, 3));
  for (int i = 0; i < n; ++i) chosen.push_back(&catalogue[rnd(r, 0, static_cast<std::int64_t>(catalogue.size()) - 1)]);
  // Order: keeps, spec-silent, device-dependent breaks (they drop or resize scratch), other breaks,
  // so that a later mutation never undoes an earlier break.
  const auto rank = [](const Mutation<Case>* m) {
    return m->kind == Kind::kKeeps ? 0 : m->kind == Kind::kSilent ? 1 : m->device_dependent ? 2 : 3;
  };
  std::stable_sort(chosen.begin(), chosen.end(), [&](const Mutation<Case>* a, const Mutation<Case>* b) { return rank(a) < rank(b); });
  bool breaks = false, silent = false, device_only = true;
  std::string labels;
  std::vector<std::string> applied;
  for (const Mutation<Case>* m : chosen) {
    if (!m->apply(c, r)) continue;
    breaks |= m->kind == Kind::kBreaks;
    silent |= m->kind == Kind::kSilent;
    if (m->kind == Kind::kBreaks) device_only &= m->device_dependent;
    if (m->kind != Kind::kKeeps) applied.push_back(m->name);
    labels += std::string(labels.empty() ? "" : ", ") + m->name +
              (m->kind == Kind::kKeeps ? " (keeps)" : m->kind == Kind::kBreaks ? " (breaks)" : " (spec-silent)");
  }
  ++st.tried;
  for (const auto& [entry, call] : calls) {
    Result res = call(c);
    // A device-dependent break may only be caught after the driver is asked (kDriver here).
    if (breaks && device_only && res.outcome == Outcome::kAccepted && res.what.rfind("kDriver", 0) == 0) res.outcome = Outcome::kRejected;
    bool ok = res.outcome != Outcome::kWrong;
    if (breaks) ok = ok && res.outcome == Outcome::kRejected;
    else if (!silent) ok = ok && res.outcome == Outcome::kAccepted;
    if (!ok) {
      ++st.mismatches;
      for (const std::string& a : applied) ++st.mismatch_by_label[a + (applied.size() == 1 ? " [alone]" : " [with others]")];
      if (applied.empty()) ++st.mismatch_by_label["(only validity-keeping mutations: " + labels + ")"];
      if (st.first.size() < 12) {
        char head[160];
        std::snprintf(head, sizeof head, "%s/%s seed=%llu case=%ld expected=%s: ", launcher, entry,
                      static_cast<unsigned long long>(seed), index,
                      breaks ? "rejection" : silent ? "either" : "acceptance");
        st.first.push_back(std::string(head) + "mutations [" + labels + "] -> " + res.what);
      }
      break;
    }
  }
  if (breaks) ++st.invalid;
  else if (silent) ++st.silent;
  else ++st.valid;
}

void report(const char* name, const Stats& st, double seconds) {
  std::printf("launcher fuzz %s: %ld sets, %ld valid, %ld invalid rejected, %ld spec-silent, %ld mismatches (%.2f s)\n",
              name, st.tried, st.valid, st.invalid, st.silent, st.mismatches, seconds);
  for (const std::string& s : st.first) std::printf("  MISMATCH %s\n", s.c_str());
  for (const auto& [label, count] : st.mismatch_by_label) std::printf("  mismatch x%ld: [%s]\n", count, label.c_str());
  std::fflush(stdout);
}

constexpr long kSetsPerLauncher = 6000;
constexpr std::uint64_t kSeeds[] = {0x6b696c6e01, 0x6b696c6e02, 0x6b696c6e03};

// ================================================================================================
// MLA decode (runtime/mla_decode/README.md, "Arguments")

namespace mla = kiln::mla;

struct MlaCase {
  bool packed = false;
  int B = 1, SQ = 1, H = 16, page = 64;
  long long total_q = 0, max_seq_len = 1;
  DType dt = DType::kBf16;
  mla::MaskType mask = mla::MaskType::kCausal;
  DType out_dtype = DType::kBf16;
  int lora = 512, rope = 64;
  TensorView q, kv, ws, bt, sl, qo, out;
  bool has_out = true;
  std::optional<int> msq;
  double s1 = 1.0, s2 = 1.0;
  std::size_t ws_need = 0;
  std::int64_t max_pages = 1;
  bool mode_flipped = false;  // qo_indptr added/dropped against the query's layout (only once)

  void refresh_ws() {
    ws_need = mla::mla_workspace_size(H, page, max_seq_len, SQ, packed, dt, out_dtype, mask, B);
    if (static_cast<std::size_t>(numel(ws)) < ws_need) reshape(ws, {static_cast<std::int64_t>(ws_need)});
  }
};

MlaCase mla_generate(Rng& r) {
  MlaCase c;
  c.packed = coin(r, 0.4);
  c.B = coin(r, 0.03) ? 0 : coin(r, 0.8) ? static_cast<int>(rnd(r, 1, 8)) : static_cast<int>(rnd(r, 9, 300));
  c.SQ = static_cast<int>(rnd(r, 1, 8));
  c.H = coin(r, 0.5) ? pick(r, {1, 8, 16, 32, 64, 128}) : static_cast<int>(rnd(r, 1, 128));
  c.page = pick(r, {16, 32, 64, 128});
  c.dt = coin(r, 0.3) ? DType::kE4m3 : DType::kBf16;
  c.mask = coin(r) ? mla::MaskType::kCausal : mla::MaskType::kDense;
  const long long limit = (1LL << 31) - 32768;
  c.max_seq_len = coin(r, 0.7) ? rnd(r, 1, 8192) : coin(r, 0.5) ? rnd(r, 8193, 1 << 20) : rnd(r, 1, limit);
  if (coin(r, 0.05)) c.max_seq_len = limit;
  if (coin(r, 0.05)) c.max_seq_len = 1;
  std::int64_t need_pages = (c.max_seq_len + c.page - 1) / c.page;
  c.max_pages = need_pages + (coin(r) ? 0 : rnd(r, 1, 4));
  while (std::int64_t(c.B) * c.max_pages > kI32Max) {  // spec: the block table's element count fits int32
    c.max_seq_len = std::max<long long>(1, c.max_seq_len / 2);
    need_pages = (c.max_seq_len + c.page - 1) / c.page;
    c.max_pages = need_pages;
  }
  const std::int64_t row_stride = c.max_pages + (coin(r, 0.3) ? rnd(r, 1, 16) : 0);
  c.total_q = c.packed ? (coin(r, 0.05) ? 0 : rnd(r, 0, std::int64_t(c.B) * c.SQ)) : std::int64_t(c.B) * c.SQ;
  c.q = c.packed ? make(region(r, 0), c.dt, {c.total_q, c.H, 576}) : make(region(r, 0), c.dt, {c.B, c.SQ, c.H, 576});
  const std::int64_t pages = coin(r, 0.02) ? 0 : rnd(r, 1, 4096);
  c.kv = coin(r) ? make(region(r, 1), c.dt, {pages, c.page, 576}) : make(region(r, 1), c.dt, {pages, 1, c.page, 576});
  c.bt = make(region(r, 2), DType::kI32, {c.B, c.max_pages});
  c.bt.strides[0] = row_stride;
  c.sl = make(region(r, 3), DType::kI32, {c.B});
  c.qo = make(region(r, 4), DType::kI32, {c.B + 1});
  c.msq = c.packed ? std::optional<int>(c.SQ) : (coin(r) ? std::optional<int>(c.SQ) : std::nullopt);
  c.has_out = coin(r, 0.8);
  c.out = c.packed ? make(region(r, 5), DType::kBf16, {c.total_q, c.H, 512}) : make(region(r, 5), DType::kBf16, {c.B, c.SQ, c.H, 512});
  c.ws = make(region(r, 6), coin(r) ? DType::kU8 : DType::kI8, {0});
  c.refresh_ws();
  reshape(c.ws, {static_cast<std::int64_t>(c.ws_need) + (coin(r) ? 0 : rnd(r, 1, 4096))});
  c.s1 = coin(r) ? 1.0 / std::sqrt(192.0) : std::pow(10.0, std::uniform_real_distribution<double>(-30, 30)(r));
  c.s2 = coin(r) ? 1.0 : std::pow(10.0, std::uniform_real_distribution<double>(-30, 30)(r));
  return c;
}

std::vector<Mutation<MlaCase>> mla_catalogue() {
  using M = Mutation<MlaCase>;
  const auto K = Kind::kKeeps;
  const auto X = Kind::kBreaks;
  const auto S = Kind::kSilent;
  std::vector<M> m = {
      // ---- keep validity
      {"drop out (optional)", K, [](MlaCase& c, Rng&) { c.has_out = false; return true; }},
      {"toggle mask dense/causal", K, [](MlaCase& c, Rng&) {
         c.mask = c.mask == mla::MaskType::kDense ? mla::MaskType::kCausal : mla::MaskType::kDense;
         c.refresh_ws();
         return true;
       }},
      {"fixed: max_seq_len_q = SQ given", K, [](MlaCase& c, Rng&) { if (c.packed) return false; c.msq = c.SQ; return true; }},
      {"fixed: max_seq_len_q omitted", K, [](MlaCase& c, Rng&) { if (c.packed) return false; c.msq.reset(); return true; }},
      {"pad block_tables rows", K, [](MlaCase& c, Rng& r) { c.bt.strides[0] += rnd(r, 1, 64); return true; }},
      {"widen block_tables", K, [](MlaCase& c, Rng& r) {
         const std::int64_t w = c.max_pages + rnd(r, 1, 8);
         if (std::int64_t(c.B) * w > kI32Max) return false;
         const std::int64_t pad = c.bt.strides[0] - c.max_pages;
         c.max_pages = w;
         reshape(c.bt, {c.B, w});
         c.bt.strides[0] = w + pad;
         return true;
       }},
      {"grow workspace", K, [](MlaCase& c, Rng& r) { reshape(c.ws, {numel(c.ws) + rnd(r, 1, 1 << 20)}); return true; }},
      {"workspace int8 instead of uint8", K, [](MlaCase& c, Rng&) { c.ws.dtype = DType::kI8; return true; }},
      {"arbitrary strides on size-1 dims", K, [](MlaCase& c, Rng& r) {
         scramble_unit_strides(c.q, r);
         scramble_unit_strides(c.kv, r);
         scramble_unit_strides(c.out, r);
         scramble_unit_strides(c.sl, r);
         return true;
       }},
      {"kv_cache 3-D <-> 4-D [P,1,page,576]", K, [](MlaCase& c, Rng&) {
         if (c.kv.rank == 3) reshape(c.kv, {c.kv.shape[0], 1, c.page, 576});
         else reshape(c.kv, {c.kv.shape[0], c.page, 576});
         return true;
       }},
      {"bmm scales positive float32 denormal (1e-44)", K, [](MlaCase& c, Rng& r) { (coin(r) ? c.s1 : c.s2) = 1e-44; return true; }},
      {"bmm scales near float32 max (3e38)", K, [](MlaCase& c, Rng& r) { (coin(r) ? c.s1 : c.s2) = 3.0e38; return true; }},
      {"max_seq_len at the limit 2^31-32768 (block table widened)", K, [](MlaCase& c, Rng&) {
         const long long limit = (1LL << 31) - 32768;
         const std::int64_t need = (limit + c.page - 1) / c.page;
         if (std::int64_t(c.B) * need > kI32Max) return false;
         c.max_seq_len = limit;
         c.max_pages = need;
         reshape(c.bt, {c.B, need});
         c.refresh_ws();
         return true;
       }},
      {"empty out aliased inside kv_cache (addresses no byte)", K, [](MlaCase& c, Rng&) {
         return c.has_out && alias_empty_into(c.out, c.kv, 16);
       }},
      // ---- spec-silent
      {"out_dtype float16 ('a plus')", S, [](MlaCase& c, Rng&) { c.out_dtype = DType::kF16; c.out.dtype = DType::kF16; return true; }},
      {"workspace null when no workspace is needed", S, [](MlaCase& c, Rng&) { if (c.ws_need) return false; c.ws.data = nullptr; return true; }},
      // ---- break a rule
      {"kv_lora_rank != 512", X, [](MlaCase& c, Rng& r) { c.lora = pick(r, {0, 128, 256, 511, 513, 576}); return true; }},
      {"qk_rope_head_dim != 64", X, [](MlaCase& c, Rng& r) { c.rope = pick(r, {0, 32, 63, 65, 128}); return true; }},
      {"bmm1_scale NaN/inf/0/negative/underflows float32", X, [](MlaCase& c, Rng& r) {
         c.s1 = pick(r, {kNaN, kInf, -kInf, 0.0, -0.0, -1.0, -1e-3, 1e-46, 1e39, -1e-46});
         return true;
       }},
      {"bmm2_scale NaN/inf/0/negative/underflows float32", X, [](MlaCase& c, Rng& r) {
         c.s2 = pick(r, {kNaN, kInf, -kInf, 0.0, -2.0, 1e-50, 5e38});
         return true;
       }},
      {"max_seq_len out of [1, 2^31-32768]", X, [](MlaCase& c, Rng& r) {
         c.max_seq_len = pick<long long>(r, {0, -1, -(1LL << 40), (1LL << 31) - 32767, 1LL << 31, 1LL << 40,
                                             std::numeric_limits<long long>::max(), std::numeric_limits<long long>::min()});
         return true;
       }},
      {"mask_type out of range", X, [](MlaCase& c, Rng& r) { c.mask = static_cast<mla::MaskType>(pick(r, {2, 7, -1})); return true; }},
      {"out_dtype float32/e4m3", X, [](MlaCase& c, Rng& r) { c.out_dtype = pick(r, {DType::kF32, DType::kE4m3}); return true; }},
      {"query wrong dtype", X, [](MlaCase& c, Rng& r) { c.q.dtype = pick(r, {DType::kF16, DType::kF32, DType::kU8, DType::kI8, DType::kI32}); return true; }},
      {"kv_cache dtype != query dtype", X, [](MlaCase& c, Rng& r) {
         c.kv.dtype = c.dt == DType::kBf16 ? pick(r, {DType::kE4m3, DType::kF16, DType::kU8}) : pick(r, {DType::kBf16, DType::kU8});
         return true;
       }},
      {"query wrong rank", X, [](MlaCase& c, Rng& r) {
         auto s = shape_of(c.q);
         if (coin(r)) s.insert(s.begin(), 1);
         else if (c.packed) s = {s[0], 1, s[1], s[2]};
         else s = {s[0] * s[1], s[2], s[3]};
         reshape(c.q, s);
         return true;
       }},
      {"query last dim != 576", X, [](MlaCase& c, Rng& r) { auto s = shape_of(c.q); s.back() = pick(r, {512, 575, 577, 640, 0}); reshape(c.q, s); return true; }},
      {"query heads 0 or > 128", X, [](MlaCase& c, Rng& r) { auto s = shape_of(c.q); s[s.size() - 2] = pick(r, {0, 129, 256}); reshape(c.q, s); return true; }},
      {"fixed: SQ 0 or > 64", X, [](MlaCase& c, Rng& r) {
         if (c.packed) return false;
         auto s = shape_of(c.q); s[1] = pick(r, {0, 65, 128}); reshape(c.q, s);
         return true;
       }},
      {"query non-contiguous", X, [](MlaCase& c, Rng& r) { return break_contiguity(c.q, r); }},
      {"query misaligned (not 16 B)", X, [](MlaCase& c, Rng& r) { shift(c.q, kiln::dtype_bytes(c.q.dtype) * pick(r, {1, 2, 4})); return true; }},
      {"query null", X, [](MlaCase& c, Rng&) { if (!numel(c.q)) return false; c.q.data = nullptr; return true; }},
      {"kv_cache wrong rank", X, [](MlaCase& c, Rng& r) {
         auto s = shape_of(c.kv);
         reshape(c.kv, coin(r) ? std::vector<std::int64_t>{s[0] * c.page, 576} : std::vector<std::int64_t>{1, s[0], 1, c.page, 576});
         return true;
       }},
      {"kv_cache 4-D with axis 1 != 1", X, [](MlaCase& c, Rng& r) { reshape(c.kv, {c.kv.shape[0], rnd(r, 2, 4), c.page, 576}); return true; }},
      {"kv_cache last dim != 576", X, [](MlaCase& c, Rng& r) { auto s = shape_of(c.kv); s.back() = pick(r, {512, 64, 577}); reshape(c.kv, s); return true; }},
      {"kv_cache page size not 16/32/64/128", X, [](MlaCase& c, Rng& r) {
         auto s = shape_of(c.kv); s[s.size() - 2] = pick(r, {0, 1, 8, 24, 48, 96, 256}); reshape(c.kv, s);
         return true;
       }},
      {"kv_cache non-contiguous", X, [](MlaCase& c, Rng& r) { return break_contiguity(c.kv, r); }},
      {"kv_cache misaligned", X, [](MlaCase& c, Rng& r) { shift(c.kv, pick(r, {1, 2, 8})); return true; }},
      {"kv_cache null", X, [](MlaCase& c, Rng&) { if (!numel(c.kv)) return false; c.kv.data = nullptr; return true; }},
      {"workspace wrong dtype", X, [](MlaCase& c, Rng& r) {
         c.ws.dtype = pick(r, {DType::kBf16, DType::kI32, DType::kF32, DType::kE4m3});
         if (c.ws.dtype == DType::kE4m3) c.ws.dtype = DType::kI64;
         return true;
       }},
      {"workspace non-contiguous", X, [](MlaCase& c, Rng& r) { return break_contiguity(c.ws, r); }},
      {"workspace misaligned (not 32 B)", X, [](MlaCase& c, Rng& r) { shift(c.ws, pick(r, {1, 8, 16})); return true; }},
      {"workspace too small", X, [](MlaCase& c, Rng& r) {
         if (c.ws_need == 0) return false;
         reshape(c.ws, {static_cast<std::int64_t>(c.ws_need) - rnd(r, 1, static_cast<std::int64_t>(c.ws_need))});
         return true;
       }},
      {"workspace null (bytes needed)", X, [](MlaCase& c, Rng&) { if (!c.ws_need) return false; c.ws.data = nullptr; return true; }},
      {"workspace overlaps query", X, [](MlaCase& c, Rng&) { return overlap_into(c.ws, c.q, 32); }},
      {"workspace overlaps kv_cache", X, [](MlaCase& c, Rng&) { return overlap_into(c.ws, c.kv, 32); }},
      {"workspace overlaps block_tables", X, [](MlaCase& c, Rng&) { return overlap_into(c.ws, c.bt, 32); }},
      {"workspace overlaps seq_lens", X, [](MlaCase& c, Rng&) { return overlap_into(c.ws, c.sl, 32); }},
      {"workspace overlaps qo_indptr", X, [](MlaCase& c, Rng&) { return c.packed && overlap_into(c.ws, c.qo, 32); }},
      {"workspace overlaps out", X, [](MlaCase& c, Rng&) { return c.has_out && overlap_into(c.ws, c.out, 32); }},
      {"block_tables wrong dtype", X, [](MlaCase& c, Rng& r) { c.bt.dtype = pick(r, {DType::kI64, DType::kU8, DType::kF32}); return true; }},
      {"block_tables wrong rank", X, [](MlaCase& c, Rng& r) {
         reshape(c.bt, coin(r) ? std::vector<std::int64_t>{c.B * c.max_pages} : std::vector<std::int64_t>{1, c.B, c.max_pages});
         return true;
       }},
      {"block_tables rows != B", X, [](MlaCase& c, Rng& r) {
         const std::int64_t rows = c.B == 0 ? 1 : c.B + pick(r, {-1, 1});
         const std::int64_t rs = c.bt.strides[0];
         reshape(c.bt, {rows, c.max_pages});
         c.bt.strides[0] = rs;
         return true;
       }},
      {"block_tables too narrow (max_pages < ceil(max_seq_len/page))", X, [](MlaCase& c, Rng& r) {
         const std::int64_t need = (c.max_seq_len + c.page - 1) / c.page;
         const std::int64_t w = need - rnd(r, 1, std::min<std::int64_t>(need, 3));
         const std::int64_t rs = c.bt.strides[0];
         reshape(c.bt, {c.B, w});
         c.bt.strides[0] = rs;
         return true;
       }},
      {"block_tables inner stride != 1", X, [](MlaCase& c, Rng& r) {
         if (c.max_pages < 2) return false;
         c.bt.strides[1] = pick(r, {0, 2, 3});
         c.bt.strides[0] = c.max_pages * 3;
         return true;
       }},
      {"block_tables row stride < max_pages", X, [](MlaCase& c, Rng& r) {
         if (c.B < 2) return false;
         c.bt.strides[0] = rnd(r, 0, c.max_pages - 1);
         return true;
       }},
      {"block_tables element count > 2^31-1", X, [](MlaCase& c, Rng& r) {
         if (c.B < 1) return false;
         const std::int64_t w = kI32Max / c.B + rnd(r, 1, 100);
         reshape(c.bt, {c.B, w});
         c.max_pages = w;
         return true;
       }},
      {"block_tables misaligned", X, [](MlaCase& c, Rng& r) { shift(c.bt, pick(r, {1, 2})); return true; }},
      {"block_tables null", X, [](MlaCase& c, Rng&) { if (!numel(c.bt)) return false; c.bt.data = nullptr; return true; }},
      {"seq_lens wrong dtype", X, [](MlaCase& c, Rng& r) { c.sl.dtype = pick(r, {DType::kI64, DType::kF32, DType::kU8}); return true; }},
      {"seq_lens wrong length", X, [](MlaCase& c, Rng& r) { reshape(c.sl, {c.B == 0 ? 1 : c.B + pick(r, {-1, 1})}); return true; }},
      {"seq_lens wrong rank", X, [](MlaCase& c, Rng&) { reshape(c.sl, {c.B, 1}); return true; }},
      {"seq_lens non-contiguous", X, [](MlaCase& c, Rng& r) { return break_contiguity(c.sl, r); }},
      {"seq_lens misaligned", X, [](MlaCase& c, Rng&) { shift(c.sl, 2); return true; }},
      {"seq_lens null", X, [](MlaCase& c, Rng&) { if (!c.B) return false; c.sl.data = nullptr; return true; }},
      {"packed: max_seq_len_q missing", X, [](MlaCase& c, Rng&) { if (!c.packed) return false; c.msq.reset(); return true; }},
      {"packed: max_seq_len_q 0 or > 64", X, [](MlaCase& c, Rng& r) { if (!c.packed) return false; c.msq = pick(r, {0, -1, 65, 128}); return true; }},
      {"packed: total_q > B * max_seq_len_q", X, [](MlaCase& c, Rng& r) {
         if (!c.packed) return false;
         const std::int64_t t = std::int64_t(c.B) * c.SQ + rnd(r, 1, 8);
         reshape(c.q, {t, c.H, 576});
         reshape(c.out, {t, c.H, 512});
         return true;
       }},
      {"packed: qo_indptr wrong length", X, [](MlaCase& c, Rng& r) { if (!c.packed) return false; reshape(c.qo, {c.B + pick(r, {0, 2})}); return true; }},
      {"packed: qo_indptr wrong dtype", X, [](MlaCase& c, Rng& r) { if (!c.packed) return false; c.qo.dtype = pick(r, {DType::kI64, DType::kU8}); return true; }},
      {"packed: qo_indptr misaligned", X, [](MlaCase& c, Rng&) { if (!c.packed) return false; shift(c.qo, 2); return true; }},
      {"packed: qo_indptr null", X, [](MlaCase& c, Rng&) { if (!c.packed) return false; c.qo.data = nullptr; return true; }},
      {"packed: qo_indptr dropped (rank-3 query in fixed mode)", X, [](MlaCase& c, Rng&) {
         if (!c.packed || c.mode_flipped) return false;
         c.packed = false;  // the call passes no qo_indptr now; msq stays = SQ
         c.mode_flipped = true;
         return true;
       }},
      {"fixed: qo_indptr given (rank-4 query in packed mode)", X, [](MlaCase& c, Rng&) {
         if (c.packed || c.mode_flipped) return false;
         c.packed = true;
         c.msq = c.SQ;
         c.mode_flipped = true;
         return true;
       }},
      {"fixed: max_seq_len_q != SQ", X, [](MlaCase& c, Rng& r) { if (c.packed) return false; c.msq = c.SQ + pick(r, {-1, 1, 7}); return true; }},
      {"out wrong dtype (!= out_dtype)", X, [](MlaCase& c, Rng& r) {
         if (!c.has_out) return false;
         c.out.dtype = pick(r, {DType::kF16, DType::kF32, DType::kU8});
         return true;
       }},
      {"out wrong shape", X, [](MlaCase& c, Rng& r) {
         if (!c.has_out) return false;
         auto s = shape_of(c.out);
         const int which = static_cast<int>(rnd(r, 0, 2));
         if (which == 0) s.back() = pick(r, {576, 511, 448});
         else if (which == 1) s[s.size() - 2] += 1;
         else s[0] += 1;
         reshape(c.out, s);
         return true;
       }},
      {"out non-contiguous", X, [](MlaCase& c, Rng& r) { return c.has_out && break_contiguity(c.out, r); }},
      {"out misaligned", X, [](MlaCase& c, Rng& r) { if (!c.has_out) return false; shift(c.out, pick(r, {2, 8})); return true; }},
      {"out null", X, [](MlaCase& c, Rng&) { if (!c.has_out || !numel(c.out)) return false; c.out.data = nullptr; return true; }},
      {"out overlaps query", X, [](MlaCase& c, Rng&) { return c.has_out && overlap_into(c.out, c.q, 16); }},
      {"out overlaps kv_cache", X, [](MlaCase& c, Rng&) { return c.has_out && overlap_into(c.out, c.kv, 16); }},
      {"out overlaps block_tables", X, [](MlaCase& c, Rng&) { return c.has_out && overlap_into(c.out, c.bt, 16); }},
      {"out overlaps seq_lens", X, [](MlaCase& c, Rng&) { return c.has_out && overlap_into(c.out, c.sl, 16); }},
      {"out overlaps qo_indptr", X, [](MlaCase& c, Rng&) { return c.has_out && c.packed && overlap_into(c.out, c.qo, 16); }},
  };
  return m;
}

void mla_validate(const MlaCase& c) {
  mla::validate_mla_arguments(c.q, c.kv, c.ws, c.lora, c.rope, c.bt, c.sl, c.max_seq_len,
                              c.packed ? std::optional<TensorView>(c.qo) : std::nullopt, c.msq,
                              c.has_out ? std::optional<TensorView>(c.out) : std::nullopt, c.s1, c.s2, c.mask, c.out_dtype);
}
void mla_launch(const MlaCase& c) {
  mla::prims_ts_batch_decode_with_kv_cache_mla(c.q, c.kv, c.ws, c.lora, c.rope, c.bt, c.sl, c.max_seq_len,
                                               c.packed ? std::optional<TensorView>(c.qo) : std::nullopt, c.msq,
                                               c.has_out ? std::optional<TensorView>(c.out) : std::nullopt, c.s1, c.s2,
                                               c.mask, c.out_dtype, nullptr);
}

// ================================================================================================
// Sparse NVFP4 decode (runtime/sparse_nvfp4/README.md)

namespace sp = kiln::sparse;

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The spec's planners, written from "Chunks, splits, head tiles" (independent of runtime/sparse_nvfp4).
int spec_head_tiles(std::int64_t T, int H, int topk, int extra, int sms) {
  const std::int64_t chunks = cdiv(topk, 64) + cdiv(extra, 64);
  const std::int64_t ctas = T * H / 16;
  if (H % 32 != 0) return 1;
  if (ctas >= sms) return (sms < 64 && chunks <= 2 && H > 32 && ctas > 2 * sms) ? 1 : 2;
  const std::int64_t third = sms / 3, two_thirds = 2 * sms / 3;
  if (H == 32) return (ctas >= two_thirds || (chunks >= 8 && ctas >= third)) ? 2 : 1;
  if (H == 64) return (chunks >= 8 && third <= ctas && ctas < two_thirds) ? 2 : 1;
  if (H >= 96) return (chunks >= 16 && ctas >= third) ? 2 : 1;
  return 1;
}
int spec_splits(std::int64_t T, int H, int topk, int extra, int sms, int max_splits, int ht) {
  const std::int64_t chunks = cdiv(topk, 64) + cdiv(extra, 64);
  const std::int64_t min_splits = cdiv(chunks, 16);
  const std::int64_t base = T * cdiv(H, 16 * ht);
  std::int64_t splits = min_splits;
  if (chunks > 2 && max_splits > 1) {
    const bool small = sms < 64;
    const std::int64_t grid_cap = small ? sms / 3 : std::int64_t(sms) * 4 / 5;
    const std::int64_t stream_cap = small ? sms / 6 : std::int64_t(sms) * 4 / 5;
    const std::int64_t min_cpb = small ? 2 : (base == 1 ? 1 : 2);
    if (2 * base <= grid_cap) {
      std::int64_t want = min_splits;
      while (2 * want <= max_splits && base * 2 * want <= grid_cap && T * 2 * want <= stream_cap && cdiv(chunks, 2 * want) >= min_cpb)
        want *= 2;
      splits = want;
    } else if (!small && base >= sms && chunks >= 16) {
      const std::int64_t tail = (2 * base) % sms;
      if (tail == 0 || 2 * tail >= sms) splits = std::max<std::int64_t>(splits, 2);
    }
  }
  const std::int64_t cpb = cdiv(chunks, splits);
  return static_cast<int>(cdiv(chunks, cpb));
}

struct SparseCase {
  std::int64_t T = 1;
  int H = 8, topk = 1, extra_topk = 0, sms = 132, planned_splits = 1;
  TensorView q, kv, idx, output, lse, len, sink, xkv, xidx, xlen, mid_out, mid_lse;
  bool has_len = false, has_sink = false, has_xkv = false, has_xidx = false, has_xlen = false, has_mid_out = false,
       has_mid_lse = false;
  double sm_scale = 1.0, lse_scale = 1.0;
  std::optional<int> num_splits, head_tiles;
  int max_splits = 16;

  std::int64_t chunks() const { return cdiv(topk, 64) + cdiv(extra_topk, 64); }
  // Splits the launch will use, from the spec: explicit num_splits normalised, else the planner.
  void replan() {
    const int ht = head_tiles ? *head_tiles : spec_head_tiles(T, H, topk, extra_topk, sms);
    planned_splits = num_splits && *num_splits >= 1 ? static_cast<int>(cdiv(chunks(), cdiv(chunks(), *num_splits)))
                                : spec_splits(T, H, topk, extra_topk, sms, max_splits, ht);
  }
  // Splits known without the device: an explicit num_splits, or the > 16-chunk minimum.
  int host_known_splits() const {
    // (num_splits < 1 only after a breaking mutation: then any value will do)
    return num_splits && *num_splits >= 1 ? static_cast<int>(cdiv(chunks(), cdiv(chunks(), *num_splits)))
                                          : static_cast<int>(cdiv(chunks(), 16));
  }

  sp::SparseOptions options() const {
    sp::SparseOptions o;
    if (has_len) o.topk_length = len;
    if (has_sink) o.attn_sink = sink;
    if (has_xkv) o.extra_kv_cache = xkv;
    if (has_xidx) o.extra_indices = xidx;
    if (has_xlen) o.extra_topk_length = xlen;
    if (has_mid_out) o.mid_out = mid_out;
    if (has_mid_lse) o.mid_lse = mid_lse;
    o.lse_scale = lse_scale;
    o.num_splits = num_splits;
    o.max_splits = max_splits;
    o.head_tiles = head_tiles;
    return o;
  }
};

// A cache in the 384-byte format: [P, page, 384], HND [P, 1, page, 384] or NHD [P, page, 1, 384],
// page stride >= page*384 and a multiple of 16 (padding allowed).
TensorView nvfp4_cache(Rng& r, std::uintptr_t a, std::int64_t pages, std::int64_t page) {
  const std::int64_t stride = page * 384 + (coin(r, 0.3) ? 16 * rnd(r, 1, 64) : 0);
  TensorView v;
  switch (rnd(r, 0, 2)) {
    case 0: v = make(a, DType::kU8, {pages, page, 384}); break;
    case 1: v = make(a, DType::kU8, {pages, 1, page, 384}); break;
    default: v = make(a, DType::kU8, {pages, page, 1, 384}); break;
  }
  v.strides[0] = stride;
  return v;
}
int cache_row_dim(const TensorView& v) { return v.rank == 4 && v.shape[1] == 1 ? 2 : 1; }

SparseCase sparse_generate(Rng& r) {
  SparseCase c;
  c.T = coin(r, 0.08) ? 0 : coin(r, 0.8) ? rnd(r, 1, 16) : rnd(r, 17, 2048);
  c.H = static_cast<int>(8 * (coin(r, 0.5) ? pick(r, {1, 2, 4, 6, 8, 16}) : rnd(r, 1, 16)));
  c.topk = coin(r, 0.5) ? pick(r, {1, 64, 128, 512, 1024, 2048}) : static_cast<int>(rnd(r, 1, 3000));
  c.sms = pick(r, {3, 8, 20, 48, 63, 64, 78, 114, 132, 170, 188});
  c.q = make(region(r, 0), DType::kBf16, {c.T, c.H, 512});
  c.kv = nvfp4_cache(r, region(r, 1), rnd(r, 1, 256), coin(r, 0.5) ? pick(r, {1, 2, 64, 128}) : rnd(r, 1, 300));
  c.idx = coin(r) ? make(region(r, 2), DType::kI32, {c.T, c.topk}) : make(region(r, 2), DType::kI32, {c.T, 1, c.topk});
  c.output = make(region(r, 3), DType::kBf16, {c.T, c.H, 512});
  c.lse = make(region(r, 4), DType::kF32, {c.T, c.H});
  c.len = make(region(r, 5), DType::kI32, {c.T + (coin(r) ? 0 : rnd(r, 1, 9))});
  c.has_len = coin(r, 0.5);
  c.sink = make(region(r, 6), DType::kF32, {c.H + (coin(r) ? 0 : rnd(r, 1, 9))});
  c.has_sink = coin(r, 0.4);
  if (coin(r, 0.4)) {
    c.extra_topk = coin(r) ? pick(r, {64, 512, 1024}) : static_cast<int>(rnd(r, 1, 1500));
    c.has_xkv = c.has_xidx = true;
    c.has_xlen = coin(r);
  }
  c.xkv = nvfp4_cache(r, region(r, 7), rnd(r, 1, 256), rnd(r, 1, 256));
  c.xidx = coin(r) ? make(region(r, 8), DType::kI32, {c.T, c.extra_topk}) : make(region(r, 8), DType::kI32, {c.T, 1, c.extra_topk});
  c.xlen = make(region(r, 9), DType::kI32, {c.T + (coin(r) ? 0 : rnd(r, 1, 5))});
  c.sm_scale = coin(r) ? 1.0 / std::sqrt(512.0) : std::pow(10.0, std::uniform_real_distribution<double>(-20, 20)(r));
  c.lse_scale = pick(r, {1.0, std::log(2.0), 0.5, -1.0, 0.0});
  const std::int64_t chunks = cdiv(c.topk, 64) + cdiv(c.extra_topk, 64);
  const std::int64_t min_splits = cdiv(chunks, 16);
  if (coin(r, 0.25)) c.head_tiles = (c.H % 32 == 0 && coin(r)) ? 2 : 1;
  if (coin(r, 0.25)) {
    c.num_splits = static_cast<int>(rnd(r, min_splits, min_splits + 20));
    if (coin(r, 0.3)) c.max_splits = static_cast<int>(rnd(r, 1, 16));  // ignored with an explicit num_splits
  } else {
    c.max_splits = coin(r, 0.7) ? 16 : static_cast<int>(rnd(r, min_splits, 64));
  }
  c.replan();
  // Scratch: required when the plan splits and T > 0; S >= num_splits.
  const bool need_mid = c.T > 0 && c.planned_splits > 1;
  const std::int64_t S = std::max(1, c.planned_splits) + (coin(r) ? 0 : rnd(r, 1, 4));
  c.mid_out = make(region(r, 10), DType::kBf16, {c.T, c.H, S, 512});
  c.mid_lse = make(region(r, 11), DType::kF32, {c.T, c.H, S});
  c.has_mid_out = c.has_mid_lse = need_mid || coin(r, 0.3);
  return c;
}

// Breaks of the 384-byte cache view rules, shared by kv_cache and extra_kv_cache.
std::vector<Mutation<SparseCase>> cache_breaks(const char* arg, TensorView SparseCase::*field, bool SparseCase::*present) {
  using M = Mutation<SparseCase>;
  const auto X = Kind::kBreaks;
  auto on = [field, present](std::function<bool(TensorView&, Rng&)> f) {
    return [field, present, f](SparseCase& c, Rng& r) { return (!present || c.*present) && f(c.*field, r); };
  };
  const std::string a = arg;
  std::vector<M> m;
  auto add = [&](const std::string& what, std::function<bool(TensorView&, Rng&)> f) {
    m.push_back(M{a + " " + what, X, on(std::move(f))});
  };
  add("wrong dtype", [](TensorView& v, Rng& r) { v.dtype = pick(r, {DType::kI8, DType::kBf16, DType::kE4m3}); return true; });
  add("wrong rank", [](TensorView& v, Rng& r) {
    const std::int64_t ps = v.strides[0];
    const std::int64_t page = v.shape[cache_row_dim(v)];
    if (coin(r)) reshape(v, {v.shape[0] * page, 384});
    else reshape(v, {v.shape[0], 1, page, 1, 384});
    v.strides[0] = ps;
    return true;
  });
  add("last dim != 384", [](TensorView& v, Rng& r) { v.shape[v.rank - 1] = pick(r, {352, 383, 385, 512, 768}); return true; });
  add("4-D with neither axis 1 nor axis 2 == 1", [](TensorView& v, Rng& r) {
    const std::int64_t ps = v.strides[0];
    const std::int64_t page = std::max<std::int64_t>(2, v.shape[cache_row_dim(v)]);
    v = make(ptr(v), DType::kU8, {v.shape[0], rnd(r, 2, 4), page, 384});
    v.strides[0] = std::max(ps, v.shape[1] * page * 384);
    return true;
  });
  add("stride(-1) != 1", [](TensorView& v, Rng& r) { v.strides[v.rank - 1] = pick(r, {0, 2, 4}); return true; });
  add("token stride != 384", [](TensorView& v, Rng& r) {
    const int d = cache_row_dim(v);
    if (v.shape[d] < 2) return false;
    v.strides[d] = pick(r, {352, 368, 400, 512, 0});
    return true;
  });
  add("page stride not a multiple of 16", [](TensorView& v, Rng& r) {
    if (v.shape[0] < 2) return false;
    v.strides[0] = v.strides[0] / 16 * 16 + pick(r, {1, 4, 8});  // set, not add: two of these must not cancel out
    return true;
  });
  add("page stride < page*384", [](TensorView& v, Rng& r) {
    if (v.shape[0] < 2) return false;
    v.strides[0] = v.shape[cache_row_dim(v)] * 384 - 16 * rnd(r, 1, 4);
    if (v.strides[0] < 0) v.strides[0] = 0;
    return true;
  });
  add("page size 0", [](TensorView& v, Rng&) { v.shape[cache_row_dim(v)] = 0; return true; });
  add("base misaligned (not 16 B)", [](TensorView& v, Rng& r) { shift(v, pick(r, {1, 4, 8})); return true; });
  add("null", [](TensorView& v, Rng&) { if (!numel(v)) return false; v.data = nullptr; return true; });
  return m;
}

std::vector<Mutation<SparseCase>> sparse_catalogue() {
  using M = Mutation<SparseCase>;
  const auto K = Kind::kKeeps;
  const auto X = Kind::kBreaks;
  const auto S = Kind::kSilent;
  std::vector<M> m = {
      // ---- keep validity (none of these changes the plan)
      {"pad kv_cache page stride (multiple of 16)", K, [](SparseCase& c, Rng& r) { c.kv.strides[0] += 16 * rnd(r, 1, 100); return true; }},
      {"pad extra_kv_cache page stride", K, [](SparseCase& c, Rng& r) { c.xkv.strides[0] += 16 * rnd(r, 1, 100); return true; }},
      {"longer topk_length / attn_sink (>= T / >= H entries)", K, [](SparseCase& c, Rng& r) {
         reshape(c.len, {c.len.shape[0] + rnd(r, 1, 100)});
         reshape(c.sink, {c.sink.shape[0] + rnd(r, 1, 100)});
         return true;
       }},
      {"add topk_length", K, [](SparseCase& c, Rng&) { c.has_len = true; return true; }},
      {"add attn_sink", K, [](SparseCase& c, Rng&) { c.has_sink = true; return true; }},
      {"add extra_topk_length (extra pool present)", K, [](SparseCase& c, Rng&) { if (!c.has_xidx) return false; c.has_xlen = true; return true; }},
      {"arbitrary strides on size-1 dims", K, [](SparseCase& c, Rng& r) {
         scramble_unit_strides(c.q, r);
         scramble_unit_strides(c.output, r);
         scramble_unit_strides(c.lse, r);
         scramble_unit_strides(c.mid_out, r);
         scramble_unit_strides(c.mid_lse, r);
         return true;
       }},
      {"scratch given with a larger S", K, [](SparseCase& c, Rng& r) {
         const std::int64_t S = c.mid_out.shape[2] + rnd(r, 1, 8);
         reshape(c.mid_out, {c.T, c.H, S, 512});
         reshape(c.mid_lse, {c.T, c.H, S});
         c.has_mid_out = c.has_mid_lse = true;
         return true;
       }},
      {"lse_scale any finite (0, negative, large)", K, [](SparseCase& c, Rng& r) { c.lse_scale = pick(r, {0.0, -3.0, 1e30, -1e-30}); return true; }},
      {"T == 0: empty output aliased inside kv_cache (addresses no byte)", K, [](SparseCase& c, Rng&) {
         return c.T == 0 && alias_empty_into(c.output, c.kv, 16);
       }},
      // ---- spec-silent
      {"q misaligned by one element (spec states no q alignment)", S, [](SparseCase& c, Rng&) { shift(c.q, 2); return true; }},
      {"output misaligned by one element (spec states no alignment)", S, [](SparseCase& c, Rng&) { shift(c.output, 2); return true; }},
      {"sm_scale 0/negative/float32 underflow (spec: 'the logit multiplier')", S, [](SparseCase& c, Rng& r) {
         c.sm_scale = pick(r, {0.0, -0.044, 1e-50});
         return true;
       }},
      {"indices rows padded (spec states no indices row stride)", S, [](SparseCase& c, Rng& r) { c.idx.strides[0] += rnd(r, 1, 64); return true; }},
      {"topk_length rank 2 [T, 1] (spec: '>= T entries')", S, [](SparseCase& c, Rng&) { if (!c.has_len) return false; reshape(c.len, {c.len.shape[0], 1}); return true; }},
      {"extra_indices topk 0", S, [](SparseCase& c, Rng&) {
         if (!c.has_xidx) return false;
         auto s = shape_of(c.xidx); s.back() = 0; reshape(c.xidx, s);
         c.extra_topk = 0;
         c.replan();  // fewer chunks: re-plan and keep the scratch large enough (this mutation only tests topk 0)
         if (c.T > 0 && c.planned_splits > 1) {
           const std::int64_t S = std::max<std::int64_t>(c.planned_splits, c.has_mid_out ? c.mid_out.shape[2] : 0);
           reshape(c.mid_out, {c.T, c.H, S, 512});
           reshape(c.mid_lse, {c.T, c.H, S});
           c.has_mid_out = c.has_mid_lse = true;
         }
         return true;
       }},
      // ---- break a rule
      {"q wrong dtype", X, [](SparseCase& c, Rng& r) { c.q.dtype = pick(r, {DType::kF16, DType::kF32, DType::kE4m3, DType::kU8}); return true; }},
      {"q wrong rank", X, [](SparseCase& c, Rng& r) {
         reshape(c.q, coin(r) ? std::vector<std::int64_t>{c.T * c.H, 512} : std::vector<std::int64_t>{c.T, c.H, 1, 512});
         return true;
       }},
      {"q last dim != 512", X, [](SparseCase& c, Rng& r) { reshape(c.q, {c.T, c.H, pick(r, {448, 576, 511, 0})}); return true; }},
      {"q heads not a multiple of 8 in [8, 128]", X, [](SparseCase& c, Rng& r) {
         const std::int64_t h = pick(r, {0, 4, 12, 20, 127, 136, 256});
         reshape(c.q, {c.T, h, 512});
         reshape(c.output, {c.T, h, 512});
         reshape(c.lse, {c.T, h});
         return true;
       }},
      {"q non-contiguous", X, [](SparseCase& c, Rng& r) { return break_contiguity(c.q, r); }},
      {"q not element-aligned (odd address)", X, [](SparseCase& c, Rng&) { shift(c.q, 1); return true; }},
      {"q null", X, [](SparseCase& c, Rng&) { if (!numel(c.q)) return false; c.q.data = nullptr; return true; }},
      {"indices wrong dtype", X, [](SparseCase& c, Rng& r) { c.idx.dtype = pick(r, {DType::kI64, DType::kU8, DType::kF32}); return true; }},
      {"indices wrong rank", X, [](SparseCase& c, Rng& r) {
         reshape(c.idx, coin(r) ? std::vector<std::int64_t>{c.T * c.topk} : std::vector<std::int64_t>{c.T, 1, 1, c.topk});
         return true;
       }},
      {"indices rows != T", X, [](SparseCase& c, Rng& r) { auto s = shape_of(c.idx); s[0] = c.T + pick(r, {1, 2}); reshape(c.idx, s); return true; }},
      {"indices [T, 2, topk]", X, [](SparseCase& c, Rng&) { reshape(c.idx, {c.T, 2, c.topk}); return true; }},
      {"indices topk 0", X, [](SparseCase& c, Rng&) { auto s = shape_of(c.idx); s.back() = 0; reshape(c.idx, s); return true; }},
      {"indices stride(-1) != 1", X, [](SparseCase& c, Rng& r) {
         if (c.topk < 2) return false;
         c.idx.strides[c.idx.rank - 1] = pick(r, {0, 2});
         c.idx.strides[0] = 2 * c.topk;
         return true;
       }},
      {"indices misaligned", X, [](SparseCase& c, Rng& r) { shift(c.idx, pick(r, {1, 2})); return true; }},
      {"indices null", X, [](SparseCase& c, Rng&) { if (!numel(c.idx)) return false; c.idx.data = nullptr; return true; }},
      {"output wrong dtype", X, [](SparseCase& c, Rng& r) { c.output.dtype = pick(r, {DType::kF16, DType::kF32}); return true; }},
      {"output wrong shape", X, [](SparseCase& c, Rng& r) {
         const int w = static_cast<int>(rnd(r, 0, 3));
         if (w == 0) reshape(c.output, {c.T + 1, c.H, 512});
         else if (w == 1) reshape(c.output, {c.T, c.H + 8, 512});
         else if (w == 2) reshape(c.output, {c.T, c.H, 448});
         else reshape(c.output, {c.T, c.H, 1, 512});
         return true;
       }},
      {"output non-contiguous", X, [](SparseCase& c, Rng& r) { return break_contiguity(c.output, r); }},
      {"output null", X, [](SparseCase& c, Rng&) { if (!numel(c.output)) return false; c.output.data = nullptr; return true; }},
      {"out_lse wrong dtype", X, [](SparseCase& c, Rng& r) { c.lse.dtype = pick(r, {DType::kBf16, DType::kI32}); return true; }},
      {"out_lse wrong shape", X, [](SparseCase& c, Rng& r) {
         const int w = static_cast<int>(rnd(r, 0, 2));
         if (w == 0) reshape(c.lse, {c.T + 1, c.H});
         else if (w == 1) reshape(c.lse, {c.T, c.H + 8});
         else reshape(c.lse, {c.T, c.H, 1});
         return true;
       }},
      {"out_lse non-contiguous", X, [](SparseCase& c, Rng& r) { return break_contiguity(c.lse, r); }},
      {"out_lse not element-aligned", X, [](SparseCase& c, Rng& r) { shift(c.lse, pick(r, {1, 2})); return true; }},
      {"out_lse null", X, [](SparseCase& c, Rng&) { if (!numel(c.lse)) return false; c.lse.data = nullptr; return true; }},
      {"sm_scale NaN/inf", X, [](SparseCase& c, Rng& r) { c.sm_scale = pick(r, {kNaN, kInf, -kInf, 1e39}); return true; }},
      {"lse_scale NaN/inf", X, [](SparseCase& c, Rng& r) { c.lse_scale = pick(r, {kNaN, kInf, -kInf}); return true; }},
      {"topk_length too short (< T entries)", X, [](SparseCase& c, Rng& r) {
         if (c.T < 1) return false;
         c.has_len = true;
         reshape(c.len, {c.T - rnd(r, 1, c.T)});
         return true;
       }},
      {"topk_length wrong dtype", X, [](SparseCase& c, Rng& r) { c.has_len = true; c.len.dtype = pick(r, {DType::kI64, DType::kF32}); return true; }},
      {"topk_length null", X, [](SparseCase& c, Rng&) { if (!numel(c.len)) return false; c.has_len = true; c.len.data = nullptr; return true; }},
      {"topk_length misaligned", X, [](SparseCase& c, Rng&) { c.has_len = true; shift(c.len, 2); return true; }},
      {"attn_sink too short (< H entries)", X, [](SparseCase& c, Rng& r) { c.has_sink = true; reshape(c.sink, {c.H - rnd(r, 1, c.H)}); return true; }},
      {"attn_sink wrong dtype", X, [](SparseCase& c, Rng& r) { c.has_sink = true; c.sink.dtype = pick(r, {DType::kBf16, DType::kF16}); return true; }},
      {"attn_sink null", X, [](SparseCase& c, Rng&) { c.has_sink = true; c.sink.data = nullptr; return true; }},
      {"extra_kv_cache without extra_indices", X, [](SparseCase& c, Rng&) { c.has_xkv = true; c.has_xidx = false; return true; }},
      {"extra_indices without extra_kv_cache", X, [](SparseCase& c, Rng&) { c.has_xidx = true; c.has_xkv = false; return true; }},
      {"extra_topk_length without the extra pool", X, [](SparseCase& c, Rng& r) {
         c.has_xlen = true;
         c.has_xidx = false;
         c.has_xkv = coin(r);
         return true;
       }},
      {"extra_indices rows != T", X, [](SparseCase& c, Rng&) {
         if (!c.has_xidx) return false;
         auto s = shape_of(c.xidx); s[0] = c.T + 1; reshape(c.xidx, s);
         return true;
       }},
      {"extra_indices wrong dtype", X, [](SparseCase& c, Rng&) { if (!c.has_xidx) return false; c.xidx.dtype = DType::kI64; return true; }},
      {"extra_topk_length too short", X, [](SparseCase& c, Rng&) {
         if (!c.has_xidx || c.T < 1) return false;
         c.has_xlen = true;
         reshape(c.xlen, {c.T - 1});
         return true;
       }},
      {"mid_out given without mid_lse", X, [](SparseCase& c, Rng&) { c.has_mid_out = true; c.has_mid_lse = false; return true; }},
      {"mid_lse given without mid_out", X, [](SparseCase& c, Rng&) { c.has_mid_out = false; c.has_mid_lse = true; return true; }},
      {"scratch missing although num_splits or > 16 chunks force a split", X, [](SparseCase& c, Rng&) {
         if (c.T == 0 || c.host_known_splits() < 2) return false;
         c.has_mid_out = c.has_mid_lse = false;
         return true;
       }},
      M{"scratch missing although the planner splits (SM-count dependent)", X, [](SparseCase& c, Rng&) {
          if (c.T == 0 || c.planned_splits < 2 || c.host_known_splits() >= 2) return false;
          c.has_mid_out = c.has_mid_lse = false;
          return true;
        }, true},
      {"scratch S < num_splits forced by num_splits or > 16 chunks", X, [](SparseCase& c, Rng& r) {
         if (c.T == 0 || c.host_known_splits() < 2) return false;
         const std::int64_t S = rnd(r, 0, c.host_known_splits() - 1);
         reshape(c.mid_out, {c.T, c.H, S, 512});
         reshape(c.mid_lse, {c.T, c.H, S});
         c.has_mid_out = c.has_mid_lse = true;
         return true;
       }},
      M{"scratch S < the planner's num_splits (SM-count dependent)", X, [](SparseCase& c, Rng& r) {
          const int known = c.T == 0 ? 0 : c.host_known_splits();
          if (c.T == 0 || c.planned_splits < 2 || known >= c.planned_splits) return false;
          const std::int64_t S = rnd(r, std::max(known, 1), c.planned_splits - 1);
          reshape(c.mid_out, {c.T, c.H, S, 512});
          reshape(c.mid_lse, {c.T, c.H, S});
          c.has_mid_out = c.has_mid_lse = true;
          return true;
        }, true},
      {"mid_out wrong shape", X, [](SparseCase& c, Rng& r) {
         const std::int64_t S = c.mid_out.shape[2];
         const int w = static_cast<int>(rnd(r, 0, 3));
         if (w == 0) reshape(c.mid_out, {c.T + 1, c.H, S, 512});
         else if (w == 1) reshape(c.mid_out, {c.T, c.H + 8, S, 512});
         else if (w == 2) reshape(c.mid_out, {c.T, c.H, S, 511});
         else reshape(c.mid_out, {c.T, c.H, S});
         c.has_mid_out = c.has_mid_lse = true;
         return true;
       }},
      {"mid_lse S != mid_out S", X, [](SparseCase& c, Rng&) {
         reshape(c.mid_lse, {c.T, c.H, c.mid_out.shape[2] + 1});
         c.has_mid_out = c.has_mid_lse = true;
         return true;
       }},
      {"mid_out wrong dtype", X, [](SparseCase& c, Rng& r) { c.has_mid_out = c.has_mid_lse = true; c.mid_out.dtype = pick(r, {DType::kF32, DType::kF16}); return true; }},
      {"mid_lse wrong dtype", X, [](SparseCase& c, Rng&) { c.has_mid_out = c.has_mid_lse = true; c.mid_lse.dtype = DType::kBf16; return true; }},
      {"mid_out non-contiguous", X, [](SparseCase& c, Rng& r) { c.has_mid_out = c.has_mid_lse = true; return break_contiguity(c.mid_out, r); }},
      {"mid_out null", X, [](SparseCase& c, Rng&) {
         if (!numel(c.mid_out)) return false;
         c.has_mid_out = c.has_mid_lse = true;
         c.mid_out.data = nullptr;
         return true;
       }},
      {"num_splits 0 or negative", X, [](SparseCase& c, Rng& r) { c.num_splits = pick(r, {0, -1, -100}); return true; }},
      {"num_splits too few (> 16 chunks per block)", X, [](SparseCase& c, Rng&) {
         const std::int64_t chunks = cdiv(c.topk, 64) + cdiv(c.extra_topk, 64);
         if (chunks <= 16) return false;
         c.num_splits = static_cast<int>(cdiv(chunks, 16) - 1);
         return true;
       }},
      {"max_splits 0 or negative", X, [](SparseCase& c, Rng& r) { c.max_splits = pick(r, {0, -1}); return true; }},
      {"max_splits below the needed splits (no num_splits)", X, [](SparseCase& c, Rng&) {
         const std::int64_t chunks = cdiv(c.topk, 64) + cdiv(c.extra_topk, 64);
         if (cdiv(chunks, 16) < 2) return false;
         c.num_splits.reset();
         c.max_splits = static_cast<int>(cdiv(chunks, 16) - 1);
         return true;
       }},
      {"head_tiles not 1 or 2", X, [](SparseCase& c, Rng& r) { c.head_tiles = pick(r, {0, 3, 4, -1}); return true; }},
      {"head_tiles 2 with H % 32 != 0", X, [](SparseCase& c, Rng&) { if (c.H % 32 == 0) return false; c.head_tiles = 2; return true; }},
      {"output overlaps q", X, [](SparseCase& c, Rng&) { return overlap_into(c.output, c.q, 16); }},
      {"output overlaps kv_cache", X, [](SparseCase& c, Rng&) { return overlap_into(c.output, c.kv, 16); }},
      {"out_lse overlaps indices", X, [](SparseCase& c, Rng&) { return overlap_into(c.lse, c.idx, 4); }},
      {"out_lse overlaps output", X, [](SparseCase& c, Rng&) { return overlap_into(c.lse, c.output, 4); }},
      {"output overlaps attn_sink", X, [](SparseCase& c, Rng&) { c.has_sink = true; return overlap_into(c.output, c.sink, 16); }},
      {"out_lse overlaps extra_kv_cache", X, [](SparseCase& c, Rng&) { return c.has_xkv && overlap_into(c.lse, c.xkv, 16); }},
      {"mid_out overlaps kv_cache", X, [](SparseCase& c, Rng&) {
         c.has_mid_out = c.has_mid_lse = true;
         return overlap_into(c.mid_out, c.kv, 16);
       }},
      {"mid_lse overlaps output", X, [](SparseCase& c, Rng&) {
         c.has_mid_out = c.has_mid_lse = true;
         return overlap_into(c.mid_lse, c.output, 16);
       }},
  };
  for (auto& x : cache_breaks("kv_cache", &SparseCase::kv, nullptr)) m.push_back(x);
  for (auto& x : cache_breaks("extra_kv_cache", &SparseCase::xkv, &SparseCase::has_xkv)) m.push_back(x);
  return m;
}

// ================================================================================================
// NVFP4 writer: pack and append (writer.h, README "NVFP4 cache writer", the 384-byte format)

namespace nv = kiln::nvfp4;

struct WriterCase {
  bool append = false;
  std::int64_t P = 1, page = 1, N = 0;
  TensorView cache, latent, rows, slots;
};

WriterCase writer_generate(Rng& r, bool append) {
  WriterCase c;
  c.append = append;
  c.P = coin(r, 0.03) ? 0 : rnd(r, 1, 64);
  c.page = coin(r, 0.05) ? 1024 : coin(r, 0.5) ? pick<std::int64_t>(r, {1, 16, 32, 64, 128}) : rnd(r, 1, 300);
  c.cache = nvfp4_cache(r, region(r, 0), c.P, c.page);
  // latent [P, page, 512] bf16: rows 16-byte aligned (row stride a multiple of 8), pages back to back.
  const std::int64_t row_stride = 512 + (coin(r, 0.3) ? 8 * rnd(r, 1, 16) : 0);
  c.latent = make(region(r, 1), DType::kBf16, {c.P, c.page, 512});
  c.latent.strides[1] = row_stride;
  c.latent.strides[0] = row_stride * c.page;
  c.N = coin(r, 0.03) ? 0 : rnd(r, 1, 600);
  c.rows = make(region(r, 2), DType::kBf16, {c.N, 512});
  c.rows.strides[0] = 512 + (coin(r, 0.3) ? 8 * rnd(r, 1, 16) : 0);
  c.slots = make(region(r, 3), DType::kI32, {c.N});
  return c;
}

std::vector<Mutation<WriterCase>> writer_catalogue(bool append) {
  using M = Mutation<WriterCase>;
  const auto K = Kind::kKeeps;
  const auto X = Kind::kBreaks;
  std::vector<M> m = {
      {"pad cache page stride (multiple of 16)", K, [](WriterCase& c, Rng& r) { c.cache.strides[0] += 16 * rnd(r, 1, 50); return true; }},
      {"cache: arbitrary strides on size-1 dims", K, [](WriterCase& c, Rng& r) {
         const std::int64_t ps = c.cache.strides[0];
         scramble_unit_strides(c.cache, r);
         c.cache.strides[0] = ps;  // dim 0 keeps its page stride (P == 1: any stride is fine anyway)
         return true;
       }},
      {"cache wrong dtype", X, [](WriterCase& c, Rng& r) { c.cache.dtype = pick(r, {DType::kI8, DType::kBf16, DType::kE4m3}); return true; }},
      {"cache wrong rank", X, [](WriterCase& c, Rng& r) {
         const std::int64_t ps = c.cache.strides[0];
         if (coin(r)) reshape(c.cache, {c.P * c.page, 384});
         else reshape(c.cache, {c.P, 1, c.page, 1, 384});
         c.cache.strides[0] = ps;
         return true;
       }},
      {"cache last dim != 384", X, [](WriterCase& c, Rng& r) { c.cache.shape[c.cache.rank - 1] = pick(r, {352, 383, 512}); return true; }},
      {"cache 4-D with neither axis 1 nor 2 == 1", X, [](WriterCase& c, Rng& r) {
         const std::int64_t page = std::max<std::int64_t>(2, c.page);
         c.cache = make(ptr(c.cache), DType::kU8, {c.P, rnd(r, 2, 3), page, 384});
         return true;
       }},
      {"cache stride(-1) != 1", X, [](WriterCase& c, Rng& r) { c.cache.strides[c.cache.rank - 1] = pick(r, {0, 2}); return true; }},
      {"cache token stride != 384", X, [](WriterCase& c, Rng& r) {
         const int d = cache_row_dim(c.cache);
         if (c.page < 2) return false;
         c.cache.strides[d] = pick(r, {352, 400, 0});
         return true;
       }},
      {"cache page stride not a multiple of 16", X, [](WriterCase& c, Rng& r) { if (c.P < 2) return false; c.cache.strides[0] = c.cache.strides[0] / 16 * 16 + pick(r, {1, 8}); return true; }},  // set, not add: two of these must not cancel out
      {"cache page stride < page*384", X, [](WriterCase& c, Rng&) { if (c.P < 2) return false; c.cache.strides[0] = c.page * 384 - 16; return true; }},
      {"cache page size 0 or > 1024", X, [](WriterCase& c, Rng& r) {
         const std::int64_t page = pick<std::int64_t>(r, {0, 1025, 4096});
         c.cache.shape[cache_row_dim(c.cache)] = page;
         c.cache.strides[0] = std::max<std::int64_t>(16, page * 384);
         c.page = page;
         reshape(c.latent, {c.P, page, 512});
         return true;
       }},
      {"cache base misaligned (not 16 B)", X, [](WriterCase& c, Rng& r) { shift(c.cache, pick(r, {1, 4, 8})); return true; }},
      {"cache null", X, [](WriterCase& c, Rng&) { if (!numel(c.cache)) return false; c.cache.data = nullptr; return true; }},
  };
  if (!append) {
    std::vector<M> p = {
        {"latent: arbitrary stride on size-1 page dim", K, [](WriterCase& c, Rng& r) {
           if (c.P != 1) return false;
           c.latent.strides[0] = rnd(r, 0, 1 << 20);
           return true;
         }},
        {"latent wrong dtype", X, [](WriterCase& c, Rng& r) { c.latent.dtype = pick(r, {DType::kF16, DType::kF32, DType::kU8}); return true; }},
        {"latent wrong rank", X, [](WriterCase& c, Rng& r) {
           reshape(c.latent, coin(r) ? std::vector<std::int64_t>{c.P * c.page, 512} : std::vector<std::int64_t>{c.P, c.page, 1, 512});
           return true;
         }},
        {"latent last dim != 512", X, [](WriterCase& c, Rng& r) { c.latent.shape[2] = pick(r, {448, 576, 511}); return true; }},
        {"latent P != cache P", X, [](WriterCase& c, Rng& r) { c.latent.shape[0] = c.P + pick(r, {1, 2}); return true; }},
        {"latent page != cache page", X, [](WriterCase& c, Rng&) { c.latent.shape[1] = c.page + 1; c.latent.strides[0] = c.latent.strides[1] * c.latent.shape[1]; return true; }},
        {"latent stride(-1) != 1", X, [](WriterCase& c, Rng& r) { c.latent.strides[2] = pick(r, {0, 2}); return true; }},
        {"latent row stride not a multiple of 8 elements", X, [](WriterCase& c, Rng& r) {
           if (c.page < 2) return false;
           c.latent.strides[1] += pick(r, {1, 2, 4});
           c.latent.strides[0] = c.latent.strides[1] * c.page;
           return true;
         }},
        {"latent pages not back to back (writer.cpp rule)", X, [](WriterCase& c, Rng& r) {
           if (c.P < 2) return false;
           c.latent.strides[0] += 8 * rnd(r, 1, 10);
           return true;
         }},
        {"latent misaligned (not 16 B)", X, [](WriterCase& c, Rng& r) { shift(c.latent, pick(r, {2, 8})); return true; }},
        {"latent null", X, [](WriterCase& c, Rng&) { if (!numel(c.latent)) return false; c.latent.data = nullptr; return true; }},
        {"latent overlaps cache", X, [](WriterCase& c, Rng&) { return overlap_into(c.latent, c.cache, 16); }},
    };
    m.insert(m.end(), p.begin(), p.end());
  } else {
    std::vector<M> a = {
        {"rows: arbitrary row stride when N == 1", K, [](WriterCase& c, Rng& r) {
           if (c.N != 1) return false;
           c.rows.strides[0] = rnd(r, 0, 1 << 20);
           return true;
         }},
        {"slot_mapping: arbitrary stride when N == 1", K, [](WriterCase& c, Rng& r) { if (c.N != 1) return false; c.slots.strides[0] = rnd(r, 0, 99); return true; }},
        {"T == 0: empty rows aliased inside cache (addresses no byte)", K, [](WriterCase& c, Rng&) {
           return c.N == 0 && alias_empty_into(c.rows, c.cache, 16);
         }},
        {"rows wrong dtype", X, [](WriterCase& c, Rng& r) { c.rows.dtype = pick(r, {DType::kF16, DType::kF32}); return true; }},
        {"rows wrong rank", X, [](WriterCase& c, Rng& r) {
           reshape(c.rows, coin(r) ? std::vector<std::int64_t>{c.N * 512} : std::vector<std::int64_t>{1, c.N, 512});
           return true;
         }},
        {"rows last dim != 512", X, [](WriterCase& c, Rng& r) { c.rows.shape[1] = pick(r, {448, 576}); return true; }},
        {"rows stride(-1) != 1", X, [](WriterCase& c, Rng& r) { c.rows.strides[1] = pick(r, {0, 2}); return true; }},
        {"rows row stride not a multiple of 8", X, [](WriterCase& c, Rng& r) { if (c.N < 2) return false; c.rows.strides[0] += pick(r, {1, 3}); return true; }},
        {"rows misaligned (not 16 B)", X, [](WriterCase& c, Rng& r) { shift(c.rows, pick(r, {2, 8})); return true; }},
        {"rows null", X, [](WriterCase& c, Rng&) { if (!c.N) return false; c.rows.data = nullptr; return true; }},
        {"rows overlap cache", X, [](WriterCase& c, Rng&) { return overlap_into(c.rows, c.cache, 16); }},
        {"slot_mapping wrong dtype", X, [](WriterCase& c, Rng& r) { c.slots.dtype = pick(r, {DType::kI64, DType::kU8, DType::kF32}); return true; }},
        {"slot_mapping wrong length", X, [](WriterCase& c, Rng& r) { reshape(c.slots, {c.N + pick(r, {1, 2})}); return true; }},
        {"slot_mapping wrong rank", X, [](WriterCase& c, Rng&) { reshape(c.slots, {c.N, 1}); return true; }},
        {"slot_mapping non-contiguous", X, [](WriterCase& c, Rng& r) { return break_contiguity(c.slots, r); }},
        {"slot_mapping misaligned (not 4 B)", X, [](WriterCase& c, Rng& r) { if (!c.N) return false; shift(c.slots, pick(r, {1, 2})); return true; }},
        {"slot_mapping null", X, [](WriterCase& c, Rng&) { if (!c.N) return false; c.slots.data = nullptr; return true; }},
        {"slot_mapping overlaps cache", X, [](WriterCase& c, Rng&) { return overlap_into(c.slots, c.cache, 4); }},
    };
    m.insert(m.end(), a.begin(), a.end());
  }
  return m;
}

// ================================================================================================
// DeepSeek-V4.1 writers: pack and append into the 528 B / 288 B caches (runtime/dsv41_writer/README.md)

namespace dw = kiln::dsv41;

struct Dsv41Case {
  dw::CacheFormat format = dw::CacheFormat::kFp8;
  std::int64_t rec = 528, P = 1, page = 1, N = 0;
  TensorView cache, latent, rows, slots;
};

int dsv41_row_dim(const TensorView& v) { return v.rank == 2 ? -1 : cache_row_dim(v); }

Dsv41Case dsv41_generate(Rng& r) {
  Dsv41Case c;
  c.format = coin(r) ? dw::CacheFormat::kFp8 : dw::CacheFormat::kFp4;
  c.rec = c.format == dw::CacheFormat::kFp8 ? 528 : 288;
  c.P = rnd(r, 1, 64);
  c.page = coin(r, 0.5) ? pick<std::int64_t>(r, {1, 2, 32, 53, 61, 64, 128}) : rnd(r, 1, 300);
  c.cache = cache_view(r, region(r, 0), c.P, c.page, c.rec, 64);
  const DType dt = coin(r) ? DType::kBf16 : DType::kF16;
  c.latent = make(region(r, 1), dt, {c.P, c.page, 512});
  c.N = coin(r, 0.03) ? 0 : rnd(r, 1, 600);
  c.rows = make(region(r, 2), dt, {c.N, 512});
  c.slots = make(region(r, 3), coin(r) ? DType::kI32 : DType::kI64, {c.N});
  return c;
}

std::vector<Mutation<Dsv41Case>> dsv41_catalogue(bool append) {
  using M = Mutation<Dsv41Case>;
  const auto K = Kind::kKeeps;
  const auto X = Kind::kBreaks;
  std::vector<M> m = {
      {"pad cache page stride (multiple of 16)", K, [](Dsv41Case& c, Rng& r) { c.cache.strides[0] += 16 * rnd(r, 1, 50); return true; }},
      {"cache: arbitrary strides on size-1 dims", K, [](Dsv41Case& c, Rng& r) {
         const std::int64_t ps = c.cache.strides[0];
         scramble_unit_strides(c.cache, r);
         c.cache.strides[0] = ps;
         return true;
       }},
      {"cache: another accepted view of the same pages", K, [](Dsv41Case& c, Rng& r) {
         const std::int64_t ps = c.cache.strides[0];
         c.cache = cache_view(r, ptr(c.cache), c.P, c.page, c.rec, 64);
         c.cache.strides[0] = ps;
         return true;
       }},
      {"cache wrong dtype", X, [](Dsv41Case& c, Rng& r) { c.cache.dtype = pick(r, {DType::kI8, DType::kBf16, DType::kE4m3}); return true; }},
      {"cache rank 1 or 5", X, [](Dsv41Case& c, Rng& r) {
         if (coin(r)) reshape(c.cache, {c.P * c.page * c.rec});
         else reshape(c.cache, {c.P, 1, c.page, 1, c.rec});
         return true;
       }},
      {"cache record of the other format or the 384 B one", X, [](Dsv41Case& c, Rng& r) {
         const std::int64_t other = pick<std::int64_t>(r, {384, c.rec == 528 ? 288 : 528});
         if (c.cache.rank == 2) c.cache.shape[1] = c.page * c.rec + pick<std::int64_t>(r, {16, -16});  // not a multiple
         else c.cache.shape[c.cache.rank - 1] = other;
         return true;
       }},
      {"cache 4-D with neither axis 1 nor 2 == 1", X, [](Dsv41Case& c, Rng& r) {
         c.cache = make(ptr(c.cache), DType::kU8, {c.P, rnd(r, 2, 3), std::max<std::int64_t>(2, c.page), c.rec});
         return true;
       }},
      {"cache stride(-1) != 1", X, [](Dsv41Case& c, Rng& r) { c.cache.strides[c.cache.rank - 1] = pick(r, {0, 2}); return true; }},
      {"cache rows not packed", X, [](Dsv41Case& c, Rng& r) {
         const int d = dsv41_row_dim(c.cache);
         if (d < 0 || c.page < 2) return false;
         c.cache.strides[d] = c.rec + pick<std::int64_t>(r, {16, -16, 512});
         return true;
       }},
      {"cache page stride not a multiple of 16", X, [](Dsv41Case& c, Rng& r) { if (c.P < 2) return false; c.cache.strides[0] = c.cache.strides[0] / 16 * 16 + pick(r, {1, 8}); return true; }},
      {"cache page stride < page * record", X, [](Dsv41Case& c, Rng&) { if (c.P < 2) return false; c.cache.strides[0] = c.page * c.rec - 16; return true; }},
      {"cache with no page", X, [](Dsv41Case& c, Rng&) { c.cache.shape[0] = 0; c.P = 0; return true; }},
      {"cache page of 2^31 rows or more (unsupported)", X, [](Dsv41Case& c, Rng& r) {
         const std::int64_t page = std::int64_t{1} << rnd(r, 31, 36);  // extents stay far inside int64
         const int d = dsv41_row_dim(c.cache);
         c.cache.shape[d < 0 ? 1 : d] = d < 0 ? page * c.rec : page;
         c.cache.strides[0] = page * c.rec;
         return true;
       }},
      {"cache base misaligned (not 16 B)", X, [](Dsv41Case& c, Rng& r) { shift(c.cache, pick(r, {1, 4, 8})); return true; }},
      {"cache null", X, [](Dsv41Case& c, Rng&) { c.cache.data = nullptr; return true; }},
  };
  if (!append) {
    std::vector<M> p = {
        {"latent with a singleton head axis (HND or NHD)", K, [](Dsv41Case& c, Rng& r) {
           reshape(c.latent, coin(r) ? std::vector<std::int64_t>{c.P, 1, c.page, 512} : std::vector<std::int64_t>{c.P, c.page, 1, 512});
           return true;
         }},
        {"latent wrong dtype", X, [](Dsv41Case& c, Rng& r) { c.latent.dtype = pick(r, {DType::kF32, DType::kU8, DType::kE4m3}); return true; }},
        {"latent 2-D (no page dimension)", X, [](Dsv41Case& c, Rng&) { reshape(c.latent, {c.P * c.page, 512}); return true; }},
        {"latent 4-D without a singleton axis", X, [](Dsv41Case& c, Rng&) {
           if (c.page < 2) return false;
           reshape(c.latent, {c.P, 2, c.page, 512});
           return true;
         }},
        {"latent last dim != 512", X, [](Dsv41Case& c, Rng& r) { c.latent.shape[2] = pick(r, {448, 576, 511}); return true; }},
        {"latent P != cache P", X, [](Dsv41Case& c, Rng& r) { reshape(c.latent, {c.P + pick(r, {1, 2}), c.page, 512}); return true; }},
        {"latent page != cache page", X, [](Dsv41Case& c, Rng&) { reshape(c.latent, {c.P, c.page + 1, 512}); return true; }},
        {"latent not contiguous", X, [](Dsv41Case& c, Rng& r) { return break_contiguity(c.latent, r); }},
        {"latent misaligned (not 16 B)", X, [](Dsv41Case& c, Rng& r) { shift(c.latent, pick(r, {2, 8})); return true; }},
        {"latent null", X, [](Dsv41Case& c, Rng&) { c.latent.data = nullptr; return true; }},
        {"latent overlaps cache", X, [](Dsv41Case& c, Rng&) { return overlap_into(c.latent, c.cache, 16); }},
    };
    m.insert(m.end(), p.begin(), p.end());
  } else {
    std::vector<M> a = {
        {"rows [N, 1, 512]", K, [](Dsv41Case& c, Rng&) { reshape(c.rows, {c.N, 1, 512}); return true; }},
        {"rows: arbitrary row stride when N == 1", K, [](Dsv41Case& c, Rng& r) {
           if (c.N != 1) return false;
           c.rows.strides[0] = rnd(r, 0, 1 << 20);
           return true;
         }},
        {"slot_mapping: arbitrary stride when N == 1", K, [](Dsv41Case& c, Rng& r) { if (c.N != 1) return false; c.slots.strides[0] = rnd(r, 0, 99); return true; }},
        {"N == 0: empty rows aliased inside cache (addresses no byte)", K, [](Dsv41Case& c, Rng&) { return c.N == 0 && alias_empty_into(c.rows, c.cache, 16); }},
        {"rows wrong dtype", X, [](Dsv41Case& c, Rng& r) { c.rows.dtype = pick(r, {DType::kF32, DType::kU8}); return true; }},
        {"rows wrong rank or head axis", X, [](Dsv41Case& c, Rng& r) {
           reshape(c.rows, coin(r) ? std::vector<std::int64_t>{c.N * 512} : std::vector<std::int64_t>{c.N, 2, 512});
           return true;
         }},
        {"rows last dim != 512", X, [](Dsv41Case& c, Rng& r) { c.rows.shape[1] = pick(r, {448, 576}); return true; }},
        {"rows not contiguous", X, [](Dsv41Case& c, Rng& r) { return break_contiguity(c.rows, r); }},
        {"rows misaligned (not 16 B)", X, [](Dsv41Case& c, Rng& r) { if (!c.N) return false; shift(c.rows, pick(r, {2, 8})); return true; }},
        {"rows null", X, [](Dsv41Case& c, Rng&) { if (!c.N) return false; c.rows.data = nullptr; return true; }},
        {"rows overlap cache", X, [](Dsv41Case& c, Rng&) { return overlap_into(c.rows, c.cache, 16); }},
        {"slot_mapping wrong dtype", X, [](Dsv41Case& c, Rng& r) { c.slots.dtype = pick(r, {DType::kU8, DType::kF32, DType::kI8}); return true; }},
        {"slot_mapping wrong length", X, [](Dsv41Case& c, Rng& r) { reshape(c.slots, {c.N + pick(r, {1, 2})}); return true; }},
        {"slot_mapping wrong rank", X, [](Dsv41Case& c, Rng&) { reshape(c.slots, {c.N, 1}); return true; }},
        {"slot_mapping non-contiguous", X, [](Dsv41Case& c, Rng& r) { return break_contiguity(c.slots, r); }},
        {"slot_mapping misaligned", X, [](Dsv41Case& c, Rng& r) { if (!c.N) return false; shift(c.slots, pick(r, {1, 2})); return true; }},
        {"slot_mapping null", X, [](Dsv41Case& c, Rng&) { if (!c.N) return false; c.slots.data = nullptr; return true; }},
        {"slot_mapping overlaps cache", X, [](Dsv41Case& c, Rng&) { return overlap_into(c.slots, c.cache, 8); }},
    };
    m.insert(m.end(), a.begin(), a.end());
  }
  return m;
}

// ------------------------------------------------------------------------------------------------

template <class Case>
Stats fuzz_launcher(const char* name, const std::function<Case(Rng&)>& gen, const std::vector<Mutation<Case>>& cat,
                    const std::vector<std::pair<const char*, std::function<Result(const Case&)>>>& calls) {
  Stats st;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t seed : kSeeds)
    for (long i = 0; i < kSetsPerLauncher / static_cast<long>(std::size(kSeeds)); ++i) fuzz_case<Case>(name, seed, i, gen, cat, calls, st);
  report(name, st, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return st;
}

void check_stats(const Stats& st) {
  CHECK(st.tried >= 5000);
  CHECK(st.valid > 500);
  CHECK(st.invalid > 1000);
  for (const std::string& s : st.first) UNSCOPED_INFO(s);
  CHECK(st.mismatches == 0);
}

}  // namespace

TEST_CASE("launcher fuzz: MLA decode arguments", "[unit][fuzz]") {
  const Stats st = fuzz_launcher<MlaCase>(
      "mla_decode", mla_generate, mla_catalogue(),
      {{"validate_mla_arguments", [](const MlaCase& c) { return run_call([&] { mla_validate(c); }, false); }},
       {"prims_ts_batch_decode_with_kv_cache_mla", [](const MlaCase& c) { return run_call([&] { mla_launch(c); }, true); }}});
  check_stats(st);
}

TEST_CASE("launcher fuzz: sparse NVFP4 decode arguments", "[unit][fuzz]") {
  const Stats st = fuzz_launcher<SparseCase>(
      "sparse_nvfp4_decode", sparse_generate, sparse_catalogue(),
      {{"plan_sparse_decode",
        [](const SparseCase& c) {
          return run_call([&] { sp::plan_sparse_decode(c.q, c.kv, c.idx, c.output, c.lse, c.sm_scale, c.options(), c.sms); }, false);
        }},
       {"cake_sparse_mla_sm120_dsv4_nvfp4_decode", [](const SparseCase& c) {
          return run_call(
              [&] { sp::cake_sparse_mla_sm120_dsv4_nvfp4_decode(c.q, c.kv, c.idx, c.output, c.lse, c.sm_scale, c.options(), nullptr); },
              true);
        }}});
  check_stats(st);
}

TEST_CASE("launcher fuzz: NVFP4 writer pack arguments", "[unit][fuzz]") {
  const Stats st = fuzz_launcher<WriterCase>(
      "nvfp4_writer_pack", [](Rng& r) { return writer_generate(r, false); }, writer_catalogue(false),
      {{"pack", [](const WriterCase& c) { return run_call([&] { nv::pack(c.latent, c.cache, nullptr); }, true); }}});
  check_stats(st);
}

TEST_CASE("launcher fuzz: NVFP4 writer append arguments", "[unit][fuzz]") {
  const Stats st = fuzz_launcher<WriterCase>(
      "nvfp4_writer_append", [](Rng& r) { return writer_generate(r, true); }, writer_catalogue(true),
      {{"append", [](const WriterCase& c) { return run_call([&] { nv::append(c.rows, c.slots, c.cache, nullptr); }, true); }}});
  check_stats(st);
}

TEST_CASE("launcher fuzz: DeepSeek-V4.1 writer pack arguments", "[unit][fuzz]") {
  const Stats st = fuzz_launcher<Dsv41Case>(
      "dsv41_writer_pack", dsv41_generate, dsv41_catalogue(false),
      {{"pack", [](const Dsv41Case& c) { return run_call([&] { dw::pack(c.format, c.latent, c.cache, nullptr); }, true); }}});
  check_stats(st);
}

TEST_CASE("launcher fuzz: DeepSeek-V4.1 writer append arguments", "[unit][fuzz]") {
  const Stats st = fuzz_launcher<Dsv41Case>(
      "dsv41_writer_append", dsv41_generate, dsv41_catalogue(true),
      {{"append", [](const Dsv41Case& c) { return run_call([&] { dw::append(c.format, c.rows, c.slots, c.cache, nullptr); }, true); }}});
  check_stats(st);
}
