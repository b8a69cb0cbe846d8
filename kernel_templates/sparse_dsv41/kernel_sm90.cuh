#pragma once
// Sparse MLA decode over the DeepSeek-V4.1 cache, Hopper (sm_90a) warpgroup-MMA variant: the NVFP4
// family's sm90 body (sparse_nvfp4/kernel_sm90.cuh: 64 heads per CTA, two consumer warpgroups, a
// producer warpgroup, cluster pairs sharing the decode for H > 64) with this format's producer and Q.
// Q and every decoded row are exact bf16, so S, P and both P V halves are bf16 wgmmas.
//
// Producer: a chunk is gathered 32 records at a time into the raw stage (the NVFP4 stage holds 64
// 384-byte records, 32 528-byte ones fit it), so a CTA that decodes all 64 candidates (H <= 64) takes
// two gathers per chunk and a cluster pair's CTA (its 32 candidates) one. A CTA alone without the
// extra pool gathers only candidates 0-31 from chunk 2 on: WG1 fetches and decodes 32-63 itself
// (wg1_fetch, wg1_decode). The next gather is in flight while the previous one is decoded, and slot
// indices are loaded a gather ahead.
#include "sparse_dsv41/decode.cuh"
#include "sparse_dsv41/params.cuh"
#include "sparse_nvfp4/kernel_sm90.cuh"

namespace kiln {

#ifdef __CUDACC__
namespace dsv41 {

// Raw stage rows: record bytes, padded so that 8 consecutive rows' 16-byte accesses hit distinct
// banks (528 = 132 words already does; 288 = 72 words does not, 304 = 76 does).
__device__ __forceinline__ u32 raw_row_bytes(bool extra) { return extra ? 304u : 528u; }
static_assert(32u * 528u <= 64u * sparse_sm90::kRawRow, "a 32-record gather fits the raw stage");

struct Sm90Format {
  static constexpr bool kF16Nope = false;
  static constexpr float kNopeUndo = 1.0f;
  static constexpr bool kDealtQ = false;  // launched without dealt slices: each CTA stages its own Q
  static constexpr bool kWg1Decodes = true;  // a CTA alone: the producer decodes candidates 0-31, WG1 32-63
  // WG1's P is already bf16 (no second copy), so 8 of its registers go to the producer, which holds
  // a gather's 8 code units and the decode's peer addresses.
  static constexpr sparse_sm90::Regs kRegs{208, 200, 96};

  // Q rows head0 .. head0 + 63 as bf16 into the interleaved layout (dims 8g .. 8g + 7 of row r at
  // g * 1024 + r * 16); rows past H are zero. Consecutive threads take consecutive rows, so the
  // stores of a phase hit distinct banks; every load is issued before the first store.
  __device__ static __forceinline__ void stage_q(const SparseNvfp4Params& p, int t, int head0, u32 q_smem, int ctid, sparse_sm90::DealShape,
                                                 u32, int, int, u32) {
    constexpr int kPer = 64 * 64 / sparse_sm90::kConsumers;
    const int r = ctid & 63, head = head0 + r;
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.q) + ((long long)t * p.heads + head) * 512);
    uint4 v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = head < p.heads ? __ldg(q + (ctid >> 6) + 4 * k) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const u32 at = u32((ctid >> 6) + 4 * k) * sparse_sm90::kDimGroupBytes + u32(r) * sparse_sm90::kRowSlotBytes;
      sts128(q_smem + at, U32x4{v[k].x, v[k].y, v[k].z, v[k].w});
    }
  }

  // The global address of a slot's data row (scales = false) or scale row; 0 when masked.
  template <bool kHasExtra>
  __device__ static __forceinline__ u64 record_addr(const SparseNvfp4Params& p, const sparse_detail::TokenWork& w, int chunk,
                                                    sparse_sm90::SlotIndex si, bool scales) {
    if (!si.in_range || si.raw < 0) return 0;
    const bool in_main = !kHasExtra || chunk < w.main_chunks;
    const u8* base = static_cast<const u8*>(in_main ? p.kv : p.extra_kv);
    const long long page_stride = in_main ? p.kv_page_stride : p.extra_page_stride;
    const int page_size = in_main ? p.kv_page_size : p.extra_page_size;
    const int data = in_main ? kDsv41MainDataBytes : kDsv41ExtraDataBytes;
    const int scale = in_main ? kDsv41MainScaleBytes : kDsv41ExtraScaleBytes;
    const int page = si.raw / page_size;
    const int r = si.raw - page * page_size;
    const u8* page_base = base + (long long)page * page_stride;
    return reinterpret_cast<u64>(scales ? page_base + (long long)page_size * data + (long long)r * scale : page_base + (long long)r * data);
  }

  // One warp copies 8 records into raw rows `rows`, `stride` bytes apart: for each, lane l copies
  // data piece l and scale piece l where they exist (32 + 1 pieces main, 16 + 2 extra). Lane r < 8
  // holds record r's data address, lane 8 + r its scale address (0 when masked: zero-filled, which
  // decodes to zeros).
  __device__ static __forceinline__ void gather8(const u8* fallback, u64 addr, u32 rows, bool extra, int lane) {
    const u32 stride = raw_row_bytes(extra);
    const int data_pieces = extra ? kDsv41ExtraDataBytes / 16 : kDsv41MainDataBytes / 16;
    const int scale_pieces = extra ? kDsv41ExtraScaleBytes / 16 : kDsv41MainScaleBytes / 16;
    const u32 scale_at = extra ? u32(kDsv41ExtraDataBytes) : u32(kDsv41MainDataBytes);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const u64 d = shfl_u64(addr, k);
      const u64 s = shfl_u64(addr, 8 + k);
      const u32 row = rows + u32(k) * stride;
      cp_async_16_if(row + 16u * lane, d ? reinterpret_cast<const u8*>(d) + 16 * lane : fallback, d ? 16u : 0u,
                                  lane < data_pieces);
      cp_async_16_if(row + scale_at + 16u * lane, s ? reinterpret_cast<const u8*>(s) + 16 * lane : fallback, s ? 16u : 0u,
                                  lane < scale_pieces);
    }
  }

  // Quarter q of a 528-byte record (its code units q, q + 4, ..., with the record's four scale
  // words) decoded into the record's tile column `col`, and with kCross the peer CTA's too. The
  // producer and, for a CTA alone, WG1 both decode main records this way.
  template <bool kCross>
  __device__ static __forceinline__ void decode_main_quarter(const U32x4 (&code)[8], const u32 (&scw)[4], int q, u32 col, u32 peer,
                                                             u32 peer_bar) {
    using namespace sparse_sm90;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int u = q + 4 * k;  // dims 16u .. 16u + 15; scale byte u / 2 = 2k + q / 2
      u32 o[8];
      e4m3x16_to_bf16(code[k], ue8m0_to_bf16x2(scw[k >> 1], u32(2 * (k & 1) + (q >> 1))), o);
      put_tile16<kCross>(col + u32(2 * u) * kDimGroupBytes, U32x4{o[0], o[1], o[2], o[3]}, peer, peer_bar);
      put_tile16<kCross>(col + u32(2 * u + 1) * kDimGroupBytes, U32x4{o[4], o[5], o[6], o[7]}, peer, peer_bar);
    }
  }

  // WG1's half of a main chunk (candidates 32-63): thread (record 32 + dr, quarter q) of WG1, with
  // dr = 8 w + (lane & 7) and q = lane >> 3 as the producer's, holds code units q, q + 4, ..., the
  // record's scale row and whether the slot is valid.
  struct Wg1Raw {
    U32x4 code[8];
    U32x4 scales;
    bool valid;
  };

  template <bool kHasExtra>
  __device__ static __forceinline__ void wg1_fetch(const SparseNvfp4Params& p, const sparse_detail::TokenWork& work, int t, int chunk, int wtid,
                                                   Wg1Raw& r) {
    const int lane = wtid & 31, dr = 8 * (wtid >> 5) + (lane & 7), q = lane >> 3;
    const sparse_sm90::SlotIndex si = sparse_sm90::load_slot_index<kHasExtra>(p, work, t, chunk, 32 + dr);
    const u64 data = record_addr<kHasExtra>(p, work, chunk, si, false), scales = record_addr<kHasExtra>(p, work, chunk, si, true);
    r.valid = data != 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.code[k] = ldg128_if(reinterpret_cast<const u8*>(data) + 16 * (q + 4 * k), r.valid);
    r.scales = ldg128_if(reinterpret_cast<const u8*>(scales), r.valid);
  }

  // Decodes WG1's half into tile b (rows 32-63) and writes the tile mask's second word.
  __device__ static __forceinline__ void wg1_decode(const Wg1Raw& r, u32 sbase, int b, int wtid) {
    using namespace sparse_sm90;
    const int lane = wtid & 31, w = wtid >> 5, dr = 8 * w + (lane & 7), q = lane >> 3;
    const u32 col = sbase + kTileOff + u32(b) * kTileBytes + u32(32 + dr) * 16u;
    const u32 scw[4] = {r.scales.x, r.scales.y, r.scales.z, r.scales.w};
    decode_main_quarter<false>(r.code, scw, q, col, 0u, 0u);
    const u32 bits = __ballot_sync(0xffffffffu, r.valid) & 0xffu;  // lanes 0-7: this warp's 8 records
    if (lane == 0) sts8(sbase + kMaskOff + 8 * b + 4 + w, bits);
  }

  template <bool kHasExtra, bool kCross, bool kHalf>
  __device__ static __forceinline__ void produce(const SparseNvfp4Params& p, const sparse_detail::TokenWork& work, int t, int c_begin,
                                                 int n_iter, u32 sbase, int tid, int group, u32 peer) {
    using namespace sparse_sm90;
    if (n_iter <= 0) return;
    const u32 bar_full = sbase + kBarOff, bar_empty = bar_full + 16;
    const int lane = tid & 31, ptid = tid - kConsumers, pw = ptid >> 5;
    // 32-record gathers per chunk: 1 for a pair's CTA, else 2, but with kHalf (WG1 decodes
    // candidates 32-63 from chunk 2 on) 1 from chunk 2: chunks 0 and 1 are the producer's alone, so
    // that WG1's first fetches are not on the first S's path. Unit j is then (j / 2, j % 2) below 4.
    constexpr int kParts = kCross ? 1 : 2;
    const int n_units = kHalf ? (n_iter <= 2 ? 2 * n_iter : n_iter + 2) : n_iter * kParts;
    const auto chunk_index = [&](int j) { return kHalf && j >= 4 ? j - 2 : j / kParts; };
    const auto part_of = [&](int j) { return kHalf && j >= 4 ? 0 : j % kParts; };
    const int cand_base = kCross ? 32 * group : 0;
    const u8* fallback = static_cast<const u8*>(p.kv);
    const bool scale_lane = ((lane >> 3) & 1) != 0;
    const auto chunk_of = [&](int j) { return c_begin + chunk_index(j); };
    const auto is_extra = [&](int chunk) { return kHasExtra && chunk >= work.main_chunks; };
    // Gather role: warp pw copies rows 8 pw .. 8 pw + 7 of each 32-record gather.
    const auto slot_of = [&](int j) { return cand_base + 32 * part_of(j) + 8 * pw + (lane & 7); };
    const auto gather = [&](int j, u64 addr) {
      const bool extra = is_extra(chunk_of(j));
      const u32 bits = __ballot_sync(0xffffffffu, addr != 0) & 0xffu;  // lanes 0-7: the rows' data addresses
      if (lane == 0) sts8(sbase + kValidOff + pw, bits);
      gather8(fallback, addr, sbase + kRawOff + u32(8 * pw) * raw_row_bytes(extra), extra, lane);
    };
    // Decode role: thread (row dr, quarter q) of the gather takes code units q, q + 4, ...
    const int dr = 8 * pw + (lane & 7), q = lane >> 3;

    // A gather's read-out into registers once its copies have landed; the raw stage is free after it.
    struct Raw {
      U32x4 code[8];
      u32 scw[4];
      u32 valid;
    };
    const auto read_out = [&](bool extra) {
      Raw r;
      cp_async_wait<0>();
      named_barrier_sync(kBarRaw, kProducerThreads);  // every warp's copies (and valid bits) of this gather have landed
      const u32 row = sbase + kRawOff + u32(dr) * raw_row_bytes(extra);
      if (!extra) {
#pragma unroll
        for (int k = 0; k < 8; ++k) r.code[k] = lds128(row + 16u * u32(q + 4 * k));
        const U32x4 s = lds128(row + kDsv41MainDataBytes);
        r.scw[0] = s.x;
        r.scw[1] = s.y;
        r.scw[2] = s.z;
        r.scw[3] = s.w;
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          r.code[k] = lds128(row + 16u * u32(q + 4 * k));
          r.scw[k] = lds_u32(row + kDsv41ExtraDataBytes + 4u * u32(2 * k + (q >> 1)));
        }
      }
      r.valid = ptid == 0 ? lds_u32(sbase + kValidOff) : 0u;
      named_barrier_sync(kBarRaw, kProducerThreads);  // the stage is read: the next gather may overwrite it
      return r;
    };
    // Decodes a read-out gather (part `part` of chunk i) into its tile and, after the chunk's last
    // gather (with kHalf every gather: the barrier counts 256, two producer arrivals for chunks 0 and
    // 1, the producer's and WG1's from chunk 2), arrives on the tile's full barrier.
    const auto decode = [&](int i, int part, bool extra, const Raw& r) {
      const int b = i & 1;
      // Tile b is free once every consumer warp (of both CTAs of a pair) released it.
      if (part == 0 && i >= 2) mbar_wait(bar_empty + 8 * b, u32(((i >> 1) & 1) ^ 1));
      const u32 col = sbase + kTileOff + u32(b) * kTileBytes + u32(cand_base + 32 * part + dr) * 16u;
      const u32 peer_bar = bar_full + 8 * b + peer;
      if (!extra) {
        decode_main_quarter<kCross>(r.code, r.scw, q, col, peer, peer_bar);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int u = q + 4 * k;  // dims 32u .. 32u + 31; scale bytes 2u, 2u + 1
          const u32 words[4] = {r.code[k].x, r.code[k].y, r.code[k].z, r.code[k].w};
          u32 o[4][4];
          e2m1x32_to_bf16(words, u16(r.scw[k] >> (16 * (q & 1))), o);
#pragma unroll
          for (int wi = 0; wi < 4; ++wi) put_tile16<kCross>(col + u32(4 * u + wi) * kDimGroupBytes, U32x4{o[wi][0], o[wi][1], o[wi][2], o[wi][3]}, peer, peer_bar);
        }
      }
      if (ptid == 0) {
        const u32 mask = sbase + kMaskOff + 8 * b + 4 * (kCross ? group : part);
        sts32(mask, r.valid);
        if constexpr (kCross) st_async_32(mask + peer, r.valid, peer_bar);
      }
      if (kHalf || part == kParts - 1) {
        fence_proxy_async_smem();
        // The full barrier's phase: 128 local arrivals (and with a pair, the peer's bytes).
        if (kCross && ptid == 0) mbar_arrive_expect_tx(bar_full + 8 * b, kPeerBytes);
        else mbar_arrive(bar_full + 8 * b);
      }
    };

    if constexpr (kCross) {  // one gather per chunk: gather j is chunk j
      const auto load_index = [&](int i) { return i < n_iter ? load_slot_index<kHasExtra>(p, work, t, c_begin + i, slot_of(i)) : SlotIndex{0, false}; };
      const auto gather_chunk = [&](int i, SlotIndex si) { gather(i, record_addr<kHasExtra>(p, work, c_begin + i, si, scale_lane)); };
      gather_chunk(0, load_index(0));
      SlotIndex next = load_index(1);
      cp_async_commit();
      for (int i = 0; i < n_iter; ++i) {
        const bool extra = is_extra(c_begin + i);
        const Raw r = read_out(extra);
        if (i + 1 < n_iter) {
          gather_chunk(i + 1, next);
          next = load_index(i + 2);
        }
        cp_async_commit();
        decode(i, 0, extra, r);
      }
    } else {
      u64 addr = record_addr<kHasExtra>(p, work, chunk_of(0), load_slot_index<kHasExtra>(p, work, t, chunk_of(0), slot_of(0)), scale_lane);
      SlotIndex next = n_units > 1 ? load_slot_index<kHasExtra>(p, work, t, chunk_of(1), slot_of(1)) : SlotIndex{0, false};
      gather(0, addr);
      cp_async_commit();
      for (int j = 0; j < n_units; ++j) {
        const int i = chunk_index(j);
        const bool extra = is_extra(c_begin + i);
        const Raw r = read_out(extra);
        if (j + 1 < n_units) {
          addr = record_addr<kHasExtra>(p, work, chunk_of(j + 1), next, scale_lane);
          gather(j + 1, addr);
          if (j + 2 < n_units) next = load_slot_index<kHasExtra>(p, work, t, chunk_of(j + 2), slot_of(j + 2));
        }
        cp_async_commit();
        decode(i, part_of(j), extra, r);
      }
    }
  }
};

}  // namespace dsv41

// kGroups: the CTAs per (token, split), clusters of two for H > 64 (kUnpaired: one per head group,
// sparse_nvfp4/kernel_sm90.cuh); H itself (p.heads: 8, 16, 32, 48, ..., 128) is a run-time value. kHasExtra: an FP4 extra cache shares the softmax. At run time p.split: write
// mid_out/mid_lse.
template <int kGroups, bool kHasExtra, bool kUnpaired = false>
__global__ void __launch_bounds__(kSparseSm90Threads, 1) sparse_dsv41_sm90_kernel(const __grid_constant__ SparseNvfp4Params p) {
  sparse_sm90::sparse_sm90_decode<dsv41::Sm90Format, kGroups, kHasExtra, kUnpaired>(p);
}

#endif  // __CUDACC__

}  // namespace kiln
