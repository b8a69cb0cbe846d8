#pragma once
// The inputs of one case of the DeepSeek-V4.1 conformance matrix (tests/support/dsv41_matrix), made on
// the host: the caches' bytes, queries, indices, lengths and sinks, and the oracle's answer. The GPU
// suite uploads them; the unit suite checks on every CI run that they are what the GPU suite claims
// (NaN wherever the decode must not read, finite records of the stated range wherever it must).
//
// Cache contents. Each pool has pool_pages(page) pages. A row holds data only if some valid
// candidate of the case (any round) names it; every other byte, page padding included, is 0xff, NaN
// in both formats. Slot 0 is never a valid candidate, and slots that are masked or past a length
// name slot 0 or kFarIndex, far outside every pool. Data rows hold random codes over every finite
// value (E4M3 subnormals and -0 included, any E2M1 pair) with scales over the range the writers emit
// for latents in [-1, 1] (FP8: 2^-22 .. 2^-8, both deployed floors; FP4: E4M3 2^-9 .. 0.171875,
// subnormal scales included), plus the writers' all-zero groups.
#include <cstdint>
#include <vector>

#include "tests/support/dsv41_matrix.h"
#include "tests/support/dsv41_reference.h"

namespace kiln::testing::dsv41_matrix {

inline constexpr std::uint8_t kNanByte = 0xff;  // NaN in bf16, fp32, E4M3 (codes and FP4 scales) and UE8M0
inline constexpr std::int32_t kFarIndex = 0x7fffff00;
// The largest magnitude a data row holds: 448 * 2^-8 (main), 6 * 0.171875 (extra).
inline constexpr float kMainMaxAbs = 1.75f, kExtraMaxAbs = 1.03125f;

// One paged cache's bytes in the FOOTER layout.
struct PoolImage {
  Dsv41Format format = Dsv41Format::kMain;
  int page_size = 0;
  long long page_stride = 0;
  long long pages = 0;
  std::vector<std::uint8_t> bytes;

  int record() const { return dsv41_geometry(format).record_bytes; }
  long long slots() const { return pages * page_size; }
  Dsv41Cache cache() const { return {format, bytes.data(), page_stride, page_size}; }
  // The view `v` of a device copy of these bytes at `device_base`.
  kiln::TensorView view(void* device_base, View v) const {
    return cache_view(device_base, record(), page_size, page_stride, pages, v);
  }
};

// `live` slots hold random records; every other byte is 0xff (page padding: `pad_byte`).
PoolImage make_pool_image(Dsv41Format format, int page_size, int stride_pad, const std::vector<bool>& live, std::uint64_t seed,
                          std::uint8_t pad_byte = kNanByte);
// The same records at page stride page_size * record + stride_pad (padding filled with `pad_byte`).
PoolImage restride(const PoolImage& from, int stride_pad, std::uint8_t pad_byte);

// What a launch reads besides the caches and the sinks; one set per round.
struct Inputs {
  std::vector<std::uint16_t> q;                  // [T, H, 512] bf16: q_scale * N(0, 1)
  std::vector<std::int32_t> idx, xidx, len, xlen;  // len / xlen empty where the case gives none
};

// One case: its rounds of inputs (the graph test rewrites them in place between replays), pools and
// sinks. Given lengths: the case's fixed ones, else random in [0, topk] with token kLengthOverToken
// at topk + 7 and kLengthNegativeToken at -3; tokens with an empty row get length 0 in an emptied
// section (or only negative slots where the section has no lengths), and only negative slots in
// both for kAllMasked. Active slots: c.masked_percent negative (-1, INT_MIN, -12345), ~5% repeats of
// the previous slot, the rest uniform over slots 1..; past the active prefix and in row padding,
// slot 0 or kFarIndex.
struct HostCase {
  Dsv41Case c;
  double sm_scale = 0.044194173824159216;  // 512^-0.5
  std::vector<float> sink;                 // [H], uniform in [-2, 4]
  std::vector<Inputs> rounds;
  PoolImage main, extra;

  HostCase(const Dsv41Case& c, std::uint64_t seed, int round_count = 1);
  // A section of one round as the oracle reads it.
  Dsv41Section section(const Inputs& in, bool is_extra) const;
};

struct Reference {
  std::vector<float> out, lse;  // [T, H, 512], [T, H]
  std::vector<bool> empty;      // per token: no valid candidate in either section
};

// The oracle over one round, in parallel over (token, 16-head block) units.
Reference run_oracle(const HostCase& h, const Inputs& in, double lse_scale);

}  // namespace kiln::testing::dsv41_matrix
