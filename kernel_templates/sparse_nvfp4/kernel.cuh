#pragma once
// Sparse MLA decode over an NVFP4 (384 B/token) paged cache, Hopper software-decode path.
//
// One block = one query token x one head group (16 * kHeadTiles heads) x one split (a range of
// 64-slot chunks). Producer warps (the last 4, or 2 with two head tiles) gather a chunk's raw records
// with cp.async into a staging buffer and decode them once into a shared tile of 64 rows x 512 dims
// (448 f16 NoPE, 64 bf16 RoPE); one team of 4 consumer warps per 16-head tile runs QK and PV on
// tensor cores (mma.sync m16n8k16) with an online softmax. Two teams share each decoded tile.
// Warp w of a team owns candidates 16w..16w+15 in QK and dims 112w.., 448+16w.. in PV; the row max
// and P go through shared memory (two team barriers per chunk).
// The compact configuration (kSmall) fits 99 KiB: one decoded tile, and producers that gather a
// chunk's records into registers (the next chunk's loads in flight while this one is decoded).
// Decoded NoPE values are stored as value * 2^-7 (exact in f16 for every e2m1 x e4m3 product); the
// Q RoPE dims are pre-multiplied by 2^-7 too, so every logit is 2^-7 * s and the 2^7 is folded into
// the softmax scale. NoPE output columns are multiplied back by 2^7 at the end.
#include "common/cluster.cuh"
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/nvfp4.cuh"
#include "common/nvfp4_encode.cuh"
#include "common/pdl.cuh"
#include "common/softmax.cuh"
#include "common/tma.cuh"
#include "sparse_nvfp4/params.cuh"
#include "sparse_nvfp4/sink.cuh"

namespace kiln {

#ifdef __CUDACC__
namespace sparse_detail {

constexpr int kBarProducers = 1;
constexpr int kBarQStaged = 3;    // every consumer, after its share of Q
constexpr int kBarTeam0 = 2, kBarTeam1 = 7;  // softmax exchanges inside one consumer team
constexpr int kNopeDims = 448;
constexpr int kKScaleExp = 7;                       // decoded NoPE = value * 2^-7
constexpr float kKScaleUndo = 128.0f;
constexpr unsigned kDataBytes = 352u;               // per token, before the page's scale block
constexpr unsigned kTileRow = 1024u;

// Programmatic dependent launch (common/pdl.cuh): every kernel of the family is launched as a
// dependent of the kernel before it in the stream and reads no input before pdl_wait(). So a launch's
// blocks are scheduled, and set up their shared memory, during the previous kernel's tail (for the
// merge: the decode grid's) and not after it. Each kernel lets its dependents be scheduled as soon as
// its blocks start: a dependent cannot take an SM one of this grid's blocks still needs, since all of
// them have started by then.

__device__ __forceinline__ int clamp_length(const void* lengths, int t, int topk) {
  if (lengths == nullptr) return topk;
  const int v = static_cast<const int*>(lengths)[t];
  return v < 0 ? 0 : (v > topk ? topk : v);
}

// The active slots of one token: main section chunks first, then the extra section's.
struct TokenWork {
  int main_len, extra_len, main_chunks, total_chunks;
};

template <bool kHasExtra>
__device__ __forceinline__ TokenWork token_work(const SparseNvfp4Params& p, int t) {
  TokenWork w;
  w.main_len = clamp_length(p.topk_length, t, p.topk);
  w.extra_len = kHasExtra ? clamp_length(p.extra_topk_length, t, p.extra_topk) : 0;
  w.main_chunks = (w.main_len + kSparseChunk - 1) / kSparseChunk;
  w.total_chunks = w.main_chunks + (w.extra_len + kSparseChunk - 1) / kSparseChunk;
  return w;
}

// The chunks [begin, begin + count) a CTA runs: its slice `slice` of `slices` equal parts of its
// split's chunks (unsplit, split is 0 and chunks_per_block covers every chunk of the call), clipped
// to the token's.
struct ChunkRange {
  int begin, count;
};
__device__ __forceinline__ ChunkRange chunk_range(const SparseNvfp4Params& p, const TokenWork& w, int split, int slice, int slices) {
  const int per_cta = (p.chunks_per_block + slices - 1) / slices;
  const int split_end = split * p.chunks_per_block + p.chunks_per_block;
  const int c_begin = split * p.chunks_per_block + slice * per_cta;
  int c_end = c_begin + per_cta;
  if (c_end > split_end) c_end = split_end;
  if (c_end > w.total_chunks) c_end = w.total_chunks;
  return {c_begin, c_end > c_begin ? c_end - c_begin : 0};
}

// The (token, split) of this CTA, for a grid.x of ((t * num_splits + split) * groups + group) * ncta +
// rank (`groups`: the head groups launched outside the cluster); split is 0 without p.split.
struct CtaPlace {
  int t, split;
};
__device__ __forceinline__ CtaPlace cta_place(const SparseNvfp4Params& p, int ncta, int groups) {
  const int bx = int(blockIdx.x) / ncta / groups;
  return p.split ? CtaPlace{bx / p.num_splits, bx % p.num_splits} : CtaPlace{bx, 0};
}
// The split again, for an epilogue: %ctaid.x is read anew (volatile), so the compiler rebuilds the
// split here instead of keeping it live across the main loop beside the token. The unsplit path then
// carries the same state through its loop (the token) as a kernel compiled without splits.
__device__ __forceinline__ int cta_split(const SparseNvfp4Params& p, int ncta, int groups) {
  if (!p.split) return 0;
  u32 cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  return int(cta) / ncta / groups % p.num_splits;
}

// The bf16 row a finished (token, head) row is written to: its split's mid_out row, or the output.
__device__ __forceinline__ u16* sparse_out_row(const SparseNvfp4Params& p, long long out_row, int split) {
  return p.split ? static_cast<u16*>(p.mid_out) + (out_row * p.split_stride + split) * 512 : static_cast<u16*>(p.output) + out_row * 512;
}

// A row's share of a cluster combine: the n CTAs (ranks rank0 + r * stride) that split a split's
// chunks have each published the row's (max, sum) as two floats at `xs` (the same shared address in
// every CTA). Rank r's unnormalised partial row gets weight w[r] * factor; lse and empty are the
// combined row's, with the sink folded in for a final output (`split` false).
struct SparseClusterRow {
  float w[kSparseMaxCluster];
  float factor, lse;
  bool empty;
};
__device__ __forceinline__ SparseClusterRow sparse_cluster_row(bool split, u32 xs, int n, u32 rank0, u32 stride, const float* sink_logit) {
  SparseClusterRow c;
  float m[kSparseMaxCluster], l[kSparseMaxCluster];
#pragma unroll
  for (int r = 0; r < kSparseMaxCluster; ++r) {
    m[r] = neg_inf();
    l[r] = 0.0f;
    if (r < n) {
      const u32 a = peer_addr(xs, rank0 + u32(r) * stride);
      m[r] = ld_peer_f32(a);
      l[r] = ld_peer_f32(a + 4);
    }
  }
  float mx = neg_inf();
#pragma unroll
  for (int r = 0; r < kSparseMaxCluster; ++r) mx = l[r] > 0.0f ? fmaxf(mx, m[r]) : mx;
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < kSparseMaxCluster; ++r) {
    c.w[r] = l[r] > 0.0f ? fast_exp2(m[r] - mx) : 0.0f;
    sum += c.w[r] * l[r];
  }
  c.empty = !(sum > 0.0f);
  c.lse = mx + fast_log2(sum);
  c.factor = c.empty ? 0.0f : 1.0f / sum;
  if (!split && sink_logit != nullptr) {
    sparse_fold_sink(*sink_logit, c.empty, c.lse, c.factor);
  } else if (c.empty) {
    c.lse = split ? kSparseEmptySplitLse : neg_inf();
  }
  return c;
}

// Where candidate `cand` of `chunk` (of token t) lives: its record's data row and scale row, plus the
// given byte offsets; both are the pool's base, and `valid` false, for a masked slot. A page holds
// page_size data rows of kData bytes, then page_size scale rows of kScale bytes (main pool; the extra
// pool's rows are kExtraData and kExtraScale bytes).
struct CandidateRecord {
  const u8* base;
  const u8* data;
  const u8* scales;
  bool valid;
};

template <bool kHasExtra, int kData = int(kDataBytes), int kScale = 32, int kExtraData = kData, int kExtraScale = kScale>
__device__ __forceinline__ CandidateRecord locate_candidate(const SparseNvfp4Params& p, const TokenWork& w, int t,
                                                            int chunk, int cand, int data_offset, int scale_offset) {
  long long page_stride;
  int page_size, len, slot, data_bytes, scale_bytes;
  const int* idx_row;
  CandidateRecord r;
  if (!kHasExtra || chunk < w.main_chunks) {
    data_bytes = kData;
    scale_bytes = kScale;
    r.base = static_cast<const u8*>(p.kv);
    page_stride = p.kv_page_stride;
    page_size = p.kv_page_size;
    len = w.main_len;
    slot = chunk * kSparseChunk + cand;
    idx_row = static_cast<const int*>(p.indices) + (long long)t * p.indices_row_stride;
  } else {
    data_bytes = kExtraData;
    scale_bytes = kExtraScale;
    r.base = static_cast<const u8*>(p.extra_kv);
    page_stride = p.extra_page_stride;
    page_size = p.extra_page_size;
    len = w.extra_len;
    slot = (chunk - w.main_chunks) * kSparseChunk + cand;
    idx_row = static_cast<const int*>(p.extra_indices) + (long long)t * p.extra_indices_row_stride;
  }
  int idx = -1;
  if (slot < len) idx = __ldg(idx_row + slot);
  r.valid = idx >= 0;
  r.data = r.base;
  r.scales = r.base;
  if (r.valid) {
    const int page = idx / page_size;
    const int row = idx - page * page_size;
    const u8* page_base = r.base + (long long)page * page_stride;
    r.data = page_base + (long long)row * data_bytes + data_offset;
    r.scales = page_base + (long long)page_size * data_bytes + (long long)row * scale_bytes + scale_offset;
  }
  return r;
}

// Producer thread (cand, half) of the staged configuration, cp.async gather: issues 12 x 16 B of one
// candidate's record into the staging row; half h takes data units 2k+h and scale unit h, so a lane
// pair reads whole 32 B sectors. Returns whether the slot is a real candidate (masked slots are
// zero-filled).
template <bool kHasExtra>
__device__ __forceinline__ bool load_candidate(const SparseNvfp4Params& p, const TokenWork& w, int t,
                                               int chunk, int cand, int half, u8* stage_row) {
  const CandidateRecord r = locate_candidate<kHasExtra>(p, w, t, chunk, cand, half * 16, half * 16);
  const u32 bytes = r.valid ? 16u : 0u;
#pragma unroll
  for (int k = 0; k < 11; ++k) cp_async_16(stage_row + (2 * k + half) * 16, r.valid ? r.data + 32 * k : r.base, bytes);
  cp_async_16(stage_row + kDataBytes + half * 16, r.scales, bytes);
  return r.valid;
}

// The same thread's part of the record by bulk gather, completing on the raw stage's mbarrier
// `bar_raw`: half 0 copies the data bytes as one bulk copy and adds them to `bytes` (the warp
// announces its sum, stage_arrive); half 1 copies the scale bytes behind them as 16-byte cp.asyncs.
// A masked slot's parts are zero-filled by cp.async, so every byte of the row lands through the
// barrier. A bulk copy's operands must be warp-uniform, so ptxas issues per-lane ones one lane per
// trip of an 8-instruction loop (ELECT, R2UR): the small scale part goes the cheaper way. The record
// geometry is locate_candidate's (defaults: NVFP4).
template <bool kHasExtra, int kData = int(kDataBytes), int kScale = 32, int kExtraData = kData, int kExtraScale = kScale>
__device__ __forceinline__ bool load_candidate_bulk(const SparseNvfp4Params& p, const TokenWork& w, int t, int chunk, int cand, int half,
                                                    u8* stage_row, u32 bar_raw, u32& bytes) {
  const CandidateRecord r = locate_candidate<kHasExtra, kData, kScale, kExtraData, kExtraScale>(p, w, t, chunk, cand, 0, 0);
  const bool extra = kHasExtra && chunk >= w.main_chunks;
  const u32 data = extra ? kExtraData : kData, scale = extra ? kExtraScale : kScale;
  const u32 dst = smem_addr(stage_row);
  if (half) {
    for (u32 o = 0; o < scale; o += 16) cp_async_16_addr(dst + data + o, r.valid ? r.scales + o : r.scales, r.valid ? 16u : 0u);
  } else if (r.valid) {
    bulk_load(dst, r.data, data, bar_raw);
    bytes += data;
  } else {
    for (u32 o = 0; o < data; o += 16) cp_async_16_addr(dst + o, r.base, 0u);
  }
  return r.valid;
}

// Ends a producer warp's bulk gathers into one raw stage: each thread's cp.asyncs arrive when they
// land, and lane 0 arrives adding the warp's bulk `bytes` to the phase's expected count (copies that
// land first leave the count negative, which the phase allows while arrivals are pending), so the
// barrier takes one atomic per warp for the bulk copies. Its count: kProducers + kProducers / 32.
__device__ __forceinline__ void stage_arrive(u32 bar, u32 bytes, int lane) {
  cp_async_mbar_arrive(bar);
  const u32 total = warp_redux_add(bytes);
  if (lane == 0) mbar_arrive_expect_tx(bar, total);
}

// A staged record half (cand, half) into its tile row: code units u = 2k + half (k < 7: dims 32u ..
// 32u + 31, scale groups 2u, 2u + 1) and RoPE units 2k + half (k < 4: dims 448 + 8 (2k + half) ..,
// bf16 copied as is); 16-byte piece j of a tile row sits at j ^ (cand & 7).
__device__ __forceinline__ void decode_candidate(const u8* stage_row, u8* tile_row, int cand, int half) {
  const int sw = cand & 7;
#pragma unroll
  for (int k = 0; k < 7; ++k) {
    const int u = 2 * k + half;
    const uint4 codes = *reinterpret_cast<const uint4*>(stage_row + u * 16);
    const u16 sc = *reinterpret_cast<const u16*>(stage_row + kDataBytes + 2 * u);
    e2m1x32_decode_unit<kE2m1RawExponent - kKScaleExp>(U32x4{codes.x, codes.y, codes.z, codes.w}, sc, [&](int p, U32x4 v) {
      *reinterpret_cast<uint4*>(tile_row + (((4 * u + p) ^ sw) * 16)) = make_uint4(v.x, v.y, v.z, v.w);
    });
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = 2 * k + half;
    const uint4 v = *reinterpret_cast<const uint4*>(stage_row + 224 + r * 16);
    *reinterpret_cast<uint4*>(tile_row + (((56 + r) ^ sw) * 16)) = v;
  }
}

// One candidate's record half in registers (compact configuration): data units 2k + half (k < 11;
// codes for k < 7, RoPE after) and both scale units. Masked slots load zeros (predicated loads).
struct RecordHalf {
  U32x4 data[11];
  U32x4 scales[2];
};

template <bool kHasExtra>
__device__ __forceinline__ bool load_candidate_regs(const SparseNvfp4Params& p, const TokenWork& w, int t, int chunk,
                                                    int cand, int half, RecordHalf& rec) {
  const CandidateRecord r = locate_candidate<kHasExtra>(p, w, t, chunk, cand, half * 16, 0);
#pragma unroll
  for (int k = 0; k < 11; ++k) rec.data[k] = ldg128_if(r.data + 32 * k, r.valid);
  rec.scales[0] = ldg128_if(r.scales, r.valid);
  rec.scales[1] = ldg128_if(r.scales + 16, r.valid);
  return r.valid;
}

// decode_candidate from registers.
__device__ __forceinline__ void decode_candidate_regs(const RecordHalf& rec, u8* tile_row, int cand, int half) {
  const int sw = cand & 7;
  const u32 scale_words[7] = {rec.scales[0].x, rec.scales[0].y, rec.scales[0].z, rec.scales[0].w,
                              rec.scales[1].x, rec.scales[1].y, rec.scales[1].z};
#pragma unroll
  for (int k = 0; k < 7; ++k) {
    const int u = 2 * k + half;  // scale groups 2u, 2u + 1: half `half` of scale word k
    e2m1x32_decode_unit<kE2m1RawExponent - kKScaleExp>(rec.data[k], u16(scale_words[k] >> (16 * half)), [&](int p, U32x4 v) {
      *reinterpret_cast<uint4*>(tile_row + (((4 * u + p) ^ sw) * 16)) = make_uint4(v.x, v.y, v.z, v.w);
    });
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = 2 * k + half;
    const U32x4 v = rec.data[7 + k];
    *reinterpret_cast<uint4*>(tile_row + (((56 + r) ^ sw) * 16)) = make_uint4(v.x, v.y, v.z, v.w);
  }
}

__device__ __forceinline__ u32 compress_even_bits(u32 x) {
  x &= 0x55555555u;
  x = (x | (x >> 1)) & 0x33333333u;
  x = (x | (x >> 2)) & 0x0f0f0f0fu;
  x = (x | (x >> 4)) & 0x00ff00ffu;
  return (x | (x >> 8)) & 0x0000ffffu;
}

// Q rows head0 .. head0 + kRows - 1 into shared memory: NoPE NVFP4 round-tripped by the writers'
// rule (nvfp4_round_trip_group16) as exact f16, RoPE as bf16 * 2^-7; rows past H copy row H - 1
// (never stored, and loads that do not wait on a compare with H). The
// rows' 28 NoPE groups and 8 RoPE units are dealt round-robin to kThreads threads (`idx` in [0,
// kThreads)). A thread loads its RoPE units first, then its groups two at a time, issuing both
// groups' loads before converting either: at T = 1, a round trip to L2 per group would be most of a
// block's time.
template <int kRows, int kThreads>
__device__ __forceinline__ void stage_q(const SparseNvfp4Params& p, int t, int head0, u8* q_smem, int idx) {
  constexpr int kNope = kRows * 28, kRope = kRows * 8;
  constexpr int kPerNope = (kNope + kThreads - 1) / kThreads, kPerRope = (kRope + kThreads - 1) / kThreads;
  constexpr int kBatch = 2;
  const u16* q = static_cast<const u16*>(p.q) + (long long)t * p.heads * 512;
  uint4 rope[kPerRope];
#pragma unroll
  for (int k = 0; k < kPerRope; ++k) {
    const int u = idx + k * kThreads, r = u / 8, head = min(head0 + r, p.heads - 1);
    rope[k] = make_uint4(0u, 0u, 0u, 0u);
    if (u < kRope) rope[k] = __ldg(reinterpret_cast<const uint4*>(q + (long long)head * 512 + kNopeDims + (u - r * 8) * 8));
  }
#pragma unroll
  for (int k0 = 0; k0 < kPerNope; k0 += kBatch) {
    uint4 raw[kBatch][2];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int g = idx + (k0 + k) * kThreads, r = g / 28, head = min(head0 + r, p.heads - 1);
      raw[k][0] = raw[k][1] = make_uint4(0u, 0u, 0u, 0u);
      if (k0 + k < kPerNope && g < kNope) {
        const uint4* src = reinterpret_cast<const uint4*>(q + (long long)head * 512 + (g - r * 28) * 16);
        raw[k][0] = __ldg(src);
        raw[k][1] = __ldg(src + 1);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int g = idx + (k0 + k) * kThreads, r = g / 28, grp = g - r * 28;
      if (k0 + k >= kPerNope || g >= kNope) break;
      u32 h[8];
      nvfp4_round_trip_group16(raw[k][0], raw[k][1], h);
      u8* row = q_smem + r * kTileRow;
      *reinterpret_cast<uint4*>(row + (((2 * grp) ^ (r & 7)) * 16)) = make_uint4(h[0], h[1], h[2], h[3]);
      *reinterpret_cast<uint4*>(row + (((2 * grp + 1) ^ (r & 7)) * 16)) = make_uint4(h[4], h[5], h[6], h[7]);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerRope; ++k) {
    const int u = idx + k * kThreads, r = u / 8, unit = u - r * 8;
    if (u >= kRope) break;
    const u32 w[4] = {rope[k].x, rope[k].y, rope[k].z, rope[k].w};
    u32 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = pack_bf16x2(bf16x2_lo(w[i]) * (1.0f / kKScaleUndo), bf16x2_hi(w[i]) * (1.0f / kKScaleUndo));
    *reinterpret_cast<uint4*>(q_smem + r * kTileRow + (((56 + unit) ^ (r & 7)) * 16)) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// What the decode body needs to know about a cache format: how Q is staged, how a candidate's record
// half is gathered into registers and decoded into its tile row (compact configuration) or gathered
// into a raw stage row of kStageRowBytes and decoded from it (staged configuration), and the tile's
// number formats. kF16Nope: dims below 448 hold f16 value * 2^-7 (and Q's RoPE dims and P
// follow suit, see the file comment); otherwise every dim of Q and of a tile is bf16, unscaled.
struct Nvfp4Format {
  static constexpr bool kF16Nope = true;
  static constexpr float kNopeUndo = kKScaleUndo;
  static constexpr unsigned kStageRowBytes = kSparseStageRowBytes;
  static constexpr bool kAsyncGather = true;  // the staged configuration may gather by cp.async too
  using Record = RecordHalf;
  template <bool kHasExtra>
  __device__ static __forceinline__ bool load(const SparseNvfp4Params& p, const TokenWork& w, int t, int chunk, int cand, int half,
                                              Record& rec) {
    return load_candidate_regs<kHasExtra>(p, w, t, chunk, cand, half, rec);
  }
  __device__ static __forceinline__ void decode(const Record& rec, u8* tile_row, int cand, int half) {
    decode_candidate_regs(rec, tile_row, cand, half);
  }
  // Staged configuration: a record half from its raw stage row (both pools share one layout).
  template <bool kHasExtra>
  __device__ static __forceinline__ bool gather_bulk(const SparseNvfp4Params& p, const TokenWork& w, int t, int chunk, int cand, int half,
                                                     u8* stage_row, u32 bar_raw, u32& bytes) {
    return load_candidate_bulk<kHasExtra>(p, w, t, chunk, cand, half, stage_row, bar_raw, bytes);
  }
  template <bool kHasExtra>
  __device__ static __forceinline__ bool gather_async(const SparseNvfp4Params& p, const TokenWork& w, int t, int chunk, int cand, int half,
                                                      u8* stage_row) {
    return load_candidate<kHasExtra>(p, w, t, chunk, cand, half, stage_row);
  }
  __device__ static __forceinline__ void decode_staged(const u8* stage_row, u8* tile_row, int cand, int half, bool) {
    decode_candidate(stage_row, tile_row, cand, half);
  }
  template <int kRows, int kThreads>
  __device__ static __forceinline__ void stage_q(const SparseNvfp4Params& p, int t, int head0, u8* q_smem, int idx) {
    sparse_detail::stage_q<kRows, kThreads>(p, t, head0, q_smem, idx);
  }
};

// ---- The mma.sync body by role ----
// Per chunk: the producers gather its 64 records and decode them into a tile (produce_compact,
// produce_staged); each consumer team computes S = Q K^T for its 16 heads (chunk_scores), takes the
// online-softmax step (chunk_softmax) and adds P V (chunk_pv). Then each team
// publishes its row sums (publish_row_sums) and normalises and writes its rows (write_rows), or a
// cluster's CTAs, which split the chunks, combine their partial rows (cluster_combine).

// Producers of the compact configuration (one tile): thread (cand, half) = (ptid / 2, ptid % 2)
// loads its record half of chunk i + 1 into registers before it decodes chunk i, so the loads'
// latency hides behind the decode and the consumers' wait on the tile.
template <class F, bool kHasExtra>
__device__ __forceinline__ void produce_compact(const SparseNvfp4Params& p, const TokenWork& work, int t, int c_begin, int n_iter, u8* tiles,
                                                u32* masks, u32 bar_empty, u32 bar_full, int ptid, int lane) {
  const int cand = ptid >> 1, half = ptid & 1;
  typename F::Record cur, next;
  bool valid_cur = n_iter > 0 && F::template load<kHasExtra>(p, work, t, c_begin, cand, half, cur);
  for (int i = 0; i < n_iter; ++i) {
    const int b = i & 1;
    bool valid_next = false;
    if (i + 1 < n_iter) valid_next = F::template load<kHasExtra>(p, work, t, c_begin + i + 1, cand, half, next);
    if (i >= 1) mbar_wait(bar_empty, u32((i - 1) & 1));
    F::decode(cur, tiles + cand * kTileRow, cand, half);
    const u32 ballot = __ballot_sync(0xffffffffu, valid_cur && half == 0);
    if (lane == 0) masks[b * 4 + (ptid >> 5)] = compress_even_bits(ballot);
    mbar_arrive(bar_full);
    cur = next;
    valid_cur = valid_next;
  }
}

// Producers of the staged configuration (two tiles, two raw stages): work item = (candidate, half)
// of 128, two per thread with 64 producer threads. Chunks i and i + 1 are in flight while chunk i
// waits for its tile; kStageQ: the producers also stage a share of Q while their first gathers are in
// flight. kBulk: the gathers are load_candidate_bulk's, each raw stage landing on its mbarrier at
// `bar_raw` + 8 * stage; else load_candidate's cp.async groups, one per chunk.
template <class F, int kRows, int kQThreads, int kProducers, bool kStageQ, bool kHasExtra, bool kBulk>
__device__ __forceinline__ void produce_staged(const SparseNvfp4Params& p, const TokenWork& work, int t, int head0, int c_begin, int n_iter,
                                               u8* stages, u8* tiles, u8* q_smem, u32* masks, u32 bar_empty, u32 bar_full, u32 bar_raw,
                                               int tid, int ptid, int lane) {
  constexpr int kReps = 128 / kProducers;
  constexpr unsigned kStageBytes = 64u * F::kStageRowBytes;
  bool valid_next[2][kReps];
  // Gathers chunk c_begin + i into raw stage b.
  auto gather = [&](int i, int b, bool (&valid)[kReps]) {
    u32 bytes = 0u;
#pragma unroll
    for (int r = 0; r < kReps; ++r) {
      const int item = ptid + r * kProducers, cand = item >> 1, half = item & 1;
      u8* stage_row = stages + b * kStageBytes + cand * F::kStageRowBytes;
      valid[r] = false;
      if (i < n_iter) {
        if constexpr (kBulk) valid[r] = F::template gather_bulk<kHasExtra>(p, work, t, c_begin + i, cand, half, stage_row, bar_raw + 8 * b, bytes);
        else valid[r] = F::template gather_async<kHasExtra>(p, work, t, c_begin + i, cand, half, stage_row);
      }
    }
    if constexpr (kBulk) {
      if (i < n_iter) stage_arrive(bar_raw + 8 * b, bytes, lane);  // one phase per chunk and stage
    } else {
      cp_async_commit();  // one group per chunk
    }
  };
#pragma unroll
  for (int i = 0; i < 2; ++i) gather(i, i, valid_next[i]);
  if (kStageQ) F::template stage_q<kRows, kQThreads>(p, t, head0, q_smem, tid);
  for (int i = 0; i < n_iter; ++i) {
    const int b = i & 1;
    if constexpr (kBulk) {
      mbar_wait(bar_raw + 8 * b, u32((i >> 1) & 1));  // chunk i's records have landed
    } else {
      cp_async_wait<1>();
      named_barrier_sync(kBarProducers, kProducers);
    }
    if (i >= 2) mbar_wait(bar_empty + 8 * b, u32(((i >> 1) - 1) & 1));
    const bool extra = kHasExtra && c_begin + i >= work.main_chunks;
#pragma unroll
    for (int r = 0; r < kReps; ++r) {
      const int item = ptid + r * kProducers, cand = item >> 1, half = item & 1;
      const u8* stage_row = stages + b * kStageBytes + cand * F::kStageRowBytes;
      F::decode_staged(stage_row, tiles + b * kSparseTileBytes + cand * kTileRow, cand, half, extra);
      const u32 ballot = __ballot_sync(0xffffffffu, valid_next[0][r] && half == 0);
      if (lane == 0) masks[b * 4 + (item >> 5)] = compress_even_bits(ballot);
    }
    mbar_arrive(bar_full + 8 * b);
    named_barrier_sync(kBarProducers, kProducers);  // staging buffer b fully read
    if constexpr (kBulk) fence_proxy_async_smem();  // those reads before the next bulk copies' writes
#pragma unroll
    for (int r = 0; r < kReps; ++r) valid_next[0][r] = valid_next[1][r];
    gather(i + 2, b, valid_next[1]);
  }
  if constexpr (!kBulk) cp_async_wait<0>();
}

// A consumer thread's place: team `team` owns heads head0 + 16 team .. + 15 (rows row0 = 16 team ..
// of Q, P and the exchanges); in accumulator fragments the thread holds rows row0 + g and
// row0 + g + 8, columns 2 q4, 2 q4 + 1 of each 8-wide n-tile.
struct ConsumerLane {
  int warp, lane, g, q4, row0, bar_team;
};

// S = Q K^T for the team's 16 rows and this warp's 16 candidates (16 warp ..), over kSets independent
// accumulator sets (MMA latency hiding), summed at the end: s[nt][e] is candidate 16 warp + 8 nt + 2 q4
// + (e & 1) of row g + 8 (e >> 1).
template <class F, int kSets>
__device__ __forceinline__ void chunk_scores(const u8* tile, const u8* q, const ConsumerLane& c, float (&s)[2][4]) {
  const int lane = c.lane;
  float sacc[kSets][2][4];
#pragma unroll
  for (int st = 0; st < kSets; ++st)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[st][nt][e] = 0.0f;
  const u8* k_row = tile + (c.warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * kTileRow;
  const int k_sub = (lane >> 3) & 1;
  const u8* q_row = q + (c.row0 + (lane & 15)) * kTileRow;
  const int q_sub = lane >> 4;
  const int sw = lane & 7;
#pragma unroll
  for (int ks = 0; ks < 32; ++ks) {
    u32 kb[4];
    ldmatrix_x4(kb, k_row + (((2 * ks + k_sub) ^ sw) * 16));
    const u32 b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
    u32 qa[4];
    ldmatrix_x4(qa, q_row + (((2 * ks + q_sub) ^ sw) * 16));
    if (F::kF16Nope && ks < kNopeDims / 16) {
      mma_f16_16816(sacc[ks % kSets][0], qa, b0);
      mma_f16_16816(sacc[ks % kSets][1], qa, b1);
    } else {
      mma_bf16_16816(sacc[ks % kSets][0], qa, b0);
      mma_bf16_16816(sacc[ks % kSets][1], qa, b1);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = 0.0f;
#pragma unroll
      for (int st = 0; st < kSets; ++st) v += sacc[st][nt][e];
      s[nt][e] = v;
    }
}

// The online-softmax step of one chunk for this thread's two rows: masked base-2 scores, the
// chunk's row max over the team's four warps (through red_max, one team barrier), P = 2^(s - m)
// (f16 with kF16Nope, else bf16) into the team's P buffer of chunk parity b, O and l rescaled; a
// second team barrier publishes P. Returns the P buffer for chunk_pv (computed once: with a second
// computation of the same address in the loop, ptxas allocated the staged sm_90a kernels 8 fewer
// registers at ~50 more instructions and the compact sm_90a kernels lost their unrolled loop).
template <class F, int kRows>
__device__ __forceinline__ u8* chunk_softmax(float (&s)[2][4], const u32* masks, float* red_max, u8* p_smem, int b, float scale_log2,
                                             const ConsumerLane& c, float (&o)[16][4], float (&m_run)[2], float (&l_run)[2]) {
  const u32 mask = masks[b * 4 + c.warp];
  float* rmax = red_max + b * 4 * 32;
  float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + 2 * c.q4 + (e & 1);
      const float v = ((mask >> col) & 1u) ? s[nt][e] * scale_log2 : neg_inf();
      s[nt][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = quad_max(mx[hr]);
    if (c.q4 == 0) rmax[c.warp * 32 + c.row0 + hr * 8 + c.g] = mx[hr];
  }
  named_barrier_sync(c.bar_team, kSparseConsumerThreads);
  u8* pbuf = p_smem + b * kRows * 128 + c.row0 * 128;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = hr * 8 + c.g;
    float tile_max = rmax[c.row0 + row];
#pragma unroll
    for (int w = 1; w < 4; ++w) tile_max = fmaxf(tile_max, rmax[w * 32 + c.row0 + row]);
    const auto [m_use, alpha] = online_softmax_step(m_run[hr], tile_max);
    float psum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float p0 = fast_exp2(s[nt][2 * hr] - m_use);
      const float p1 = fast_exp2(s[nt][2 * hr + 1] - m_use);
      psum += p0 + p1;
      u32 h;
      if constexpr (F::kF16Nope) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(p1), "f"(p0));
      else h = pack_bf16x2(p0, p1);
      const int chunk = 2 * c.warp + nt;
      *reinterpret_cast<u32*>(pbuf + row * 128 + ((chunk ^ (row & 7)) * 16) + 4 * c.q4) = h;
    }
    l_run[hr] = l_run[hr] * alpha + psum;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      o[nt][2 * hr] *= alpha;
      o[nt][2 * hr + 1] *= alpha;
    }
  }
  named_barrier_sync(c.bar_team, kSparseConsumerThreads);
  return pbuf;
}

// The NoPE or RoPE dim of column pair q4 of this warp's n-tile nt: NoPE dims 112 warp .. + 111
// (nt < 14), RoPE dims 448 + 16 warp .. + 15.
__device__ __forceinline__ int out_dim(int nt, int warp, int q4) { return (nt < 14 ? 112 * warp + 8 * nt : 448 + 16 * warp + 8 * (nt - 14)) + 2 * q4; }

// O += P V with P (the team's 16 rows x 64 candidates) from pbuf and V the tile, for this warp's
// dims (out_dim). With kF16Nope the NoPE dims take f16 P and the RoPE dims P converted to bf16.
template <class F>
__device__ __forceinline__ void chunk_pv(const u8* pbuf, const u8* tile, const ConsumerLane& c, float (&o)[16][4]) {
  const int lane = c.lane, warp = c.warp;
  const int q_sub = lane >> 4;
  const int sw = lane & 7;
  const u8* p_row = pbuf + (lane & 15) * 128;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    u32 pa[4], pb[4];
    ldmatrix_x4(pa, p_row + (((2 * ks + q_sub) ^ sw) * 16));
#pragma unroll
    for (int e = 0; e < 4; ++e) pb[e] = F::kF16Nope ? f16x2_to_bf16x2(pa[e]) : pa[e];
    const u8* v_row = tile + (ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * kTileRow;
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      const int chunk = (np < 7 ? 14 * warp + 2 * np : 56 + 2 * warp) + (lane >> 4);
      u32 vb[4];
      ldmatrix_x4_trans(vb, v_row + ((chunk ^ sw) * 16));
      const u32 b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      if (F::kF16Nope && np < 7) {
        mma_f16_16816(o[2 * np], pa, b0);
        mma_f16_16816(o[2 * np + 1], pa, b1);
      } else {
        mma_bf16_16816(o[2 * np], pb, b0);
        mma_bf16_16816(o[2 * np + 1], pb, b1);
      }
    }
  }
}

// Each warp's part of its rows' sums into red_l[warp][row]; after the team barrier a row's sum is
// the four parts' total (row_sum).
__device__ __forceinline__ void publish_row_sums(const float (&l_run)[2], float* red_l, const ConsumerLane& c) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float l = quad_sum(l_run[hr]);
    if (c.q4 == 0) red_l[c.warp * 32 + c.row0 + hr * 8 + c.g] = l;
  }
  named_barrier_sync(c.bar_team, kSparseConsumerThreads);
}
__device__ __forceinline__ float row_sum(const float* red_l, int row) { return red_l[row] + red_l[32 + row] + red_l[64 + row] + red_l[96 + row]; }

// The team's finished rows, normalised (and with the sink for a final output), into output / out_lse
// or the split's mid_out / mid_lse.
template <class F>
__device__ __forceinline__ void write_rows(const SparseNvfp4Params& p, const float (&o)[16][4], const float (&m_run)[2], const float* red_l,
                                           int t, int head0, int split, const ConsumerLane& c) {
  const float* sink = static_cast<const float*>(p.attn_sink);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = c.row0 + hr * 8 + c.g;
    const int head = head0 + row;
    // The same for the whole warp (H is a multiple of 8), but a branch on it would put the stores'
    // shuffles under divergent control flow: rows past H only skip their stores.
    const bool in_range = head < p.heads;
    const float l = row_sum(red_l, row);
    const bool empty = !(l > 0.0f);
    float lse = m_run[hr] + fast_log2(l);  // base 2, in units of the true logits
    float factor = empty ? 0.0f : 1.0f / l;
    if (!p.split && sink != nullptr && in_range) {
      sparse_fold_sink(sink[head], empty, lse, factor);
    } else if (empty) {
      lse = p.split ? kSparseEmptySplitLse : neg_inf();
    }
    const long long out_row = (long long)t * p.heads + head;
    const bool live = in_range && !(p.split && empty);  // mid_out of an empty split is never read
    u16* dst = sparse_out_row(p, out_row, split);
    // Column groups nt and nt + 1 (nt even) are adjacent (out_dim): one pair store each.
#pragma unroll
    for (int nt = 0; nt < 16; nt += 2) {
      const float f = nt < 14 ? factor * F::kNopeUndo : factor;
      st_quad_row_pairs(dst + out_dim(nt, c.warp, 0), 0, c.q4, pack_bf16x2(o[nt][2 * hr] * f, o[nt][2 * hr + 1] * f),
                        pack_bf16x2(o[nt + 1][2 * hr] * f, o[nt + 1][2 * hr + 1] * f), live);
    }
    if (in_range && c.warp == 0 && c.q4 == 0) {
      if (p.split) static_cast<float*>(p.mid_lse)[out_row * p.split_stride + split] = lse;
      else static_cast<float*>(p.out_lse)[out_row] = lse * p.lse_scale;
    }
  }
}

// The cluster epilogue: every CTA publishes its rows' max, sum and unnormalised O in its tiles
// region; after the first cluster barrier CTA crank combines the O columns nt with nt % ncta ==
// crank over all CTAs in rank order (a fixed order: bitwise repeatable) and writes them; the second
// barrier keeps each CTA's shared memory alive until read.
template <class F, int kConsumers>
__device__ __forceinline__ void cluster_combine(const SparseNvfp4Params& p, const float (&o)[16][4], const float (&m_run)[2], const float* red_l,
                                                u8* tiles, int t, int head0, int split, int ncta, int crank, int tid, const ConsumerLane& c) {
  const float* sink = static_cast<const float*>(p.attn_sink);
  named_barrier_sync(kBarQStaged, kConsumers);  // both teams are past their last tile read
  float* xo = reinterpret_cast<float*>(tiles);  // [16 nt][kConsumers][4]
  float* xs = xo + 16 * kConsumers * 4;         // [kRows][2]: max, sum
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) *reinterpret_cast<float4*>(xo + (nt * kConsumers + tid) * 4) = make_float4(o[nt][0], o[nt][1], o[nt][2], o[nt][3]);
  if (c.warp == 0 && c.q4 == 0) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = c.row0 + hr * 8 + c.g;
      xs[2 * row] = m_run[hr];
      xs[2 * row + 1] = row_sum(red_l, row);
    }
  }
  cluster_sync();
  float w[2][kSparseMaxCluster], factor[2];
  bool empty[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = c.row0 + hr * 8 + c.g;
    const int head = head0 + row;
    const SparseClusterRow cr =
        sparse_cluster_row(p.split, smem_addr(xs + 2 * row), ncta, 0u, 1u, sink != nullptr && head < p.heads ? sink + head : nullptr);
#pragma unroll
    for (int r = 0; r < kSparseMaxCluster; ++r) w[hr][r] = cr.w[r];
    factor[hr] = cr.factor;
    empty[hr] = cr.empty;
    const long long out_row = (long long)t * p.heads + head;
    if (crank == 0 && c.warp == 0 && c.q4 == 0 && head < p.heads) {
      if (p.split) static_cast<float*>(p.mid_lse)[out_row * p.split_stride + split] = cr.lse;
      else static_cast<float*>(p.out_lse)[out_row] = cr.lse * p.lse_scale;
    }
  }
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    if (nt % ncta != crank) continue;
    const u32 o_addr = smem_addr(xo + (nt * kConsumers + tid) * 4);
    float4 v[kSparseMaxCluster];
#pragma unroll
    for (int r = 0; r < kSparseMaxCluster; ++r) v[r] = r < ncta ? ld_peer_f32x4(peer_addr(o_addr, u32(r))) : make_float4(0.f, 0.f, 0.f, 0.f);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < kSparseMaxCluster; ++r) {
      acc[0] += w[0][r] * v[r].x;
      acc[1] += w[0][r] * v[r].y;
      acc[2] += w[1][r] * v[r].z;
      acc[3] += w[1][r] * v[r].w;
    }
    const int dim = out_dim(nt, c.warp, c.q4);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int head = head0 + c.row0 + hr * 8 + c.g;
      const long long out_row = (long long)t * p.heads + head;
      u16* dst = sparse_out_row(p, out_row, split);
      const float f = nt < 14 ? factor[hr] * F::kNopeUndo : factor[hr];
      if (head < p.heads && !(p.split && empty[hr]))  // mid_out of an empty split is never read
        *reinterpret_cast<u32*>(dst + dim) = pack_bf16x2(acc[2 * hr] * f, acc[2 * hr + 1] * f);
    }
  }
  cluster_sync();
}

// H (p.heads: a multiple of 8, <= 128) is a run-time value, used per CTA and per output row, so one
// module serves every head count. kHeadTiles: 1 (16 heads per block) or 2 (32 heads share one
// gather). kHasExtra: a second pool shares the softmax. kSmall: the compact configuration (records
// gathered into registers), else the staged one (raw stages in shared memory, by bulk copies or, for
// a format with kAsyncGather, by cp.async as p.bulk_gather says). At run time p.split: write
// mid_out/mid_lse (merged by sparse_nvfp4_merge_kernel) instead of output/out_lse.
template <class F, int kHeadTiles, bool kHasExtra, bool kSmall>
__device__ __forceinline__ void sparse_decode(const SparseNvfp4Params& p) {
  static_assert(kSmall || sparse_decode_smem_bytes(kHeadTiles, false, F::kStageRowBytes) <= 227u * 1024u,
                "the staged configuration's tiles, raw stages and Q fit one SM's shared memory");
  static_assert(kHeadTiles == 1 || kHeadTiles == 2, "head_tiles is 1 or 2");
  static_assert(!kSmall || kHeadTiles == 1, "the compact configuration has one head tile");
  constexpr int kTileBufs = sparse_tile_buffers(kSmall);
  constexpr int kRows = 16 * kHeadTiles;
  const int groups = sparse_head_groups(p.heads, kHeadTiles);
  // Independent QK accumulator sets (MMA latency hiding); two teams share a 168-register budget.
  constexpr int kSets = kHeadTiles == 1 ? 4 : 2;
  constexpr int kConsumers = kHeadTiles * kSparseConsumerThreads;
  constexpr int kProducers = sparse_producer_threads(kHeadTiles);
  // With one 16-head tile the producers stage part of Q while their first gathers are in flight;
  // elsewhere they hold more registers, and the consumers stage all of it.
  constexpr bool kProducersStageQ = !kSmall && kHeadTiles == 1;
  constexpr int kQThreads = kProducersStageQ ? kConsumers + kProducers : kConsumers;

  pdl_launch_dependents();
  extern __shared__ __align__(128) u8 smem[];
  u8* tiles = smem;
  u8* stages = smem + 2 * kSparseTileBytes;  // absent in the compact configuration
  constexpr unsigned kStageRow = F::kStageRowBytes;
  u8* q_smem = smem + sparse_smem_q_offset(kSmall, kStageRow);
  u8* p_smem = smem + sparse_smem_p_offset(kHeadTiles, kSmall, kStageRow);                                  // [2][kRows][128 B]
  float* red_max = reinterpret_cast<float*>(smem + sparse_smem_red_offset(kHeadTiles, kSmall, kStageRow));  // [2][4][32]
  float* red_l = red_max + 2 * 4 * 32;                                                                       // [4][32]
  u32* masks = reinterpret_cast<u32*>(smem + sparse_smem_mask_offset(kHeadTiles, kSmall, kStageRow));        // [2][4]
  // A decoded tile changes hands through mbarriers rather than bar.arrive: producers arrive on its
  // "full" barrier (every producer thread, after its writes of the tile, the masks and its share of
  // Q), consumers on its "empty" one, so each release orders the writer's accesses before the
  // reader's for every tool that checks it, and neither side waits for the other to arrive.
  const u32 bar_empty = smem_addr(smem + sparse_smem_empty_offset(kHeadTiles, kSmall, kStageRow));  // + 8 * buffer
  const u32 bar_full = bar_empty + 8 * kTileBufs;                                         // + 8 * buffer
  const u32 bar_raw = bar_full + 8 * kTileBufs;  // staged configuration, bulk gathers: + 8 * raw stage

  const int tid = threadIdx.x;
  // With a cluster of ncta CTAs (kMma launches only), the cluster shares one (token, head group,
  // split): CTA crank takes its slice of the split's chunks and the cluster combines the partial
  // rows in distributed shared memory (cluster_combine).
  const int ncta = kSmall ? 1 : int(cluster_size());
  const int crank = kSmall ? 0 : int(cluster_rank());
  const int group = (blockIdx.x / ncta) % groups;
  const CtaPlace at = cta_place(p, ncta, groups);
  const int split = at.split, t = at.t;
  const int head0 = group * kRows;

  if (tid == 0) {
    for (int b = 0; b < kTileBufs; ++b) {
      mbar_init(bar_empty + 8 * b, kConsumers);
      mbar_init(bar_full + 8 * b, kProducers);
    }
    if (!kSmall && (!F::kAsyncGather || p.bulk_gather)) {
      for (int st = 0; st < 2; ++st) mbar_init(bar_raw + 8 * st, kProducers + kProducers / 32);
      mbar_fence_init();  // the raw stages' barriers complete bulk copies (async proxy)
    }
  }
  pdl_wait();  // the first read of an input (sparse_detail)
  const TokenWork work = token_work<kHasExtra>(p, t);
  const ChunkRange range = chunk_range(p, work, split, crank, ncta);
  const int c_begin = range.begin, n_iter = range.count;
  __syncthreads();

  if (kSmall && tid >= kConsumers) {
    produce_compact<F, kHasExtra>(p, work, t, c_begin, n_iter, tiles, masks, bar_empty, bar_full, tid - kConsumers, tid & 31);
    return;  // the compact configuration is never launched as a cluster
  }
  if constexpr (!kSmall) {
    if (tid >= kConsumers) {
      if (!F::kAsyncGather || p.bulk_gather) {
        produce_staged<F, kRows, kQThreads, kProducers, kProducersStageQ, kHasExtra, true>(
            p, work, t, head0, c_begin, n_iter, stages, tiles, q_smem, masks, bar_empty, bar_full, bar_raw, tid, tid - kConsumers, tid & 31);
      } else if constexpr (F::kAsyncGather) {
        produce_staged<F, kRows, kQThreads, kProducers, kProducersStageQ, kHasExtra, false>(
            p, work, t, head0, c_begin, n_iter, stages, tiles, q_smem, masks, bar_empty, bar_full, bar_raw, tid, tid - kConsumers, tid & 31);
      }
      if (ncta > 1) {  // the consumers' two cluster barriers (cluster_combine)
        cluster_sync();
        cluster_sync();
      }
      return;
    }
  }

  // ------------------------------ consumers ------------------------------
  const int team = tid / kSparseConsumerThreads;
  ConsumerLane c;
  c.warp = (tid >> 5) & 3;
  c.lane = tid & 31;
  c.g = c.lane >> 2;
  c.q4 = c.lane & 3;
  c.bar_team = team == 0 ? kBarTeam0 : kBarTeam1;
  c.row0 = team * 16;
  // This thread's share of Q: kBarQStaged orders the consumers' shares, the first full barrier the
  // producers' (if any), before any read.
  F::template stage_q<kRows, kQThreads>(p, t, head0, q_smem, tid);
  named_barrier_sync(kBarQStaged, kConsumers);

  const float scale_log2 = p.sm_scale_log2 * F::kNopeUndo;
  float o[16][4];
  float m_run[2], l_run[2];
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  m_run[0] = m_run[1] = neg_inf();
  l_run[0] = l_run[1] = 0.0f;

  for (int i = 0; i < n_iter; ++i) {
    const int b = i & 1;
    const int tb = i % kTileBufs;
    const u8* tile = tiles + tb * kSparseTileBytes;
    mbar_wait(bar_full + 8 * tb, u32((i / kTileBufs) & 1));
    float s[2][4];
    chunk_scores<F, kSets>(tile, q_smem, c, s);
    u8* pbuf = chunk_softmax<F, kRows>(s, masks, red_max, p_smem, b, scale_log2, c, o, m_run, l_run);
    chunk_pv<F>(pbuf, tile, c, o);
    if (i + kTileBufs < n_iter) mbar_arrive(bar_empty + 8 * tb);
  }

  publish_row_sums(l_run, red_l, c);
  // The staged kernels rebuild the split for the epilogue (cta_split); the compact one keeps it live,
  // which leaves its registers those of a kernel compiled for one value of split (rebuilding moves them).
  const CtaPlace end{t, kSmall ? split : cta_split(p, ncta, groups)};
  if constexpr (!kSmall) {
    if (ncta > 1) {
      cluster_combine<F, kConsumers>(p, o, m_run, red_l, tiles, end.t, head0, end.split, ncta, crank, tid, c);
      return;
    }
  }
  write_rows<F>(p, o, m_run, red_l, end.t, head0, end.split, c);
}

}  // namespace sparse_detail

template <int kHeadTiles, bool kHasExtra, bool kSmall = false>
__global__ void __launch_bounds__(sparse_block_threads(kHeadTiles), 1)
    sparse_nvfp4_decode_kernel(const __grid_constant__ SparseNvfp4Params p) {
  sparse_detail::sparse_decode<sparse_detail::Nvfp4Format, kHeadTiles, kHasExtra, kSmall>(p);
}

#endif  // __CUDACC__

}  // namespace kiln
