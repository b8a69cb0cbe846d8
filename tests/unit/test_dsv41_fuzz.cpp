// Random argument sets for the DeepSeek-V4.1 decode's plan-only entry (host only, no driver), checked
// against the contract (runtime/sparse_dsv41/README.md) rather than the launcher's code: a seeded
// generator builds a VALID call (random head count, candidate counts, cache views of both record
// sizes with any page size and padding, lengths, sink, overrides, device), whose plan must equal the
// contract's planner written out below; then, for half the cases, one rule of the Arguments table is
// broken and the call must fail with that rule's error code and upstream phrase. A failure prints the
// seed and case index.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/jit/error.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "tests/support/fuzz_views.h"

namespace {

using kiln::DType;
using kiln::Error;
using kiln::ErrorCode;
using kiln::TensorView;
namespace d = kiln::dsv41;
using namespace kiln::testing::fuzz;  // Rng, rnd, coin, region, make, cache_view
std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

constexpr int kHeads[] = {8, 16, 32, 48, 64, 80, 96, 112, 128};

// The contract's split planner, from "Chunks, splits, head tiles" (integer floor divisions).
std::pair<int, int> contract_plan(std::int64_t T, int H, int topk, int extra, int sms, int max_splits, bool unified, bool ragged) {
  const std::int64_t chunks = cdiv(topk, 64) + cdiv(extra, 64);
  const std::int64_t min_s = cdiv(chunks, 16);
  const int ht = (H >= 32) ? 2 : 1;
  const std::int64_t base = T * cdiv(H, 16 * ht);
  std::int64_t S = min_s;
  if (chunks == 2 && max_splits > 1 && !unified && base * 10 <= sms) S = 2;
  if (chunks > 2 && max_splits > 1) {
    if (unified) {
      std::int64_t want = min_s;
      while (2 * want <= max_splits && cdiv(chunks, 2 * want) >= 2) {
        const std::int64_t cap = want == 1 ? sms * 2 / 3 : sms / 2;
        if (base * 2 * want > cap) break;
        want *= 2;
      }
      if (want == 1 && chunks >= 8 && sms < base && 2 * base <= sms * 8 / 3) want = 2;
      S = want;
    } else {
      const std::int64_t cap = std::int64_t(sms) * 23 / 20;
      std::int64_t s1 = 0;
      for (std::int64_t cpb = 1; cpb <= 16 && s1 == 0; ++cpb) {
        const std::int64_t s = cdiv(chunks, cpb);
        if (min_s <= s && s <= max_splits && base * s <= cap) s1 = s;
      }
      if (s1) {
        S = s1;
      } else if (base >= sms && chunks >= 8) {
        for (std::int64_t s = 1; s <= 3; ++s) {
          if (std::max(S, s) > max_splits) break;
          if (10 * base * s >= 9 * std::int64_t(sms) * cdiv(base * s, sms)) {
            S = std::max(S, s);
            break;
          }
        }
      }
      if (sms / 4 <= base && base <= sms / 2 && (chunks == 6 || chunks >= 16) && min_s <= 2 && 2 <= max_splits) S = 2;
      else if (sms / 2 < base && base <= sms * 2 / 3 && chunks == 10 && max_splits >= 4) S = 4;
      if (ragged && chunks == 10 && sms / 4 <= base && base <= sms / 2 && max_splits >= 4 && 20 * base <= 7 * sms) S = 4;
    }
  }
  const std::int64_t cpb = cdiv(chunks, S);
  return {static_cast<int>(cdiv(chunks, cpb)), static_cast<int>(cpb)};
}

// A FOOTER cache view of `record`-byte rows: 2-D, 3-D, HND or NHD, page stride padded by a multiple of 16.
TensorView footer_cache(Rng& r, std::uintptr_t a, int record) {
  const std::int64_t pages = rnd(r, 1, 64), page = coin(r) ? rnd(r, 1, 130) : (std::int64_t(1) << rnd(r, 0, 7));
  return cache_view(r, a, pages, page, record, 16);
}

struct Case {
  std::int64_t T = 1;
  int H = 64, topk = 1, extra = 0;
  d::Dsv41Device device;
  TensorView q, kv, idx, out, lse, len, sink, xkv, xidx, xlen, mid_out, mid_lse;
  bool has_len = false, has_sink = false, has_extra = false, has_xlen = false, has_mid = false;
  d::Dsv41Options opt;
  std::string variant;  // backs opt.variant

  d::Dsv41Options options() const {
    d::Dsv41Options o = opt;
    if (!variant.empty()) o.variant = variant;
    if (has_len) o.topk_length = len;
    if (has_sink) o.attn_sink = sink;
    if (has_extra) {
      o.extra_kv_cache = xkv;
      o.extra_indices = xidx;
    }
    if (has_xlen) o.extra_topk_length = xlen;
    if (has_mid) {
      o.mid_out = mid_out;
      o.mid_lse = mid_lse;
    }
    return o;
  }
  d::Dsv41Plan plan() const { return d::plan_dsv41_decode(q, kv, idx, out, lse, 0.0441941738, options(), device); }
  // The contract's plan for this call.
  std::pair<int, int> expected_splits() const {
    if (opt.num_splits) {
      const std::int64_t chunks = cdiv(topk, 64) + cdiv(extra, 64), cpb = cdiv(chunks, *opt.num_splits);
      return {static_cast<int>(cdiv(chunks, cpb)), static_cast<int>(cpb)};
    }
    return contract_plan(T, H, topk, extra, T == 0 ? 132 : device.sms, opt.max_splits, T == 0 ? false : device.unified_memory,
                         has_len || has_xlen);
  }
};

Case generate(Rng& r) {
  Case c;
  c.T = coin(r, 0.1) ? 0 : rnd(r, 1, 300);
  c.H = kHeads[rnd(r, 0, 8)];
  c.topk = static_cast<int>(coin(r) ? rnd(r, 1, 256) : rnd(r, 1, 1100));
  c.has_extra = coin(r, 0.6);
  c.extra = c.has_extra ? static_cast<int>(coin(r) ? rnd(r, 1, 600) : rnd(r, 1, 1100)) : 0;
  const bool sm90 = coin(r);
  c.device = d::Dsv41Device{sm90 ? "sm_90a" : "sm_120a", static_cast<int>(rnd(r, 4, 200)), !sm90 && coin(r, 0.3)};
  int i = 0;
  c.q = make(region(r, i++), DType::kBf16, {c.T, c.H, 512});
  c.kv = footer_cache(r, region(r, i++), 528);
  c.idx = coin(r) ? make(region(r, i++), DType::kI32, {c.T, c.topk}) : make(region(r, i++), DType::kI32, {c.T, 1, c.topk});
  if (coin(r, 0.3)) c.idx.strides[0] = c.topk + 4 * rnd(r, 1, 8);  // rows of a wider buffer
  c.out = make(region(r, i++), DType::kBf16, {c.T, c.H, 512});
  c.lse = make(region(r, i++), DType::kF32, {c.T, c.H});
  c.has_len = coin(r, 0.4);
  c.len = make(region(r, i++), DType::kI32, {c.T + rnd(r, 0, 3)});
  c.has_sink = coin(r, 0.4);
  c.sink = make(region(r, i++), DType::kF32, {c.H + rnd(r, 0, 3)});
  c.xkv = footer_cache(r, region(r, i++), 288);
  c.xidx = make(region(r, i++), DType::kI32, {c.T, c.extra > 0 ? c.extra : 1});
  c.has_xlen = c.has_extra && coin(r, 0.4);
  c.xlen = make(region(r, i++), DType::kI32, {c.T + rnd(r, 0, 3)});
  const std::int64_t chunks = cdiv(c.topk, 64) + cdiv(c.extra, 64), min_s = cdiv(chunks, 16);
  if (coin(r, 0.3)) c.opt.num_splits = static_cast<int>(rnd(r, min_s, chunks + 2));
  else if (coin(r, 0.3)) c.opt.max_splits = static_cast<int>(rnd(r, min_s, 16));
  c.opt.compute_precision = coin(r) ? "bf16" : "default";
  if (coin(r, 0.3)) c.variant = sm90 && coin(r) ? "sm90" : "default";
  if (coin(r, 0.2)) c.opt.enable_pdl = coin(r);
  // Scratch for every plan (S = chunks), or none where the contract's plan does not split.
  c.mid_out = make(region(r, i++), DType::kBf16, {c.T, c.H, chunks, 512});
  c.mid_lse = make(region(r, i++), DType::kF32, {c.T, c.H, chunks});
  c.has_mid = true;
  if (coin(r, 0.3) && c.expected_splits().first == 1) c.has_mid = false;
  if (coin(r, 0.3)) {
    const bool pinned_sm90 = c.variant == "sm90" || (c.variant.empty() && sm90 && c.H >= 32);
    c.opt.head_tiles = pinned_sm90 ? (c.H >= 32 ? 2 : 1) : 1;
  }
  return c;
}

struct Break {
  const char* name;
  ErrorCode code;
  const char* phrase;
  std::function<bool(Case&, Rng&)> apply;  // false: not applicable to this case
};

std::vector<Break> breaks() {
  const auto invalid = ErrorCode::kInvalidArgument;
  return {
      {"unserved H", invalid, "query heads",
       [](Case& c, Rng& r) {
         const int h = static_cast<int>(8 * (2 * rnd(r, 1, 7) + 1));  // 24, 40, ..., 120
         c.q = make(reinterpret_cast<std::uintptr_t>(c.q.data), DType::kBf16, {c.T, h, 512});
         return true;
       }},
      {"q dims", invalid, "q must be [T, H, 512]",
       [](Case& c, Rng&) { c.q = make(reinterpret_cast<std::uintptr_t>(c.q.data), DType::kBf16, {c.T, c.H, 576}); return true; }},
      {"q dtype", invalid, "contiguous CUDA bfloat16", [](Case& c, Rng&) { c.q.dtype = DType::kF16; return true; }},
      {"output heads", invalid, "output must be",
       [](Case& c, Rng&) { c.out = make(reinterpret_cast<std::uintptr_t>(c.out.data), DType::kBf16, {c.T, c.H + 8, 512}); return true; }},
      {"out_lse dtype", invalid, "out_lse must be", [](Case& c, Rng&) { c.lse.dtype = DType::kBf16; return true; }},
      {"indices dtype", invalid, "int32", [](Case& c, Rng&) { c.idx.dtype = DType::kI64; return true; }},
      {"indices rows", invalid, "rows", [](Case& c, Rng&) { c.idx.shape[0] += 1; return true; }},
      {"main record", invalid, "528",
       [](Case& c, Rng&) {
         c.kv = make(reinterpret_cast<std::uintptr_t>(c.kv.data), DType::kU8, {4, 64, 384});
         return true;
       }},
      {"extra record", invalid, "288",
       [](Case& c, Rng&) {
         if (!c.has_extra) return false;
         c.xkv = make(reinterpret_cast<std::uintptr_t>(c.xkv.data), DType::kU8, {4, 64, 528});
         return true;
       }},
      {"page stride below the page", invalid, "smaller than",
       [](Case& c, Rng&) {
         c.kv.strides[0] = (c.kv.rank == 2 ? c.kv.shape[1] : c.kv.shape[c.kv.rank == 4 && c.kv.shape[1] == 1 ? 2 : 1] * 528) - 16;
         return c.kv.strides[0] > 0;
       }},
      {"page stride not a multiple of 16", invalid, "multiple of 16", [](Case& c, Rng&) { c.kv.strides[0] += 8; return true; }},
      {"misaligned cache", invalid, "16-byte aligned",
       [](Case& c, Rng&) { c.kv.data = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(c.kv.data) + 8); return true; }},
      {"extra cache alone", invalid, "provided together",
       [](Case& c, Rng&) {
         if (c.has_extra || c.has_xlen) return false;
         c.opt.extra_kv_cache = c.xkv;
         return true;
       }},
      {"short topk_length", invalid, "1-D int32 tensor with at least",
       [](Case& c, Rng&) {
         if (c.T == 0) return false;
         c.has_len = true;
         c.len.shape[0] = c.T - 1;
         return true;
       }},
      {"sink dtype", invalid, "1-D float32 tensor with at least", [](Case& c, Rng&) { c.has_sink = true; c.sink.dtype = DType::kBf16; return true; }},
      {"compute_precision word", invalid, "compute_precision", [](Case& c, Rng&) { c.opt.compute_precision = "fp32"; return true; }},
      {"compute_precision fp8", ErrorCode::kUnsupported, "(\"bf16\",)", [](Case& c, Rng&) { c.opt.compute_precision = "fp8"; return true; }},
      {"unknown variant", invalid, "unknown exact variant", [](Case& c, Rng&) { c.variant = "ip+pw"; return true; }},
      {"sm90 off sm_90a", invalid, "not exported",
       [](Case& c, Rng&) {
         if (c.device.arch != "sm_120a" || c.T == 0) return false;
         c.variant = "sm90";
         c.opt.head_tiles.reset();
         return true;
       }},
      {"head_tiles of another variant", invalid, "head_tiles",
       [](Case& c, Rng&) {
         if (c.T == 0) return false;
         // Unpinned on sm_90a with two head tiles, head_tiles names the variant itself (2: "sm90",
         // 1: "default"): no value belongs to another variant there.
         if (c.variant.empty() && c.device.arch == "sm_90a" && c.H >= 32) return false;
         c.opt.head_tiles = c.variant == "sm90" && c.H >= 32 ? 1 : 2;
         return true;
       }},
      {"num_splits 0", invalid, "num_splits must be positive", [](Case& c, Rng&) { c.opt.num_splits = 0; return true; }},
      {"too few splits", invalid, "at most",
       [](Case& c, Rng&) {
         if (cdiv(c.topk, 64) + cdiv(c.extra, 64) <= 16) return false;
         c.opt.num_splits = 1;
         return true;
       }},
      {"no scratch for a split plan", invalid, "mid_out",
       [](Case& c, Rng&) {
         if (c.T == 0 || c.expected_splits().first == 1) return false;
         c.has_mid = false;
         return true;
       }},
      {"mid_lse of another S", invalid, "mid_lse must be",
       [](Case& c, Rng&) {
         c.has_mid = true;
         c.mid_lse.shape[2] += 1;
         return true;
       }},
  };
}

}  // namespace

TEST_CASE("dsv41 fuzz: random valid calls plan as the contract says, each broken rule is refused with its phrase", "[unit][fuzz]") {
  const std::vector<Break> rules = breaks();
  std::vector<int> hit(rules.size(), 0);
  long valid = 0;
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    Rng r(seed);
    for (long index = 0; index < 4000; ++index) {
      Case c = generate(r);
      INFO("seed " << seed << " case " << index << " T " << c.T << " H " << c.H << " topk " << c.topk << "+" << c.extra << " "
                   << c.device.arch << " sms " << c.device.sms << (c.device.unified_memory ? " unified" : ""));
      if (coin(r)) {
        d::Dsv41Plan p;
        try {
          p = c.plan();
        } catch (const Error& e) {
          FAIL("valid call refused: " << e.what());
        }
        const auto [splits, cpb] = c.expected_splits();
        CHECK(p.num_splits == splits);
        CHECK(p.chunks_per_block == cpb);
        CHECK(p.precision == 0);
        // A pinned variant runs; so does the one head_tiles names (2: "sm90"; on sm_90a 1 names
        // "default"), also when T == 0 asks no device. Unpinned on sm_90a with 32+ heads the planner
        // takes either per call (by the grid it would fill); "sm90" nowhere else.
        const bool sm90_exported = c.device.arch == "sm_90a" && c.H >= 32;
        if (!c.variant.empty()) {
          CHECK(p.variant == (c.variant == "sm90" ? d::Dsv41Variant::kSm90 : d::Dsv41Variant::kDefault));
        } else if (c.T == 0 || (sm90_exported && c.opt.head_tiles)) {
          CHECK(p.variant == (c.opt.head_tiles == 2 ? d::Dsv41Variant::kSm90 : d::Dsv41Variant::kDefault));
        } else if (!sm90_exported) {
          CHECK(p.variant == d::Dsv41Variant::kDefault);
        }
        CHECK(p.head_tiles == (p.variant == d::Dsv41Variant::kSm90 && c.H >= 32 ? 2 : 1));
        ++valid;
        continue;
      }
      const std::size_t k = static_cast<std::size_t>(rnd(r, 0, static_cast<std::int64_t>(rules.size()) - 1));
      if (!rules[k].apply(c, r)) continue;
      ++hit[k];
      INFO("broken rule: " << rules[k].name);
      try {
        c.plan();
        FAIL("accepted");
      } catch (const Error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(e.code() == rules[k].code);
        CHECK(what.find(rules[k].phrase) != std::string::npos);
      }
    }
  }
  CHECK(valid > 5000);
  for (std::size_t k = 0; k < rules.size(); ++k) {
    INFO(rules[k].name);
    CHECK(hit[k] >= 20);  // every rule was exercised
  }
}
