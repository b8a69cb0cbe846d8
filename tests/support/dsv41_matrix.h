#pragma once
// The sparse DeepSeek-V4.1 decode conformance matrix (runtime/sparse_dsv41/README.md): the cases the
// GPU suite runs against the oracle (tests/support/dsv41_reference), and the launches of each case.
// Host-only, so that the unit suite checks on every CI run that the matrix still touches every value
// of every axis the contract lists.
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::testing::dsv41_matrix {

// How a cache is shown to the decode: [P, page_bytes], [P, page, rec], [P, 1, page, rec], [P, page, 1, rec].
enum class View { k2d, k3d, kHnd, kNhd };
enum class Lengths { kNone, kMain, kExtra, kBoth };  // which sections get a length array
// A token whose candidates are all gone: its main section, its extra section, both (lengths 0 where
// lengths are given, else every slot negative), or every slot of both sections negative.
enum class EmptyRow { kMain, kExtra, kBoth, kAllMasked };
enum class Variant { kDefault, kSm90 };  // the variant names of the contract

const char* view_name(View v);
const char* lengths_name(Lengths l);
const char* empty_row_name(EmptyRow e);
const char* variant_name(Variant v);

inline constexpr int kHeads[] = {8, 16, 32, 48, 64, 80, 96, 112, 128};
// Tokens whose given lengths leave [0, topk] (the decode clamps them): past topk, and negative.
inline constexpr int kLengthOverToken = 4, kLengthNegativeToken = 5;

struct Dsv41Case {
  int tokens = 4;
  int heads = 64;
  int topk = 128;
  int page = 64;
  View view = View::kHnd;
  int stride_pad = 0;  // page stride = page * 528 + stride_pad (a multiple of 16)
  bool has_extra = false;
  int extra_topk = 0;
  int extra_page = 0;
  View extra_view = View::kHnd;
  int extra_stride_pad = 0;
  bool sink = false;
  Lengths lengths = Lengths::kNone;  // random in [0, topk]; tokens kLengthOverToken, kLengthNegativeToken clamp
  std::vector<int> main_lengths;     // when given: token t's main length is main_lengths[t % size]
  std::vector<int> extra_lengths;    // the same for the extra section
  std::vector<EmptyRow> empty_rows;  // token i < size has its candidates removed as empty_rows[i] says
  int masked_percent = 8;            // share of negative slots among the active ones
  double lse_scale = 1.0;
  std::optional<int> num_splits;     // forced on every launch of the case; none: planned
  bool sweep = false;                // also every forced num_splits the normalisation keeps
  bool rank3_indices = false;        // [T, 1, topk] instead of [T, topk]
  int idx_pad = 0;                   // indices row stride = topk + idx_pad
  float q_scale = 1.0f;              // q = q_scale * N(0, 1) in bf16

  int xtopk() const { return has_extra ? extra_topk : 0; }
  int chunks() const;  // ceil(topk / 64) + ceil(extra_topk / 64)
  bool main_lengths_given() const;
  bool extra_lengths_given() const;
  // Whether some token's given length is past topk / negative (so the decode must clamp it).
  bool clamps_main() const;
  bool clamps_extra() const;
  std::string label() const;
};

// One launch of a case: forced num_splits and variant (none: the decode's own), enable_pdl.
struct Launch {
  std::optional<int> num_splits;
  std::optional<Variant> variant;
  std::optional<bool> enable_pdl;
  std::optional<bool> cluster;  // "sm90": true deals a split to as many CTAs as it can
  std::optional<bool> bulk_gather;  // "default" on sm_90a: true runs its staged body, false its compact one
  std::string name() const;
};

// The matrix: every head count, page size, view and padding in both caches, lengths, empty rows,
// sinks, LSE scales and forced splits, without the cross product.
std::vector<Dsv41Case> conformance_matrix();

// Every variant the device has, forced (sm90: an sm_90a device): "default" with its staged body,
// "sm90", "default" with its compact body; elsewhere "default" alone.
std::vector<Launch> forced_variants(std::optional<int> num_splits, bool sm90);

// The launches of one case on a device (sm90: an sm_90a device, which has both variants): the
// decode's own choice first (the GPU suite runs it twice: a bitwise repeat), every variant the
// device has forced, "sm90" also with its split dealt to a cluster, "default" on sm_90a with its
// staged and with its compact body, and for sweeps every forced num_splits whose normalisation keeps it (>= ceil(chunks / 16)) with each
// of these. After the first, launches set enable_pdl on, off and unset in turn.
std::vector<Launch> launches(const Dsv41Case& c, bool sm90);

// num_splits as the decode normalises an explicit count: cpb = ceil(chunks / n), ceil(chunks / cpb).
int normalised_splits(int chunks, int num_splits);

// Pages of every pool of the suite: max(8, ceil(4096 / page)), so each holds >= 4096 slots.
long long pool_pages(int page);

// View `v` of a cache of `pages` pages of `page` records of `record` bytes, page_stride bytes apart.
kiln::TensorView cache_view(void* base, int record, int page, long long page_stride, long long pages, View v);

// Where one launch's tensors live (device memory in the GPU suite, stand-in addresses in the unit
// suite, which checks every launch of the matrix against the launcher's host validation).
struct CallBuffers {
  kiln::TensorView main_cache, extra_cache;  // cache_view()s
  void* q = nullptr;
  void* indices = nullptr;
  void* extra_indices = nullptr;
  void* lengths = nullptr;
  void* extra_lengths = nullptr;
  void* sink = nullptr;
  void* out = nullptr;
  void* lse = nullptr;
  void* mid_out = nullptr;
  void* mid_lse = nullptr;
  int splits = 0;  // S of mid_out and mid_lse; 0: no split scratch passed
};

// The decode call of one launch of a case: q [T, H, 512], indices ([T, topk] or [T, 1, topk] with
// the case's row padding), output, out_lse and the options (lengths, sink, extra cache, scratch,
// lse_scale, the launch's num_splits, variant and enable_pdl).
struct Call {
  kiln::TensorView q, kv_cache, indices, output, out_lse;
  kiln::dsv41::Dsv41Options opt;
};
Call make_call(const Dsv41Case& c, const Launch& l, const CallBuffers& b, double lse_scale);

// The oracle's cost of one case: T * H * (topk + extra_topk) * 1024 multiply-adds, in G.
double oracle_gmacs(const Dsv41Case& c);

}  // namespace kiln::testing::dsv41_matrix
