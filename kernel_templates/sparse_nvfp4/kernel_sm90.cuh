#pragma once
// Sparse MLA decode over the NVFP4 cache, Hopper (sm_90a) warpgroup-MMA path.
//
// One CTA = one query token x 64 heads x one split; each candidate is gathered and decoded once per
// CTA, and for H > 64 once per cluster pair (the two head groups split each chunk's candidates and
// write their decoded halves into both CTAs' tiles) unless the launch runs the groups unpaired.
// 384 threads in three warpgroups:
//  - WG2 (producer): gathers each chunk's 64 384-byte records with 16-byte cp.async into a raw
//    stage, a warp's lanes along one record at a time (coalesced; masked slots zero-filled). Once a
//    chunk has landed, each thread takes half a record's codes, scales and RoPE dims into registers,
//    the next chunk's copies go out, and after the wait for a free K tile it decodes into the tile
//    (448 NoPE dims as f16 * 2^-7, 64 RoPE dims as bf16). The next gather is in flight while a
//    chunk is decoded and multiplied; slot indices are loaded a chunk before their first use.
//  - WG0: S = Q K^T (64 heads x 64 candidates, both operands in shared memory), the online softmax,
//    and O[:, 0:256] += P V with P (f16) from registers.
//  - WG1: O[:, 256:512] += P V with P handed over through shared memory (f16 for the 192 NoPE
//    dims, converted to bf16 for the 64 RoPE dims).
// Every 64 x 512 operand uses the no-swizzle core-matrix layout: dims 8g..8g+7 of row r sit at
// g * 1024 + r * 16. One K tile is then a K-major B for Q K^T and an N-major (transposed) B for P V,
// and the producer's 16-byte stores of 8 consecutive rows are bank-conflict free.
// As in the mma.sync path, decoded NoPE values are value * 2^-7 (exact in f16), Q's RoPE dims are
// pre-multiplied by 2^-7, the 2^7 is folded into the softmax scale and restored on NoPE outputs.
#include "common/cluster.cuh"
#include "common/mma.cuh"
#include "common/nvfp4.cuh"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "sparse_nvfp4/kernel.cuh"
#include "sparse_nvfp4/params.cuh"

// A key can name this kernel for another target (a manifest prebuilt with --arch): say so instead of
// ptxas rejecting every wgmma.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
#error "kernel \"sm90\" runs on sm_90a only: use \"mma\" or \"mma_small\" (sparse_nvfp4) or \"default\" (sparse_dsv41) for this target"
#endif

namespace kiln {

#ifdef __CUDACC__
namespace sparse_sm90 {

// Shared-memory carve-up (bytes from the dynamic base); sparse_sm90_smem_bytes() is the total.
constexpr u32 kQOff = 0;                        // Q: 64 rows x 512 dims x 2 B
constexpr u32 kTileOff = kQOff + 65536u;        // two decoded K tiles of 64 rows x 512 dims x 2 B
constexpr u32 kTileBytes = 65536u;
// The core-matrix layout of every 64 x 512 operand (above): a row's 8 dims take 16 bytes, dims
// 8g..8g+7 of the 64 rows one group of 1024.
constexpr int kRowSlotBytes = 16;
constexpr int kDimGroupBytes = 64 * kRowSlotBytes;
constexpr int kRopeGroup = 448 / 8;  // the group of the first RoPE dims
constexpr u32 kRawOff = kTileOff + 2u * kTileBytes;
constexpr u32 kRawRow = 400u;                   // 384 B record + 16 B: 8 consecutive rows hit distinct banks
constexpr u32 kPOff = kRawOff + 64u * kRawRow;  // P fragments: [k-step 4][thread 128] x 16 B
constexpr u32 kAlphaOff = kPOff + 8192u;        // float[64]: per-row rescale of the current chunk
constexpr u32 kFactorOff = kAlphaOff + 256u;    // float[64]: final 1/l (-1 marks a row with no candidate)
// The dealt epilogue's per-row (max, sum), in Q's place: Q is dead once WG0's last S has retired and
// no thread reads it with ordinary loads (WG1 still reads the alphas in its last chunk).
constexpr u32 kDealRowsOff = kQOff;
constexpr u32 kMaskOff = kFactorOff + 256u;     // u64 tile masks [2] (bit c: candidate c is valid)
constexpr u32 kValidOff = kMaskOff + 16u;       // shared decode: the raw stage's valid bits, a byte per gather warp
constexpr u32 kBarOff = kValidOff + 8u;         // mbarriers: tile full [2], tile empty [2], P free, Q dealt
static_assert(kBarOff + 48u == sparse_sm90_smem_bytes(), "carve-up and launch size disagree");

// What the peer's st.asyncs complete on this CTA's full barrier per chunk (a cluster pair): its 32
// decoded rows and its word of the tile mask.
constexpr u32 kPeerBytes = 32u * 1024u + 4u;

constexpr int kBarQ = 1, kBarPReady = 2, kBarRaw = 3, kBarEpilogue = 4;  // named barriers (kBarRaw: the producers, else the consumers)
constexpr int kConsumers = 256;
constexpr int kProducerThreads = kSparseSm90Threads - kConsumers;
// Register split: setmaxnreg moves registers only within the block's launch allocation (168 x 384,
// the __launch_bounds__ cap), so the three counts sum to 3 x 168 = 504. WG0 holds O (128), S (32)
// and P (16); WG1 O (128) and two copies of P (32); the producer one chunk's codes and scales.
// A format may move registers between WG1 and the producer (Regs below).
struct Regs {
  int wg0, wg1, producer;
};
constexpr Regs kNvfp4Regs{208, 208, 88};

// The launch's dealing, read again where it is used (volatile: not kept live across the main loop,
// where WG0 has no register to spare). Rank = slice * groups + group.
struct DealShape {
  int deal, slice;
};
template <int kGroups>
__device__ __forceinline__ DealShape deal_shape() {
  u32 n, r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return DealShape{int(n) / kGroups, int(r) / kGroups};
}

// Q rows head0 .. head0+63 into the interleaved layout: NoPE NVFP4 round-tripped by the writers'
// rule as exact f16, RoPE as bf16 * 2^-7; rows past H copy row H - 1. 256 threads; consecutive threads
// take consecutive rows, so each 16-byte store of a phase hits distinct banks. A thread issues all
// its loads (its NoPE groups, 2 RoPE units) before it converts anything: one round trip to L2.
// Where a split is dealt to several CTAs of one head group (cluster rank = slice * groups + group),
// they share the NoPE work: slice s rounds the thread's groups k = s, s + deal, ... (`mine`, bit k;
// 7 per thread in all) and writes each into its own Q and, by st.async completing on their `q_bar`,
// into the other slices' (this CTA's q_bar then expects the bytes of the groups it did not round).
// Each slice stages RoPE itself.
constexpr int kQGroupsPerThread = 64 * 28 / kConsumers;
__device__ __forceinline__ void stage_q(const SparseNvfp4Params& p, int t, int head0, u32 q_smem, int ctid, DealShape ds, u32 mine,
                                        int group, int groups, u32 q_bar) {
  constexpr int kPerNope = kQGroupsPerThread, kPerRope = 64 * 8 / kConsumers;
  const u16* q = static_cast<const u16*>(p.q) + (long long)t * p.heads * 512;
  // A row past H stages a copy of row H - 1 rather than zeros: its results are never stored, and
  // loads that do not depend on H issue as early as with H a template argument.
  const int r = ctid & 63, head = min(head0 + r, p.heads - 1);
  uint4 raw[kPerNope][2], rope[kPerRope];
#pragma unroll
  for (int k = 0; k < kPerNope; ++k) {
    const int grp = (ctid >> 6) + 4 * k;
    raw[k][0] = raw[k][1] = make_uint4(0u, 0u, 0u, 0u);
    if ((mine >> k) & 1u) {
      const uint4* src = reinterpret_cast<const uint4*>(q + (long long)head * 512 + grp * 16);
      raw[k][0] = __ldg(src);
      raw[k][1] = __ldg(src + 1);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerRope; ++k) {
    const int unit = (ctid >> 6) + 4 * k;
    rope[k] = __ldg(reinterpret_cast<const uint4*>(q + (long long)head * 512 + 448 + unit * 8));
  }
#pragma unroll
  for (int k = 0; k < kPerNope; ++k) {
    if (!((mine >> k) & 1u)) continue;
    const int grp = (ctid >> 6) + 4 * k;
    u32 h[8];
    nvfp4_round_trip_group16(raw[k][0], raw[k][1], h);
    const U32x4 lo{h[0], h[1], h[2], h[3]}, hi{h[4], h[5], h[6], h[7]};
    const u32 a_lo = q_smem + (2 * grp) * kDimGroupBytes + r * kRowSlotBytes, a_hi = a_lo + kDimGroupBytes;
    sts128(a_lo, lo);
    sts128(a_hi, hi);
#pragma unroll 1
    for (int s = 0; s < ds.deal; ++s) {
      if (s == ds.slice) continue;
      const u32 rank = u32(s * groups + group);
      st_async_128(peer_addr(a_lo, rank), lo, peer_addr(q_bar, rank));
      st_async_128(peer_addr(a_hi, rank), hi, peer_addr(q_bar, rank));
    }
  }
#pragma unroll
  for (int k = 0; k < kPerRope; ++k) {
    const int unit = (ctid >> 6) + 4 * k;
    const u32 w[4] = {rope[k].x, rope[k].y, rope[k].z, rope[k].w};
    u32 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[i] = pack_bf16x2(bf16x2_lo(w[i]) * (1.0f / sparse_detail::kKScaleUndo), bf16x2_hi(w[i]) * (1.0f / sparse_detail::kKScaleUndo));
    sts128(q_smem + (kRopeGroup + unit) * kDimGroupBytes + r * kRowSlotBytes, U32x4{v[0], v[1], v[2], v[3]});
  }
}

// The raw index entry of slot `s` (0..63) of chunk `chunk`. Branch-free: a slot past the row's
// length loads the row's first entry (always present) and is out of range, so the load can be
// issued a chunk ahead and its value first used a chunk later.
struct SlotIndex {
  int raw;
  bool in_range;
};

template <bool kHasExtra>
__device__ __forceinline__ SlotIndex load_slot_index(const SparseNvfp4Params& p, const sparse_detail::TokenWork& w, int t, int chunk,
                                                     int s) {
  const int* row;
  int slot, len;
  if (!kHasExtra || chunk < w.main_chunks) {
    row = static_cast<const int*>(p.indices) + (long long)t * p.indices_row_stride;
    slot = chunk * kSparseChunk + s;
    len = w.main_len;
  } else {
    row = static_cast<const int*>(p.extra_indices) + (long long)t * p.extra_indices_row_stride;
    slot = (chunk - w.main_chunks) * kSparseChunk + s;
    len = w.extra_len;
  }
  const bool in_range = slot < len;
  return SlotIndex{__ldg(row + (in_range ? slot : 0)), in_range};
}

// The global address of a slot's 352 data bytes (scales = false) or 32 scale bytes; 0 when masked.
template <bool kHasExtra>
__device__ __forceinline__ u64 record_addr(const SparseNvfp4Params& p, const sparse_detail::TokenWork& w, int chunk, SlotIndex si,
                                           bool scales) {
  if (!si.in_range || si.raw < 0) return 0;
  const bool in_main = !kHasExtra || chunk < w.main_chunks;
  const u8* base = static_cast<const u8*>(in_main ? p.kv : p.extra_kv);
  const long long page_stride = in_main ? p.kv_page_stride : p.extra_page_stride;
  const int page_size = in_main ? p.kv_page_size : p.extra_page_size;
  const int page = si.raw / page_size;
  const int r = si.raw - page * page_size;
  const u8* page_base = base + (long long)page * page_stride;
  const u8* rec = scales ? page_base + (long long)page_size * sparse_detail::kDataBytes + (long long)r * 32
                         : page_base + (long long)r * sparse_detail::kDataBytes;
  return reinterpret_cast<u64>(rec);
}

// Raw row layout: the 352 data bytes, then the 32 scale bytes (16 bytes of padding to 400 keep 8
// consecutive rows on distinct banks). One producer warp gathers kRows rows; for each, lane l < 24
// copies 16-byte piece l (lanes 0-21 data units, 22-23 scale units), so a warp's copy of a record
// touches its 3-4 data lines and 1 scale line instead of one line per lane. `addr`: lane l holds
// the data address (l < 16) or scale address (l >= 16) of the warp's record l % kRows, 0 when
// masked; masked rows are zero-filled, which decodes to zeros.
template <int kRows>
__device__ __forceinline__ void gather_rows(const u8* fallback, u64 addr, u32 rows, int lane) {
  const int src_lane = lane < 22 ? 0 : 16;
  const u32 src_off = lane < 22 ? 16u * lane : 16u * (lane - 22);
  const u32 dst_off = lane < 22 ? 16u * lane : sparse_detail::kDataBytes + 16u * (lane - 22);
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const u64 a = shfl_u64(addr, src_lane + k);
    cp_async_16_if(rows + u32(k) * kRawRow + dst_off, a ? reinterpret_cast<const u8*>(a) + src_off : fallback, a ? 16u : 0u, lane < 24);
  }
}

// Bits s .. s + 31 of the 64-bit hi:lo (s <= 32).
__device__ __forceinline__ u32 funnel_right(u32 lo, u32 hi, u32 s) {
  u32 r;
  asm("shf.r.clamp.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(lo), "r"(hi), "r"(s));
  return r;
}

// A 16-byte piece of a decoded tile row: into this CTA's tile and, with kCross, the same place of
// the peer's tile (`peer`: the peer's shared::cluster address minus ours), completing on its
// full barrier `peer_bar`.
template <bool kCross>
__device__ __forceinline__ void put_tile16(u32 addr, U32x4 v, u32 peer, u32 peer_bar) {
  sts128(addr, v);
  if constexpr (kCross) st_async_128(addr + peer, v, peer_bar);
}

// Decodes code unit u (dims 32u..32u+31) with its two scale bytes into tile column `col` (the
// candidate's 16-byte column of the tile).
template <bool kCross>
__device__ __forceinline__ void decode_unit(U32x4 codes, u32 scale_pair, u32 col, int u, u32 peer, u32 peer_bar) {
  e2m1x32_decode_unit<kE2m1RawExponent - sparse_detail::kKScaleExp>(
      codes, u16(scale_pair), [&](int p, U32x4 v) { put_tile16<kCross>(col + (4 * u + p) * kDimGroupBytes, v, peer, peer_bar); });
}

// ---- the dealt epilogue: slices of a split combined in distributed shared memory ----
// WG0 publishes each row's (max, sum) at kDealRowsOff + 8 * row; after a cluster barrier every consumer
// thread knows its two rows' weights and publishes its accumulator already scaled (weight of its
// slice x 1 / sum, and the NoPE dims' 2^7) as 32 float4 units (unit j: elements 4j .. 4j + 3, rows
// row_lo / row_lo + 8) at kTileOff + (j * 256 + consumer) * 16, the tiles being dead by then. After a
// second barrier slice k of each head group sums the units j with j % deal == k over the slices in
// slice order and writes them.

struct DealtRows {
  sparse_detail::SparseClusterRow row[2];
  float own[2];  // this slice's scale of each row: its weight x the row's factor
};

__device__ __forceinline__ DealtRows dealt_rows(const SparseNvfp4Params& p, u32 sbase, int row_lo, int head0, DealShape ds, int group,
                                                int groups) {
  DealtRows d;
  const float* sink = static_cast<const float*>(p.attn_sink);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head0 + row_lo + 8 * hr;
    d.row[hr] = sparse_detail::sparse_cluster_row(p.split, sbase + kDealRowsOff + u32(row_lo + 8 * hr) * 8u, ds.deal, u32(group),
                                                  u32(groups), sink != nullptr && head < p.heads ? sink + head : nullptr);
    float w = 0.0f;
#pragma unroll
    for (int r = 0; r < kSparseMaxCluster; ++r) w = r == ds.slice ? d.row[hr].w[r] : w;
    d.own[hr] = w * d.row[hr].factor;
  }
  return d;
}

// Unit `addr` of this thread: elements v[0..3] scaled by their rows' own scales and `undo`.
__device__ __forceinline__ void dealt_publish(u32 addr, const float* v, const DealtRows& d, float undo) {
  const float s0 = d.own[0] * undo, s1 = d.own[1] * undo;
  sts128(addr, U32x4{__float_as_uint(v[0] * s0), __float_as_uint(v[1] * s0), __float_as_uint(v[2] * s1), __float_as_uint(v[3] * s1)});
}

// This thread's units of its slice, summed over the slices (ranks group + r * groups), into output
// or mid_out. `units`: this thread's unit 0; wg1 picks the column map of WG1's units (dims 256..511).
__device__ __forceinline__ void dealt_combine(const SparseNvfp4Params& p, const DealtRows& d, u32 units, DealShape ds, int group, int groups,
                                              bool wg1, int t, int split, int head_lo, int q4) {
  constexpr int kBatch = 4;  // units whose peer loads are in flight together
  for (int j0 = ds.slice; j0 < 32; j0 += kBatch * ds.deal) {
    float4 v[kBatch][kSparseMaxCluster];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int r = 0; r < kSparseMaxCluster; ++r) {
        const int j = j0 + b * ds.deal;
        if (j < 32 && r < ds.deal)
          v[b][r] = ld_peer_f32x4(peer_addr(units + u32(j) * 4096u, u32(group + r * groups)));
      }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int j = j0 + b * ds.deal;
      if (j >= 32) break;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < kSparseMaxCluster; ++r) {
        if (r >= ds.deal) break;
        acc[0] += v[b][r].x;
        acc[1] += v[b][r].y;
        acc[2] += v[b][r].z;
        acc[3] += v[b][r].w;
      }
      const int col = (wg1 ? (j < 24 ? 256 + 8 * j : 448 + 8 * (j - 24)) : 8 * j) + 2 * q4;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int head = head_lo + 8 * hr;
        // A guarded store, not a `continue`: the branch around the rest of the body made the compiler
        // lay out the producer's gather loop with eight reconvergence points instead of one.
        const long long out_row = (long long)t * p.heads + head;
        u16* dst = sparse_detail::sparse_out_row(p, out_row, split);
        if (head < p.heads && !(p.split && d.row[hr].empty))  // mid_out of an empty split is never read
          *reinterpret_cast<u32*>(dst + col) = pack_bf16x2(acc[2 * hr], acc[2 * hr + 1]);
      }
    }
  }
}

// ---- The sm90 body by role ----
// The producer warpgroup gathers and decodes each chunk into a tile (F::produce: produce_own, or
// produce_pair for a cluster pair). Consumers stage Q (stage_q_shared); per chunk WG0 computes
// S = Q K^T (wg0_scores), takes the online-softmax step (wg0_softmax, rescale_rows), hands P and
// the rescale to WG1 (publish_p) and adds P V over dims 0..255 (wg0_pv), while WG1 takes them
// (take_p) and adds P V over dims 256..511 (wg1_pv). Then each warpgroup writes its columns
// (wg0_write_rows, wg1_write_rows), or a dealt split's slices combine theirs
// (wg0_dealt_epilogue, wg1_dealt_epilogue).

// Q into shared memory by the 256 consumer threads, shared between dealt slices where the format
// allows: each slice rounds its share of the NoPE groups and st.asyncs it to the others, whose
// shares complete on bar_q.
template <class F, int kGroups>
__device__ __forceinline__ void stage_q_shared(const SparseNvfp4Params& p, int t, int head0, u32 q_smem, int tid, int group, u32 bar_q) {
  const DealShape ds = deal_shape<kGroups>();
  u32 mine = (1u << kQGroupsPerThread) - 1u;
  if (F::kDealtQ && ds.deal > 1) {
    mine = 0u;
    for (int k = ds.slice; k < kQGroupsPerThread; k += ds.deal) mine |= 1u << k;
    // The other slices' groups: 32 B per (thread, group).
    if (tid == 0) mbar_arrive_expect_tx(bar_q, u32(kQGroupsPerThread - __popc(mine)) * u32(kConsumers) * 32u);
  }
  F::stage_q(p, t, head0, q_smem, tid, ds, mine, group, kGroups, bar_q);
  fence_proxy_async_smem();
  named_barrier_sync(kBarQ, kConsumers);
  if (F::kDealtQ && ds.deal > 1) {  // complete once every other slice's share has landed (no cluster-scope acquire needed)
    mbar_wait(bar_q, 0);
    fence_proxy_async_smem();
  }
}

// S = Q K^T of a chunk (64 heads x 64 candidates) into s, issued and retired: the NoPE k-steps as
// f16 wgmmas with kF16Nope, the rest bf16. dq, dk: descriptors of Q and of the chunk's tile.
template <class F>
__device__ __forceinline__ void wg0_scores(float (&s)[32], u64 dq, u64 dk) {
  wgmma_fence_operand(s);
  wgmma_fence();
  constexpr int kF16Steps = F::kF16Nope ? 28 : 0;
#pragma unroll
  for (int ks = 0; ks < kF16Steps; ++ks) {
    const int off = ks * 2 * kDimGroupBytes;  // a k16 step: two dim groups
    WgmmaF16<64>::ss<0>(s, wgmma_desc_advance(dq, off), wgmma_desc_advance(dk, off), ks > 0);
  }
#pragma unroll
  for (int ks = kF16Steps; ks < 32; ++ks) {
    const int off = ks * 2 * kDimGroupBytes;
    WgmmaBf16<64>::ss<0>(s, wgmma_desc_advance(dq, off), wgmma_desc_advance(dk, off), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(s);
}

// O[:, 0:256] += P V with P (the A operand, from registers) and V the chunk's tile (dv), retired
// before returning.
template <class F>
__device__ __forceinline__ void wg0_pv(float (&o)[128], u32 (&pf)[4][4], u64 dv) {
  wgmma_fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const u64 dvk = wgmma_desc_advance(dv, kk * 16 * kRowSlotBytes);  // a k16 step: 16 candidates' rows
    if constexpr (F::kF16Nope) WgmmaF16<256>::rs<1>(o, pf[kk], dvk, true);
    else WgmmaBf16<256>::rs<1>(o, pf[kk], dvk, true);
  }
  wgmma_commit();
  // P V retires before S(i + 1) is issued, so the tile goes back to the producer now and the
  // decode of chunk i + 2 overlaps S(i + 1) instead of following it (with both queued, the
  // release waited for S(i + 1); a wait for the older group only serializes every wgmma in ptxas).
  wgmma_wait<0>();
  wgmma_fence_operand(o);
  wgmma_fence_operand(pf);
}

// O[:, 256:448] += P V (f16 P with kF16Nope) and O[:, 448:512] += P V (bf16 P), retired before
// returning.
template <class F>
__device__ __forceinline__ void wg1_pv(float (&o_nope)[96], float (&o_rope)[32], u32 (&pf)[4][4], u32 (&pb)[4][4], u64 dv) {
  wgmma_fence_operand(o_nope);
  wgmma_fence_operand(o_rope);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int step = kk * 16 * kRowSlotBytes;
    const u64 dv_nope = wgmma_desc_advance(dv, 32 * kDimGroupBytes + step);  // dims 256 ..
    if constexpr (F::kF16Nope) WgmmaF16<192>::rs<1>(o_nope, pf[kk], dv_nope, true);
    else WgmmaBf16<192>::rs<1>(o_nope, pb[kk], dv_nope, true);
    WgmmaBf16<64>::rs<1>(o_rope, pb[kk], wgmma_desc_advance(dv, kRopeGroup * kDimGroupBytes + step), true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(o_nope);
  wgmma_fence_operand(o_rope);
  wgmma_fence_operand(pf);
  wgmma_fence_operand(pb);
}

// The online-softmax step of WG0 for one chunk: S (in s) masked by the tile mask and scaled to base
// 2, the rows' maxima moved (alpha: the rescale of their earlier sums and O), P = 2^(s - m) packed
// as the A operand of P V (f16 with kF16Nope, else bf16) and the row sums l updated.
template <class F>
__device__ __forceinline__ void wg0_softmax(float (&s)[32], u64 mask, float scale_log2, int q4, float (&m_run)[2], float (&l_run)[2],
                                            u32 (&pf)[4][4], float (&alpha)[2]) {
  float mx[2] = {neg_inf(), neg_inf()};
  if (mask == ~0ull) {  // the common chunk: every candidate valid (uniform over the warpgroup)
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      s[e] *= scale_log2;
      mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
    }
  } else {
    const u64 my_mask = mask >> (2 * q4);
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const float v = ((my_mask >> (8 * (e >> 2) + (e & 1))) & 1u) ? s[e] * scale_log2 : neg_inf();
      s[e] = v;
      mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], v);
    }
  }
  float m_use[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const OnlineSoftmaxStep step = online_softmax_step(m_run[hr], quad_max(mx[hr]));
    m_use[hr] = step.m_use;
    alpha[hr] = step.alpha;
  }
  float psum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int e = 8 * kk + 2 * r;
      const float p0 = fast_exp2(s[e] - m_use[r & 1]);
      const float p1 = fast_exp2(s[e + 1] - m_use[r & 1]);
      psum[r & 1] += p0 + p1;
      pf[kk][r] = F::kF16Nope ? pack_f16x2(p0, p1) : pack_bf16x2(p0, p1);
    }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) l_run[hr] = l_run[hr] * alpha[hr] + psum[hr];
}

// Whether any row of the warp has a new maximum. Most chunks leave every row's maximum where it was
// (alpha exactly 1), and the warp skips its O rescale.
__device__ __forceinline__ bool rows_moved(const float (&alpha)[2]) { return __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f); }
// O rows times their alpha (element e of an accumulator fragment is in row (e >> 1) & 1 of the
// thread's two).
template <int kN>
__device__ __forceinline__ void rescale_rows(float (&o)[kN], const float (&alpha)[2]) {
#pragma unroll
  for (int e = 0; e < kN; ++e) o[e] *= alpha[(e >> 1) & 1];
}

// WG0 hands chunk i's P and alphas to WG1 through shared memory (kPOff, kAlphaOff), once WG1 has
// taken chunk i - 1's (bar_p_free), and arrives on kBarPReady.
__device__ __forceinline__ void publish_p(u32 sbase, const u32 (&pf)[4][4], const float (&alpha)[2], int i, u32 bar_p_free, int wtid, int row_lo,
                                          int q4) {
  if (i > 0) mbar_wait(bar_p_free, u32((i - 1) & 1));  // WG1 holds chunk i - 1's P and alphas
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) sts128(sbase + kPOff + (kk * 128 + wtid) * 16, U32x4{pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]});
  if (q4 == 0) {
    sts_f32(sbase + kAlphaOff + row_lo * 4, alpha[0]);
    sts_f32(sbase + kAlphaOff + (row_lo + 8) * 4, alpha[1]);
  }
  named_barrier_arrive(kBarPReady, kConsumers);
}

// WG1 takes chunk i's P (pf as WG0 packed it, pb as bf16) and alphas, and releases them for chunk
// i + 1 (bar_p_free) unless i is the last.
template <class F>
__device__ __forceinline__ void take_p(u32 sbase, int i, int n_iter, u32 bar_p_free, int wtid, int row_lo, u32 (&pf)[4][4], u32 (&pb)[4][4],
                                       float (&alpha)[2]) {
  named_barrier_sync(kBarPReady, kConsumers);
  alpha[0] = lds_f32(sbase + kAlphaOff + row_lo * 4);
  alpha[1] = lds_f32(sbase + kAlphaOff + (row_lo + 8) * 4);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const U32x4 v = lds128(sbase + kPOff + (kk * 128 + wtid) * 16);
    pf[kk][0] = v.x;
    pf[kk][1] = v.y;
    pf[kk][2] = v.z;
    pf[kk][3] = v.w;
  }
  if (i + 1 < n_iter) mbar_arrive(bar_p_free);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pb[kk][r] = F::kF16Nope ? f16x2_to_bf16x2(pf[kk][r]) : pf[kk][r];
}

// WG0's epilogue without dealt slices: each row's sum, LSE and factor (with the sink for a final
// output); the factor goes to WG1 through shared memory (-1: a row without candidates), then WG0
// writes the LSE and dims 0..255.
template <class F>
__device__ __forceinline__ void wg0_write_rows(const SparseNvfp4Params& p, const float (&o)[128], const float (&m_run)[2],
                                               const float (&l_run)[2], u32 sbase, int t, int split, int head_lo, int row_lo, int q4) {
  const float* sink = static_cast<const float*>(p.attn_sink);
  float factor[2], lse[2];
  bool empty[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head_lo + 8 * hr;
    const float l = quad_sum(l_run[hr]);
    empty[hr] = !(l > 0.0f);
    lse[hr] = m_run[hr] + fast_log2(l);  // base 2, in units of the true logits
    factor[hr] = empty[hr] ? 0.0f : 1.0f / l;
    if (!p.split && sink != nullptr && head < p.heads) {
      sparse_detail::sparse_fold_sink(sink[head], empty[hr], lse[hr], factor[hr]);
    } else if (empty[hr]) {
      lse[hr] = p.split ? kSparseEmptySplitLse : neg_inf();
    }
    if (q4 == 0) sts_f32(sbase + kFactorOff + (row_lo + 8 * hr) * 4, empty[hr] ? -1.0f : factor[hr]);
  }
  named_barrier_sync(kBarEpilogue, kConsumers);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head_lo + 8 * hr;
    // The same for the whole warp (H is a multiple of 8), but a branch on it would put the stores'
    // shuffles under divergent control flow: rows past H only skip their stores.
    const bool in_range = head < p.heads;
    const long long out_row = (long long)t * p.heads + head;
    if (in_range && q4 == 0) {
      if (p.split) static_cast<float*>(p.mid_lse)[out_row * p.split_stride + split] = lse[hr];
      else static_cast<float*>(p.out_lse)[out_row] = lse[hr] * p.lse_scale;
    }
    const bool live = in_range && !(p.split && empty[hr]);  // mid_out of an empty split is never read
    u16* dst = sparse_detail::sparse_out_row(p, out_row, split);
    const float f = factor[hr] * F::kNopeUndo;
#pragma unroll
    for (int j = 0; j < 32; j += 2)
      st_acc_row_pairs(dst, o, j, hr, q4, f, live);
  }
}

// WG1's epilogue without dealt slices: dims 256..511 of its rows, with WG0's factors.
template <class F>
__device__ __forceinline__ void wg1_write_rows(const SparseNvfp4Params& p, const float (&o_nope)[96], const float (&o_rope)[32], u32 sbase, int t,
                                               int split, int head_lo, int row_lo, int q4) {
  named_barrier_sync(kBarEpilogue, kConsumers);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head_lo + 8 * hr;
    float f = lds_f32(sbase + kFactorOff + (row_lo + 8 * hr) * 4);
    // Rows past H skip their stores, not the shuffles (as in wg0_write_rows).
    const bool live = head < p.heads && !(f < 0.0f && p.split);  // mid_out of an empty split is never read
    if (f < 0.0f) f = 0.0f;
    const long long out_row = (long long)t * p.heads + head;
    u16* dst = sparse_detail::sparse_out_row(p, out_row, split);
    const float fn = f * F::kNopeUndo;
#pragma unroll
    for (int j = 0; j < 24; j += 2)
      st_acc_row_pairs(dst + 256, o_nope, j, hr, q4, fn, live);
#pragma unroll
    for (int j = 0; j < 8; j += 2)
      st_acc_row_pairs(dst + 448, o_rope, j, hr, q4, f, live);
  }
}

// WG0's part of the dealt epilogue: its rows' (max, sum) published for every slice, the LSE
// written by slice 0, then its columns (dims 0..255) scaled, published and combined.
template <class F, int kGroups>
__device__ __forceinline__ void wg0_dealt_epilogue(const SparseNvfp4Params& p, const float (&o)[128], const float (&m_run)[2], const float (&l_run)[2],
                                                   u32 sbase, DealShape ds, int group, int t, int split, int head0, int row_lo, int tid, int q4) {
  named_barrier_sync(kBarEpilogue, kConsumers);  // both warpgroups are past their last tile read
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float l = quad_sum(l_run[hr]);
    if (q4 == 0) {
      sts_f32(sbase + kDealRowsOff + (row_lo + 8 * hr) * 8, m_run[hr]);
      sts_f32(sbase + kDealRowsOff + (row_lo + 8 * hr) * 8 + 4, l);
    }
  }
  cluster_sync();
  const DealtRows d = dealt_rows(p, sbase, row_lo, head0, ds, group, kGroups);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head0 + row_lo + 8 * hr;
    const long long out_row = (long long)t * p.heads + head;
    if (ds.slice == 0 && q4 == 0 && head < p.heads) {
      if (p.split) static_cast<float*>(p.mid_lse)[out_row * p.split_stride + split] = d.row[hr].lse;
      else static_cast<float*>(p.out_lse)[out_row] = d.row[hr].lse * p.lse_scale;
    }
  }
  const u32 units = sbase + kTileOff + u32(tid) * 16u;
#pragma unroll
  for (int j = 0; j < 32; ++j) dealt_publish(units + j * 4096u, o + 4 * j, d, F::kNopeUndo);
  cluster_sync();
  dealt_combine(p, d, units, ds, group, kGroups, false, t, split, head0 + row_lo, q4);
}

// WG1's part of the dealt epilogue: its columns (dims 256..511) scaled, published and combined.
template <class F, int kGroups>
__device__ __forceinline__ void wg1_dealt_epilogue(const SparseNvfp4Params& p, const float (&o_nope)[96], const float (&o_rope)[32], u32 sbase,
                                                   DealShape ds, int group, int t, int split, int head0, int row_lo, int tid, int q4) {
  named_barrier_sync(kBarEpilogue, kConsumers);
  cluster_sync();
  const DealtRows d = dealt_rows(p, sbase, row_lo, head0, ds, group, kGroups);
  const u32 units = sbase + kTileOff + u32(tid) * 16u;
#pragma unroll
  for (int j = 0; j < 24; ++j) dealt_publish(units + j * 4096u, o_nope + 4 * j, d, F::kNopeUndo);
#pragma unroll
  for (int j = 0; j < 8; ++j) dealt_publish(units + (24 + j) * 4096u, o_rope + 4 * j, d, 1.0f);
  cluster_sync();
  dealt_combine(p, d, units, ds, group, kGroups, true, t, split, head0 + row_lo, q4);
}

// The NVFP4 record format on this kernel: what the producer warpgroup does with each chunk (see the
// file comment), Q staging, and the tile's number formats (Nvfp4Format in sparse_nvfp4/kernel.cuh).
struct Nvfp4Sm90Format {
  static constexpr bool kF16Nope = true;
  static constexpr float kNopeUndo = sparse_detail::kKScaleUndo;
  static constexpr bool kDealtQ = true;  // dealt slices share Q's NVFP4 rounding (stage_q)
  static constexpr bool kWg1Decodes = false;  // the producer decodes every candidate
  static constexpr Regs kRegs = kNvfp4Regs;

  __device__ static __forceinline__ void stage_q(const SparseNvfp4Params& p, int t, int head0, u32 q_smem, int ctid, DealShape ds, u32 mine,
                                                 int group, int groups, u32 q_bar) {
    sparse_sm90::stage_q(p, t, head0, q_smem, ctid, ds, mine, group, groups, q_bar);
  }

  // H <= 64: this CTA gathers and decodes all 64 candidates of each chunk.
  template <bool kHasExtra>
  __device__ static __forceinline__ void produce_own(const SparseNvfp4Params& p, const sparse_detail::TokenWork& work, int t, int c_begin,
                                                     int n_iter, u32 sbase, int tid) {
    using namespace sparse_detail;
    const u32 bar_full = sbase + kBarOff, bar_empty = bar_full + 16;
    const int lane = tid & 31;
    const int ptid = tid - kConsumers, pw = ptid >> 5;
    // Decode role: warps 0-1 take record half 0, warps 2-3 half 1 (no divergence) of candidate `tok`.
    // Gather role: warp pw copies rows 16 pw .. 16 pw + 15 (gather_rows), so the raw stage is shared
    // by the warpgroup and kBarRaw separates its writes from the reads.
    const int half = pw >> 1, tok = 32 * (pw & 1) + lane;
    const u32 row = sbase + kRawOff + u32(tok) * kRawRow;
    // This half's 7 code units, 4 RoPE units and the scale words of its units.
    const u32 half_codes = row + 112u * half, half_rope = row + 224u + 64u * half, half_scales = row + kDataBytes + 12u * half;
    const u32 my_rows = sbase + kRawOff + u32(16 * pw) * kRawRow;
    const int my_slot = 16 * pw + (lane & 15);
    const bool scale_lane = lane >= 16;
    const u8* fallback = static_cast<const u8*>(p.kv);
    u64 addr = record_addr<kHasExtra>(p, work, c_begin, load_slot_index<kHasExtra>(p, work, t, c_begin, my_slot), scale_lane);
    SlotIndex next = n_iter > 1 ? load_slot_index<kHasExtra>(p, work, t, c_begin + 1, my_slot) : SlotIndex{0, false};
    u32 valid16 = __ballot_sync(0xffffffffu, addr != 0) & 0xffffu;
    gather_rows<16>(fallback, addr, my_rows, lane);
    cp_async_commit();
    for (int i = 0; i < n_iter; ++i) {
      const int b = i & 1;
      cp_async_wait<0>();
      named_barrier_sync(kBarRaw, kProducerThreads);  // every warp's copies of this chunk have landed
      U32x4 code[7], rope[4];
#pragma unroll
      for (int k = 0; k < 7; ++k) code[k] = lds128(half_codes + 16 * k);
#pragma unroll
      for (int k = 0; k < 4; ++k) rope[k] = lds128(half_rope + 16 * k);
      // Scale bytes 2u, 2u+1 of code unit u = 7 half + k sit in word u / 2 of the scale record:
      // words 3 half .. 3 half + 3 hold this half's 14 bytes, unit k's pair starts 16 (k + half)
      // bits into word k / 2.
      u32 sw[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) sw[k] = lds_u32(half_scales + 4 * k);
      const u32 valid_cur = valid16;
      named_barrier_sync(kBarRaw, kProducerThreads);  // the stage is read: the next chunk's copies may overwrite it
      // The next gather goes out before the wait for a free tile, so its latency overlaps the MMAs.
      if (i + 1 < n_iter) {
        addr = record_addr<kHasExtra>(p, work, c_begin + i + 1, next, scale_lane);
        valid16 = __ballot_sync(0xffffffffu, addr != 0) & 0xffffu;
        gather_rows<16>(fallback, addr, my_rows, lane);
        if (i + 2 < n_iter) next = load_slot_index<kHasExtra>(p, work, t, c_begin + i + 2, my_slot);
      }
      cp_async_commit();
      if (i >= 2) mbar_wait(bar_empty + 8 * b, u32(((i >> 1) & 1) ^ 1));
      const u32 tile = sbase + kTileOff + u32(b) * kTileBytes + u32(tok) * 16;
      const u32 half_tile = tile + u32(28 * half) * kDimGroupBytes;  // dims 224 half ..
#pragma unroll
      for (int k = 0; k < 4; ++k) sts128(tile + u32(kRopeGroup + 4 * half + k) * kDimGroupBytes, rope[k]);
#pragma unroll
      for (int k = 0; k < 7; ++k)
        decode_unit<false>(code[k], funnel_right(sw[k >> 1], sw[(k >> 1) + ((k >> 1) < 3)], 16u * u32((k & 1) + half)), half_tile, k, 0u, 0u);
      if (lane == 0) sts16(sbase + kMaskOff + 8 * b + 2 * pw, valid_cur);
      fence_proxy_async_smem();
      mbar_arrive(bar_full + 8 * b);
    }
  }

  // H > 64, a cluster pair: this CTA gathers and decodes half of each chunk's candidates into both
  // CTAs' tiles.
  template <bool kHasExtra>
  __device__ static __forceinline__ void produce_pair(const SparseNvfp4Params& p, const sparse_detail::TokenWork& work, int t, int c_begin,
                                                      int n_iter, u32 sbase, int tid, int group, u32 peer) {
    using namespace sparse_detail;
    const u32 bar_full = sbase + kBarOff, bar_empty = bar_full + 16;
    const int lane = tid & 31;
    // Shared decode (kCross): this CTA gathers and decodes candidates 32 group .. 32 group + 31 of
    // each chunk. Gather role: warp pw copies raw rows 8 pw .. 8 pw + 7 (gather_rows<8>). Decode
    // role: thread (warp pw, lane) takes part pw of raw row `lane`: code units first .. first +
    // n_units - 1 (4, 4, 3, 3 units) and RoPE units 2 pw, 2 pw + 1; the scale pair of unit u is
    // bytes 2 u, 2 u + 1 of the scale record, so the part's pairs sit in its words first / 2 ..
    // first / 2 + 2. Every decoded piece goes into this CTA's tile and the peer's.
    const int ptid = tid - kConsumers, pw = ptid >> 5;
    const int cand0 = 32 * group;
    const u32 my_rows = sbase + kRawOff + u32(8 * pw) * kRawRow;
    const int my_slot = cand0 + 8 * pw + (lane & 7);
    const bool scale_lane = lane >= 16;
    const int first = pw < 2 ? 4 * pw : 3 * pw + 2, n_units = pw < 2 ? 4 : 3;
    const u32 row = sbase + kRawOff + u32(lane) * kRawRow;
    const u32 col = u32(cand0 + lane) * 16;  // the candidate's column in a decoded tile
    const u8* fallback = static_cast<const u8*>(p.kv);
    // Each gather warp's 8 valid bits (bit r: its raw row r has a record) for the chunk it copies,
    // combined into one word for the tile mask, which the peer needs too.
    auto publish_valid = [&](u64 a) {
      const u32 bits = __ballot_sync(0xffffffffu, a != 0) & 0xffu;
      if (lane == 0) sts8(sbase + kValidOff + pw, bits);
    };
    u64 addr = record_addr<kHasExtra>(p, work, c_begin, load_slot_index<kHasExtra>(p, work, t, c_begin, my_slot), scale_lane);
    SlotIndex next = n_iter > 1 ? load_slot_index<kHasExtra>(p, work, t, c_begin + 1, my_slot) : SlotIndex{0, false};
    publish_valid(addr);
    gather_rows<8>(fallback, addr, my_rows, lane);
    cp_async_commit();
    for (int i = 0; i < n_iter; ++i) {
      const int b = i & 1;
      cp_async_wait<0>();
      named_barrier_sync(kBarRaw, kProducerThreads);  // every warp's copies (and valid bits) of this chunk have landed
      U32x4 code[4], rope[2];
      u32 sw[3];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (k < n_units) code[k] = lds128(row + 16u * (first + k));
      }
#pragma unroll
      for (int k = 0; k < 3; ++k) sw[k] = lds_u32(row + kDataBytes + 4u * ((first >> 1) + k));
#pragma unroll
      for (int k = 0; k < 2; ++k) rope[k] = lds128(row + 224u + 16u * (2 * pw + k));
      const u32 valid = ptid == 0 ? lds_u32(sbase + kValidOff) : 0u;
      named_barrier_sync(kBarRaw, kProducerThreads);  // the stage is read: the next chunk's copies may overwrite it
      // The next gather goes out before the wait for a free tile, so its latency overlaps the MMAs.
      if (i + 1 < n_iter) {
        addr = record_addr<kHasExtra>(p, work, c_begin + i + 1, next, scale_lane);
        publish_valid(addr);
        gather_rows<8>(fallback, addr, my_rows, lane);
        if (i + 2 < n_iter) next = load_slot_index<kHasExtra>(p, work, t, c_begin + i + 2, my_slot);
      }
      cp_async_commit();
      // Tile b is free once every consumer warp of both CTAs released it.
      if (i >= 2) mbar_wait(bar_empty + 8 * b, u32(((i >> 1) & 1) ^ 1));
      const u32 tile_col = sbase + kTileOff + u32(b) * kTileBytes + col;
      const u32 peer_bar = bar_full + 8 * b + peer;
#pragma unroll
      for (int k = 0; k < 2; ++k) put_tile16<true>(tile_col + u32(kRopeGroup + 2 * pw + k) * kDimGroupBytes, rope[k], peer, peer_bar);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        // Unit first + k's pair starts 16 (k + first % 2) bits into word first / 2 + k / 2 (k / 2 and
        // the shift, 0..32, keep the register index a constant).
        const u32 pair = funnel_right(sw[k >> 1], sw[(k >> 1) + 1], 16u * u32((k & 1) + (first & 1)));
        if (k < n_units) decode_unit<true>(code[k], pair, tile_col, first + k, peer, peer_bar);
      }
      if (ptid == 0) {
        const u32 mask = sbase + kMaskOff + 8 * b + 4 * group;
        sts32(mask, valid);
        st_async_32(mask + peer, valid, peer_bar);
      }
      fence_proxy_async_smem();
      // The full barrier's phase: 128 local arrivals and the peer's bytes.
      if (ptid == 0) mbar_arrive_expect_tx(bar_full + 8 * b, kPeerBytes);
      else mbar_arrive(bar_full + 8 * b);
    }
  }

  template <bool kHasExtra, bool kCross, bool kHalf>
  __device__ static __forceinline__ void produce(const SparseNvfp4Params& p, const sparse_detail::TokenWork& work, int t, int c_begin,
                                                 int n_iter, u32 sbase, int tid, int group, u32 peer) {
    static_assert(!kHalf, "WG1 never decodes for this format");
    if (n_iter <= 0) return;
    if constexpr (kCross) produce_pair<kHasExtra>(p, work, t, c_begin, n_iter, sbase, tid, group, peer);
    else produce_own<kHasExtra>(p, work, t, c_begin, n_iter, sbase, tid);
  }
};

}  // namespace sparse_sm90

// kGroups: the CTAs of a (token, split) that share its decode, 1 or 2 (a cluster pair, H > 64); H
// itself (p.heads, a multiple of 8, <= 128) is a run-time value. kUnpaired (kGroups 1, H > 64): each
// of the two head groups is a CTA of its own that decodes every candidate, the two in consecutive
// clusters of the grid. kHasExtra: a second pool shares the softmax. At run time p.split: write
// mid_out/mid_lse (merged by sparse_nvfp4_merge_kernel).
// Paired (kGroups 2), the two head groups of a (token, split) run as a cluster of two CTAs that share the
// decode: CTA r gathers and decodes candidates 32 r .. 32 r + 31 of every chunk and writes them into
// its own tile and, by st.async, into its peer's, so no candidate is decoded twice.
// A launch may deal a split's chunks to `deal` CTAs per head group (cluster of deal x groups CTAs,
// rank = slice * groups + group; the launch's cluster size sets deal): slice k takes chunks
// [k * ceil(cpb / deal), ...) of the split, and the slices' partial rows are combined in distributed
// shared memory in slice order (a fixed order: bitwise repeatable), as the mma.sync kernel does.
// F: the cache format (Nvfp4Sm90Format, or another family's), which owns the producer warpgroup's
// gather and decode, Q staging and the operands' number formats.
namespace sparse_sm90 {
// The registers WG1 fetches a chunk's half into when it decodes one (F::Wg1Raw), else nothing.
struct NoWg1Raw {};
template <class F, bool kWg1Decodes>
struct Wg1RawOf {
  using type = NoWg1Raw;
};
template <class F>
struct Wg1RawOf<F, true> {
  using type = typename F::Wg1Raw;
};

template <class F, int kGroups, bool kHasExtra, bool kUnpaired>
__device__ __forceinline__ void sparse_sm90_decode(const SparseNvfp4Params& p) {
  using namespace sparse_detail;
  static_assert(kGroups == 1 || kGroups == 2, "one head group, or a cluster pair of two");
  static_assert(!kUnpaired || kGroups == 1, "an unpaired launch runs one head group per CTA");
  static_assert(F::kRegs.wg0 + F::kRegs.wg1 + F::kRegs.producer == 3 * 168, "the warpgroups share the launch allocation");
  constexpr bool kCross = kGroups == 2;  // launched as clusters of two (sparse_sm90_cluster)
  // A CTA alone decoding a format's main chunks may split each chunk's decode between the producer
  // (candidates 0-31) and WG1 (32-63), which waits on WG0 for most of a chunk (F::wg1_fetch, wg1_decode).
  constexpr bool kWg1Decodes = F::kWg1Decodes && !kCross && !kHasExtra;

  pdl_launch_dependents();  // programmatic dependent launch: sparse_detail
  extern __shared__ __align__(1024) u8 smem[];
  const u32 sbase = smem_addr(smem);
  const u32 bar_full = sbase + kBarOff, bar_empty = bar_full + 16;  // + 8 * buffer
  // WG1 releases P and the alphas once it has them in registers; an mbarrier (not bar.arrive) so
  // the release orders WG1's reads before WG0's next writes for every tool that checks it.
  const u32 bar_p_free = bar_full + 32;
  // The other slices' shares of Q (stage_q).
  const u32 bar_q = bar_full + 40;

  const int tid = threadIdx.x;
  const int ncta = int(cluster_size()), crank = int(cluster_rank());
  const DealShape shape = deal_shape<kGroups>();
  const int group = crank % kGroups;  // the CTA's place in a pair
  constexpr int kHeadGroupsAlong = kUnpaired ? 2 : 1;  // head groups along the grid
  const CtaPlace at = cta_place(p, ncta, kHeadGroupsAlong);
  const int split = at.split, t = at.t;
  const int head0 = (kUnpaired ? int(cluster_id_x() & 1u) : group) * kSparseSm90Heads;
  // Shared addresses of the peer CTA are ours plus `peer` (one contiguous window per CTA).
  const u32 peer = kCross ? peer_addr(sbase, u32(crank ^ 1)) - sbase : 0u;

  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(bar_full + 8 * b, kWg1Decodes ? 256 : 128);  // the threads that decode a tile
      mbar_init(bar_empty + 8 * b, kCross ? 16 : 8);  // one arrival per consumer warp of each CTA
    }
    mbar_init(bar_p_free, 128);
    mbar_init(bar_q, 1);
    mbar_fence_init();
  }
  pdl_wait();  // the first read of an input
  const TokenWork work = token_work<kHasExtra>(p, t);
  const ChunkRange range = chunk_range(p, work, split, shape.slice, shape.deal);
  const int c_begin = range.begin, n_iter = range.count;
  // With kCross the peer arrives on and writes into this CTA's barriers and tiles, and dealt slices
  // write into each other's Q: all initialised.
  if (kCross || shape.deal > 1) cluster_sync();
  else __syncthreads();

  const int lane = tid & 31;
  if (tid >= kConsumers) {
    // ------------------------------ producer warpgroup ------------------------------
    setmaxnreg_dec<F::kRegs.producer>();
    F::template produce<kHasExtra, kCross, kWg1Decodes>(p, work, t, c_begin, n_iter, sbase, tid, group, peer);
    if (deal_shape<kGroups>().deal > 1) {  // the consumers' two publish barriers (dealt epilogue)
      cluster_sync();
      cluster_sync();
    }
  } else {
    // ------------------------------ consumer warpgroups ------------------------------
    // A tile's producers (with kCross both CTAs') have written it. The peer's st.asyncs are complete
    // and visible once the phase that counted their bytes completes (no cluster-scope acquire, which
    // would invalidate L1 on every wait); the fence orders them before this thread's wgmma reads.
    auto wait_tile = [&](int b, u32 parity) {
      mbar_wait(bar_full + 8 * b, parity);
      if constexpr (kCross) fence_proxy_async_smem();
    };
    // Called by a whole warp once its wgmmas reading tile b have retired.
    auto release_tile = [&](int b) {
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(bar_empty + 8 * b);
        if constexpr (kCross) mbar_arrive_remote(bar_empty + 8 * b + peer);
      }
    };
    const int wg = tid >> 7;
    const int wtid = tid & 127, w = wtid >> 5, g = lane >> 2, q4 = lane & 3;
    const u32 q_smem = sbase + kQOff;
    if (wg == 0) setmaxnreg_inc<F::kRegs.wg0>();
    else setmaxnreg_inc<F::kRegs.wg1>();
    stage_q_shared<F, kGroups>(p, t, head0, q_smem, tid, group, bar_q);

    const int row_lo = 16 * w + g;  // this thread's accumulator rows: row_lo and row_lo + 8

    if (wg == 0) {
      // ---- WG0: S = Q K^T, softmax, O[:, 0:256] ----
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.0f;
      float s[32];
      u32 pf[4][4];  // P of the chunk: the A operand of its P V
      float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.0f, 0.0f};
      const float scale_log2 = p.sm_scale_log2 * F::kNopeUndo;
      // Descriptors built once; a k-step or a tile is a constant added to the start-address field.
      const u64 dq = wgmma_desc_interleave(q_smem, kDimGroupBytes, 8 * kRowSlotBytes),
                dk0 = wgmma_desc_interleave(sbase + kTileOff, kDimGroupBytes, 8 * kRowSlotBytes),
                dv0 = wgmma_desc_interleave(sbase + kTileOff, 8 * kRowSlotBytes, kDimGroupBytes);

      for (int i = 0; i < n_iter; ++i) {
        const int b = i & 1;
        const u64 dk = wgmma_desc_advance(dk0, u32(b) * kTileBytes), dv = wgmma_desc_advance(dv0, u32(b) * kTileBytes);
        wait_tile(b, u32((i >> 1) & 1));
        // The tile mask is read by lane 0, the lane that later releases the tile, so the read and the
        // release are in one thread's order (racecheck does not carry __syncwarp's ordering to the
        // producer's rewrite of this word two chunks on). Read before S, shared after: off S's path.
        const u64 lane0_mask = lane == 0 ? lds64(sbase + kMaskOff + 8 * b) : 0ull;
        wg0_scores<F>(s, dq, dk);
        const u64 mask = shfl_u64(lane0_mask, 0);
        float alpha[2];
        wg0_softmax<F>(s, mask, scale_log2, q4, m_run, l_run, pf, alpha);
        if (rows_moved(alpha)) rescale_rows(o, alpha);
        publish_p(sbase, pf, alpha, i, bar_p_free, wtid, row_lo, q4);
        wg0_pv<F>(o, pf, dv);
        release_tile(b);
      }

      const CtaPlace end{t, cta_split(p, ncta, kHeadGroupsAlong)};
      if (const DealShape ds = deal_shape<kGroups>(); ds.deal > 1) {
        wg0_dealt_epilogue<F, kGroups>(p, o, m_run, l_run, sbase, ds, group, end.t, end.split, head0, row_lo, tid, q4);
      } else {
        // ---- epilogue: row sums, normalisation, sink; WG1 gets 1/l through shared memory ----
        wg0_write_rows<F>(p, o, m_run, l_run, sbase, end.t, end.split, head0 + row_lo, row_lo, q4);
      }
    } else {
      // ---- WG1: O[:, 256:448] (f16 P) and O[:, 448:512] (bf16 P) ----
      float o_nope[96], o_rope[32];
#pragma unroll
      for (int i = 0; i < 96; ++i) o_nope[i] = 0.0f;
#pragma unroll
      for (int i = 0; i < 32; ++i) o_rope[i] = 0.0f;
      const u64 dv0 = wgmma_desc_interleave(sbase + kTileOff, 8 * kRowSlotBytes, kDimGroupBytes);
      // With kWg1Decodes, WG1 decodes its half of chunk i + 2 into tile b once both warpgroups have
      // released b from chunk i, from records it fetched into registers a chunk earlier (the
      // producer decodes chunks 0 and 1 whole).
      [[maybe_unused]] typename Wg1RawOf<F, kWg1Decodes>::type raw;
      if constexpr (kWg1Decodes) {
        if (2 < n_iter) F::template wg1_fetch<kHasExtra>(p, work, t, c_begin + 2, wtid, raw);
      }
      for (int i = 0; i < n_iter; ++i) {
        const int b = i & 1;
        const u64 dv = wgmma_desc_advance(dv0, u32(b) * kTileBytes);
        u32 pf[4][4], pb[4][4];
        float alpha[2];
        take_p<F>(sbase, i, n_iter, bar_p_free, wtid, row_lo, pf, pb, alpha);
        if (rows_moved(alpha)) {
          rescale_rows(o_nope, alpha);
          rescale_rows(o_rope, alpha);
        }
        wait_tile(b, u32((i >> 1) & 1));
        wg1_pv<F>(o_nope, o_rope, pf, pb, dv);
        release_tile(b);
        if constexpr (kWg1Decodes) {
          if (i + 2 < n_iter) {
            mbar_wait(bar_empty + 8 * b, u32((((i + 2) >> 1) & 1) ^ 1));  // WG0 has released b too
            F::wg1_decode(raw, sbase, b, wtid);
            fence_proxy_async_smem();
            mbar_arrive(bar_full + 8 * b);
            if (i + 3 < n_iter) F::template wg1_fetch<kHasExtra>(p, work, t, c_begin + i + 3, wtid, raw);
          }
        }
      }
      const CtaPlace end{t, cta_split(p, ncta, kHeadGroupsAlong)};
      if (const DealShape ds = deal_shape<kGroups>(); ds.deal > 1) {
        wg1_dealt_epilogue<F, kGroups>(p, o_nope, o_rope, sbase, ds, group, end.t, end.split, head0, row_lo, tid, q4);
      } else {
        wg1_write_rows<F>(p, o_nope, o_rope, sbase, end.t, end.split, head0 + row_lo, row_lo, q4);
      }
    }
  }
  // The peer may still arrive on this CTA's barriers (releases of the last tiles), and a dealt
  // epilogue reads every slice's shared memory: no CTA of the cluster exits first.
  if (kCross || deal_shape<kGroups>().deal > 1) cluster_sync();
}
}  // namespace sparse_sm90

template <int kGroups, bool kHasExtra, bool kUnpaired = false>
__global__ void __launch_bounds__(kSparseSm90Threads, 1) sparse_nvfp4_sm90_kernel(const __grid_constant__ SparseNvfp4Params p) {
  sparse_sm90::sparse_sm90_decode<sparse_sm90::Nvfp4Sm90Format, kGroups, kHasExtra, kUnpaired>(p);
}

#endif  // __CUDACC__

}  // namespace kiln
