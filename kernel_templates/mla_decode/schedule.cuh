#pragma once
// Paged MLA decode: the device-side split of a batch's KV work over the grid's parts (params.cuh,
// "Scheduling"). Every CTA derives its own pieces from seq_lens (and qo_indptr) at run time, so a
// captured graph stays right when the lengths change between replays, and mixed lengths spread
// evenly: part p takes the blocks whose units fall in [p W, (p + 1) W), W = max(ceil(total / parts),
// ceil(longest request's blocks / kMlaMaxPieces)), rounded up to whole largest requests when that
// adds at most kMlaAlignSlack units.
#include "common/numeric.cuh"
#include "mla_decode/params.cuh"

namespace kiln {

#ifdef __CUDACC__

namespace mla_detail {

struct MlaRequest {
  int tok0;     // first query token
  int q_len;    // query rows per head
  int seq_len;  // live KV length
  int blocks;   // KV blocks of kBlockTokens (0 when the request has no query rows)
};

__device__ __forceinline__ int load_i32(const void* base, long long index) {
  return __ldg(static_cast<const int*>(base) + index);
}

template <int kBlockTokens, bool kPacked>
__device__ __forceinline__ MlaRequest mla_request(const MlaDecodeParams& p, int b) {
  MlaRequest r;
  if constexpr (kPacked) {
    r.tok0 = load_i32(p.qo_indptr, b);
    r.q_len = load_i32(p.qo_indptr, b + 1) - r.tok0;
  } else {
    r.tok0 = b * p.max_seq_len_q;
    r.q_len = p.max_seq_len_q;
  }
  r.seq_len = load_i32(p.seq_lens, b);
  // A request with rows always gets a block, even at a (contract-breaking) length <= 0: its rows
  // then see no key and are written as zeros instead of being left unwritten.
  const int blocks = r.seq_len > 0 ? (r.seq_len + kBlockTokens - 1) / kBlockTokens : 1;
  r.blocks = r.q_len > 0 ? blocks : 0;
  return r;
}

__device__ __forceinline__ long long mla_cost(const MlaRequest& r, int piece_cost) {
  return r.blocks > 0 ? static_cast<long long>(piece_cost) + r.blocks : 0;
}

// Max of v over the warp's lanes; every lane gets it.
__device__ __forceinline__ long long warp_max(long long v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const long long o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// Sum and max over the CTA of one value per thread; every thread gets both. `scratch`: >= kThreads /
// 16 slots; the caller must not touch it until the function returns.
template <int kThreads>
__device__ __forceinline__ void block_sum_max(long long v, long long m, long long* scratch, long long& sum,
                                              long long& max) {
  constexpr int kWarps = kThreads / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, off);
    const long long o = __shfl_xor_sync(0xffffffffu, m, off);
    m = o > m ? o : m;
  }
  __syncthreads();  // a previous use of scratch is over
  if ((threadIdx.x & 31) == 0) {
    scratch[threadIdx.x >> 5] = v;
    scratch[kWarps + (threadIdx.x >> 5)] = m;
  }
  __syncthreads();
  sum = 0;
  max = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    sum += scratch[w];
    max = scratch[kWarps + w] > max ? scratch[kWarps + w] : max;
  }
}

// Inclusive prefix sum of v over the warp's lanes.
__device__ __forceinline__ long long warp_inclusive_sum(long long v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const long long up = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += up;
  }
  return v;
}

// Exclusive prefix sum over the CTA's threads (thread order); `total` gets the sum of all.
template <int kThreads>
__device__ __forceinline__ long long block_exclusive_scan(long long v, long long* scratch, long long& total) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const long long inc = warp_inclusive_sum(v, lane);
  __syncthreads();
  if (lane == 31) scratch[threadIdx.x >> 5] = inc;
  __syncthreads();
  long long before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const long long s = scratch[w];
    if (w < static_cast<int>(threadIdx.x >> 5)) before += s;
    total += s;
  }
  return before + inc - v;
}

// Exclusive prefix sum of v and the max of m over the CTA's threads (thread order) in one exchange;
// `total` gets the sum of all v, `max` the max of all m.
template <int kThreads>
__device__ __forceinline__ long long block_exclusive_scan_max(long long v, long long m, long long* scratch, long long& total,
                                                              long long& max) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const long long inc = warp_inclusive_sum(v, lane);
  m = warp_max(m);
  __syncthreads();  // a previous use of scratch is over
  if (lane == 31) scratch[threadIdx.x >> 5] = inc;
  if (lane == 0) scratch[kWarps + (threadIdx.x >> 5)] = m;
  __syncthreads();
  long long before = 0;
  total = 0;
  max = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const long long s = scratch[w];
    if (w < static_cast<int>(threadIdx.x >> 5)) before += s;
    total += s;
    max = scratch[kWarps + w] > max ? scratch[kWarps + w] : max;
  }
  return before + inc - v;
}

// A part's place in the unit sequence: its range [lo, hi), the width W, and the first request whose
// blocks reach into the range with that request's first unit.
struct MlaPartCursor {
  int b;
  long long start;
  long long lo, hi, width;
};

// The part's width and range [lo, hi) from the batch's total units and its largest request's blocks:
// an even share of the units, but never so narrow that a request splits into more than
// kMlaMaxPieces pieces (each costs the combine a partial row); then a width of whole largest
// requests, if at most kMlaAlignSlack units wider: with equal lengths the parts then take whole
// requests (no partial rows, nothing to combine) for a slightly longer part.
__device__ __forceinline__ void mla_part_range(const MlaDecodeParams& p, int part, long long total, long long max_blocks,
                                               MlaPartCursor& c) {
  const long long even = (total + p.num_parts - 1) / p.num_parts;
  const long long narrowest = (max_blocks + kMlaMaxPieces - 1) / kMlaMaxPieces;
  c.width = even > narrowest ? even : narrowest;
  if (c.width < 1) c.width = 1;
  const long long largest = max_blocks + p.piece_cost;
  const long long whole = (c.width + largest - 1) / largest * largest;
  if (whole <= c.width + kMlaAlignSlack) c.width = whole;
  c.lo = part * c.width;
  c.hi = c.lo + c.width;
}

template <int kThreads, int kBlockTokens, bool kPacked>
__device__ __forceinline__ MlaPartCursor mla_part_begin(const MlaDecodeParams& p, int part, long long* scratch) {
  static_assert(kThreads % 32 == 0 && 2 * (kThreads / 32) + 2 <= kMlaSchedScratchBytes / 8, "scheduler scratch too small");
  MlaPartCursor c;
  if (p.num_parts == 1) {
    // One part: every request whole, in order.
    c.b = 0;
    c.start = 0;
    c.lo = 0;
    c.hi = 0x7fffffffffffffffLL;
    c.width = c.hi;
    return c;
  }
  const int tid = threadIdx.x;
  if (p.batch <= 32) {
    // A request per lane, every warp on its own: the scan, the total, the largest request and the
    // part's first request without a CTA barrier or shared memory, on the path to the first load
    // (NOTES.md, "The scheduler in one warp"). The warp-wide values come from redux.sync, whose
    // results the compiler keeps uniform (a shuffle's would make the piece loop's bounds, and with
    // them the wgmma descriptors, per-thread values). 32 requests' units fit 32 bits: lengths are below
    // 2^31 and blocks at least 32 tokens, so a request costs at most 2^26 + 2 units.
    const int lane = tid & 31;
    const bool live = lane < p.batch;
    const MlaRequest r = mla_request<kBlockTokens, kPacked>(p, live ? lane : 0);
    const unsigned cost = live ? static_cast<unsigned>(mla_cost(r, p.piece_cost)) : 0u;
    const unsigned blocks = live ? static_cast<unsigned>(r.blocks) : 0u;
    const long long total = warp_redux_add(cost);
    const long long max_blocks = warp_redux_max(blocks);
    mla_part_range(p, part, total, max_blocks, c);
    const long long start = warp_inclusive_sum(cost, lane) - cost;
    // The first request that ends after lo (ends are non-decreasing in b): at most one lane.
    const unsigned owner = __ballot_sync(0xffffffffu, cost > 0 && start <= c.lo && c.lo < start + cost);
    c.b = owner != 0u ? __ffs(owner) - 1 : p.batch;
    c.start = owner != 0u ? warp_redux_add(lane < c.b ? cost : 0u) : 0;
    return c;
  }
  if (p.batch <= kThreads) {
    // One request per thread: one read of the lengths, one exchange for the scan, the total and the
    // largest request, and the part's first request found by the thread that holds it.
    long long cost = 0, blocks = 0;
    if (tid < p.batch) {
      const MlaRequest r = mla_request<kBlockTokens, kPacked>(p, tid);
      cost = mla_cost(r, p.piece_cost);
      blocks = r.blocks;
    }
    long long total, max_blocks;
    const long long start = block_exclusive_scan_max<kThreads>(cost, blocks, scratch, total, max_blocks);
    mla_part_range(p, part, total, max_blocks, c);
    long long* found = scratch + 2 * (kThreads / 32);  // [0]: first b, [1]: its start (past the exchange's slots)
    // The first request that ends after lo: ends are non-decreasing in b, so it is the one whose
    // units hold lo (at most one thread; none when lo is past every unit).
    const bool owner = cost > 0 && start <= c.lo && c.lo < start + cost;
    if (tid == 0) found[0] = p.batch;
    __syncthreads();
    if (owner) {
      found[0] = tid;
      found[1] = start;
    }
    __syncthreads();
    c.b = static_cast<int>(found[0]);
    c.start = c.b < p.batch ? found[1] : 0;
    __syncthreads();  // scratch is free again
    return c;
  }
  long long mine = 0, my_blocks = 0;
  for (int b = tid; b < p.batch; b += kThreads) {
    const MlaRequest r = mla_request<kBlockTokens, kPacked>(p, b);
    mine += mla_cost(r, p.piece_cost);
    my_blocks = r.blocks > my_blocks ? r.blocks : my_blocks;
  }
  long long total, max_blocks;
  block_sum_max<kThreads>(mine, my_blocks, scratch, total, max_blocks);
  mla_part_range(p, part, total, max_blocks, c);

  // The first request that ends after lo (ends are non-decreasing in b).
  long long* found = scratch + 2 * (kThreads / 32);  // [0]: first b, [1]: its start (past the reductions' slots)
  if (tid == 0) found[0] = p.batch;
  long long carry = 0;
  for (int base = 0; base < p.batch; base += kThreads) {
    const int b = base + tid;
    const long long cost = b < p.batch ? mla_cost(mla_request<kBlockTokens, kPacked>(p, b), p.piece_cost) : 0;
    long long chunk_total;
    const long long start = carry + block_exclusive_scan<kThreads>(cost, scratch, chunk_total);
    if (b < p.batch && cost > 0 && start + cost > c.lo) atomicMin(reinterpret_cast<unsigned long long*>(found),
                                                                 static_cast<unsigned long long>(b));
    __syncthreads();
    const int first = static_cast<int>(found[0]);
    if (b == first) found[1] = start;
    __syncthreads();
    carry += chunk_total;
    if (first < p.batch) break;  // uniform across the CTA
  }
  c.b = static_cast<int>(found[0]);
  c.start = c.b < p.batch ? found[1] : 0;
  __syncthreads();  // scratch is free again
  return c;
}

// One piece: request b, its KV blocks [k0, k1) (tokens [k0 * kBlockTokens, min(k1 * kBlockTokens, L))).
struct MlaPiece {
  int b;
  MlaRequest r;
  int t0, t1;       // token range
  bool whole;       // the request's only piece: write `out` directly
  int first_part;   // valid when k0 == 0 (the part that holds the request's first block)
  int num_pieces;
  bool first;       // this piece holds block 0
};

// What a kernel reads of its piece for rows [row0, row0 + kRows): the request's fields and the
// kTileTokens-token tiles those rows see; t1 is cut at the last token the last row sees (with a
// causal mask no row of the tile sees past it).
struct MlaPieceRows {
  int b, tok0, q_len, rows_b, seq_len;
  int t0, t1;  // tokens [t0, t1)
  int n_tiles;
};

// The mask is a run-time flag (MlaDecodeParams::causal): it moves each row's last visible token
// (mla_row_last), set once per piece, and never adds work per tile.
template <int kRows, int kTileTokens>
__device__ __forceinline__ MlaPieceRows mla_piece_rows(const MlaDecodeParams& p, const MlaPiece& piece, int row0) {
  MlaPieceRows v;
  v.b = piece.b;
  v.tok0 = piece.r.tok0;
  v.q_len = piece.r.q_len;
  v.rows_b = v.q_len * p.heads;
  v.seq_len = piece.r.seq_len;
  v.t0 = piece.t0;
  v.t1 = piece.t1;
  if (p.causal) {
    const int last_row = (row0 + kRows < v.rows_b ? row0 + kRows : v.rows_b) - 1;
    const int vis_end = v.seq_len - v.q_len + mla_query_of_row(last_row, p.heads_recip) + 1;
    if (vis_end < v.t1) v.t1 = vis_end > v.t0 ? vis_end : v.t0;
  }
  v.n_tiles = (v.t1 - v.t0 + kTileTokens - 1) / kTileTokens;
  return v;
}

// The last token of the piece that row `row` of the request sees: the piece's end, and with the
// causal mask the row's own limit. A token t is visible iff t <= this.
__device__ __forceinline__ int mla_row_last(const MlaDecodeParams& p, const MlaPieceRows& v, int row) {
  const int last = v.t1 - 1;
  if (!p.causal) return last;
  const int lim = v.seq_len - v.q_len + mla_query_of_row(row, p.heads_recip);
  return lim < last ? lim : last;
}

// Calls fn(piece) for each piece of `part`, in request order. Every thread of the CTA runs the same
// sequence (the lengths are re-read per request, from L1 after the first thread).
template <int kThreads, int kBlockTokens, bool kPacked, typename Fn>
__device__ __forceinline__ void mla_for_each_piece(const MlaDecodeParams& p, int part, long long* scratch, Fn&& fn) {
  const MlaPartCursor c = mla_part_begin<kThreads, kBlockTokens, kPacked>(p, part, scratch);
  long long start = c.start;
  for (int b = c.b; b < p.batch; ++b) {
    const MlaRequest r = mla_request<kBlockTokens, kPacked>(p, b);
    if (r.blocks == 0) continue;  // no query rows, no units
    // A request's units are its blocks, then its charge, so the batch's first blocks fall in part 0: a
    // charge first leaves the first parts without blocks at B = 1, which measured slower (NOTES.md).
    if (start >= c.hi) break;
    const long long k0 = c.lo > start ? c.lo - start : 0;
    const long long k1 = c.hi - start < r.blocks ? c.hi - start : r.blocks;
    if (k1 > k0) {
      MlaPiece piece;
      piece.b = b;
      piece.r = r;
      piece.t0 = static_cast<int>(k0) * kBlockTokens;
      const long long t1 = k1 * kBlockTokens;
      piece.t1 = static_cast<int>(t1 < r.seq_len ? t1 : (r.seq_len > 0 ? r.seq_len : 0));
      if (piece.t1 < piece.t0) piece.t1 = piece.t0;
      piece.first = k0 == 0;
      piece.whole = k0 == 0 && k1 == r.blocks;
      piece.first_part = part;
      piece.num_pieces = static_cast<int>((start + r.blocks - 1) / c.width - part) + 1;
      fn(piece);
    }
    start += mla_cost(r, p.piece_cost);
  }
}

}  // namespace mla_detail

#endif  // __CUDACC__

}  // namespace kiln
