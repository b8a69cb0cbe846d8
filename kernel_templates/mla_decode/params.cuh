#pragma once
// Paged MLA decode: the launch parameter block, the kernel variants and the tile/shared-memory
// geometry that the host planner and the device kernels must agree on. Included by g++ (host) and
// NVRTC (device), so it holds only plain scalars, pointers and constexpr arithmetic.

// The geometry helpers run on both sides; NVRTC treats unannotated functions as host-only.
#ifdef __CUDACC__
#define KILN_MLA_HD __host__ __device__
#else
#define KILN_MLA_HD
#endif

namespace kiln {

// Widths fixed by the contract (kv_lora_rank 512, qk_rope_head_dim 64).
constexpr int kMlaDimQk = 576;
constexpr int kMlaDimV = 512;
// Largest max_seq_len_q (query rows per request) the kernels take.
constexpr int kMlaMaxSeqLenQ = 64;
// Shared-memory row pitch (mma.sync kernel) in 16-bit elements: 16 B of padding moves each row by one
// 16-byte bank group, so ldmatrix over 8 consecutive rows is conflict-free without a swizzle.
constexpr int kMlaSmemPitch = kMlaDimQk + 8;

// ---- Scheduling (both kernels) ----
// The batch's KV work is cut into blocks of the kernel's KV tile (a pair of 64-token tiles on the
// seesaw). Request b costs a unit per block, ceil(L_b / block), then piece_cost more (no units when it
// has no query rows); the units of the whole batch, in request order, are split into num_parts equal
// contiguous ranges (at least ceil(max blocks / kMlaMaxPieces) units wide, and rounded up to whole
// largest requests when that adds at most kMlaAlignSlack units), one per CTA column of the grid. A
// part takes every block whose unit falls in its range. The charge, where used, moves a part's
// boundary by the set-up a piece costs besides its blocks. Splitting from the real lengths on the
// device keeps graph replays right when lengths change.
// On the wgmma kernels a piece's set-up (finding it, Q, the first tile's round trips, the epilogue's
// partial rows) takes about as long as streaming two blocks, so a part that holds a second piece is
// charged two blocks for it (NOTES.md, "A piece charged two blocks").
constexpr int kMlaPieceCostMma = 0;
constexpr int kMlaPieceCostWgmma = 2;
// Most pieces one request is cut into (bounds the combine's work per row).
constexpr int kMlaMaxPieces = 64;
// Units a part may grow by so that its width is a whole number of the largest request's units: with
// equal lengths no request is then split (a split costs a piece's set-up, partial rows and their
// combine). On the H200 grid this changes 12 configs per precision, at L 4096 and B >= 32 (NOTES.md).
constexpr int kMlaAlignSlack = 2;
// The smallest block of any variant: a request no longer than this is never split.
constexpr int kMlaMinBlockTokens = 32;

// Kernel choice carried in the policy ("kernel" field): auto lets the planner decide per arch;
// mma_sync forces the portable mma.sync kernel in the configuration that fits ~99 KB of shared memory
// (what sm_120 runs); wgmma forces the Hopper kernel (sm_90a); wgmma_kv forces the Hopper kernel that
// puts KV tokens on the MMA's M side (sm_90a, bf16 only; kernel_kv.cuh).
constexpr int kMlaKernelAuto = 0;
constexpr int kMlaKernelMmaSync = 1;
constexpr int kMlaKernelWgmma = 2;
constexpr int kMlaKernelWgmmaKv = 3;

// Precision of the softmax probabilities P in O += P V on bf16 pages ("precision" field). exact: P
// is carried as bf16 hi + lo (P - hi), two MMAs per V fragment, and meets the contract's 1e-2 / 5e-4
// tolerances on every input; bf16: one bf16 P rounded to nearest (the row sums l stay fp32, from the
// unrounded P), FlashMLA's numerics, one MMA per V fragment. fp8 pages always run on one f16 P.
constexpr int kMlaPrecisionExact = 0;
constexpr int kMlaPrecisionBf16 = 1;
// P as bf16 hi + lo: the exact precision on bf16 pages (the kernels' and the planner's one rule).
KILN_MLA_HD constexpr bool mla_split_p(bool fp8, int precision) { return !fp8 && precision == kMlaPrecisionExact; }

// Combine (combine.cuh): four warps per CTA, on one output row or (MlaDecodeParams::combine_row_warps
// 1) a row each; or eight warps per row where a request has many pieces.
constexpr int kMlaCombineThreads = 128;
constexpr int kMlaCombineWideThreads = 256;
constexpr int kMlaCombineRowsPerCta = kMlaCombineThreads / 32;  // with a warp per row

// Entry points, in KernelSource order: of an mla_decode module, and of its companion mla_combine module.
constexpr int kMlaDecodeEntry = 0;
constexpr int kMlaCombineEntry = 0;
constexpr int kMlaCombineWideEntry = 1;

// A driver tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned), declared here because NVRTC
// has no cuda.h. The host encodes it (cuTensorMapEncodeTiled) and copies it in.
struct alignas(64) MlaTensorMap {
  unsigned long long opaque[16];
};

// One launch of either kernel takes this block by value (__grid_constant__).
// Row index convention: within request b, row r = i * H + h (query position i, head h); the
// request's rows start at query token `tok0` = (packed ? qo_indptr[b] : b * SQ).
struct MlaDecodeParams {
  const void* q;             // bf16 or e4m3, [tokens][H][576]
  const void* kv;            // bf16 or e4m3, [pages][page_size][576]
  const void* block_tables;  // int32 [B][block_table_stride]
  const void* seq_lens;      // int32 [B]
  const void* qo_indptr;     // int32 [B + 1]; packed mode only
  void* out;                 // bf16 [tokens][H][512]
  void* lse_partial;         // fp32 [slots][max_rows]; log2-domain LSE of a piece, -inf = saw nothing
  void* o_partial;           // fp32 [slots][max_rows][512]; normalised per piece
  void* split_meta;          // int32 [B][2]: first part, number of pieces; null when no request can split
  long long block_table_stride;  // elements between block-table rows
  int batch;
  int heads;                 // H: the decode kernel takes it here, not as a template argument (mla_row_class)
  int max_seq_len_q;         // SQ: each request's query rows in fixed mode, their bound when packed
  unsigned heads_recip;      // mla_heads_recip(heads)
  bool causal;               // row i * H + h sees keys up to seq_len - q_len + i (mla_row_last)
  int num_parts;             // grid x; 1 = every request in one piece: `out` written directly
  int piece_cost;            // scheduling units charged per piece (see "Scheduling")
  float scale_log2;          // bmm1_scale * log2(e)
  float out_scale;           // bmm2_scale
  int combine_row_warps;     // kMlaCombineEntry's warps per output row: 4 (a CTA per row) or 1
  // The KV cache as a 3-D tensor {576 columns, page_size tokens, pages} with 64 x min(64, page_size)
  // boxes in the 128-byte swizzle; encoded only for kernels that load with TMA (mla_kv_tma_ctas).
  MlaTensorMap kv_map;
  int kv_pages;  // the map's page extent: a page coordinate this large reads zeros
};
// A piece of request b processed by part p writes its partial rows to slot b + p (unique: a part's
// requests follow the previous part's), so slots < batch + num_parts - 1.

// mma.sync kernel configuration: rows per CTA = 16 * row_groups; warps split the 512 output columns
// into col_groups slices (and the tile's tokens, for Q*K^T, the same way).
struct MlaTileConfig {
  int row_groups;
  int col_groups;
  int tile_tokens;
  int stages;
};

// What a (policy, arch) compiles to.
struct MlaVariant {
  bool wgmma;          // either wgmma kernel
  MlaTileConfig tile;  // mma.sync kernel only
  int kv_rows;         // > 0: the KV-on-M wgmma kernel, with this many query rows (its N) per CTA
  int kv_warpgroups;   // the KV-on-M kernel's warpgroups (mla_kv_warpgroups)
};

KILN_MLA_HD constexpr int mla_max_rows(int heads, int max_seq_len_q) { return heads * max_seq_len_q; }

// A row's query index, row / H, without an integer division (about 20 dependent instructions
// at run-time H, on the path to a piece's first load): (row * (floor(2^31 / H) + 1)) >> 31 is exact
// while row < 2^31 / H, and rows stay below 128 * 64 here.
KILN_MLA_HD constexpr unsigned mla_heads_recip(int heads) { return (1u << 31) / static_cast<unsigned>(heads) + 1u; }
KILN_MLA_HD constexpr int mla_query_of_row(int row, unsigned heads_recip) {
  return static_cast<int>((static_cast<unsigned long long>(row) * heads_recip) >> 31);
}

// The mma.sync kernel's configuration on every arch: 16 rows, two stages, ~100 KB (fits sm_120's ~99 KB
// per block; two CTAs per SM on sm_90a, so one CTA's barriers overlap the other's loads and MMAs).
KILN_MLA_HD constexpr MlaTileConfig mla_small_tile_config() { return MlaTileConfig{1, 4, 32, 2}; }

// The KV-on-M wgmma kernel serves bf16 row counts up to this on sm_90a, the heads-on-M wgmma kernel
// the larger ones (measured on the H200 over the bench grid: at H x SQ <= 32 1.01-1.37x the speed of
// the better of the other two at B >= 8 or L = 16k, 0.97-1.07x at B 1 with L <= 4096; at 64 rows,
// two row tiles each streaming the KV, 0.68-0.81x the wgmma kernel's from B x L >= 128k). fp8 keys
// take the heads-on-M kernel at every row count (measured: at 16 rows it ties or beats the 16-row
// mma.sync tile, whose compute warps widen e4m3 themselves, and from 32 rows it takes about half the
// time).
constexpr int kMlaKvMaxRows = 32;

// The KV-on-M kernel's query rows per CTA (the wgmma N): 16 or 32; more rows take more row tiles.
KILN_MLA_HD constexpr int mla_kv_rows(int heads, int max_seq_len_q) {
  return mla_max_rows(heads, max_seq_len_q) <= 16 ? 16 : 32;
}

// The KV-on-M kernel's warpgroups: two at 32 rows with P as hi + lo (`split_p`), each adding P V over
// half of V's column blocks with P^T as one B operand [hi; lo] of N = 64, so V is read once per step
// instead of twice (64 rows of O^T per block: one warpgroup could not hold all eight blocks); else one.
// Measured on the H200 (exact, 32 rows; three same-run A/Bs): the 32-row grid configs 1.008-1.014x,
// the long memory-bound ones 1.02-1.06x; with one P the second warpgroup has nothing to share and
// lost 0.7% there.
KILN_MLA_HD constexpr int mla_kv_warpgroups(int kv_rows, bool split_p) { return kv_rows == 32 && split_p ? 2 : 1; }

// `sm90a`: compiling for (or running on) sm_90a, the one target with wgmma and 227 KB per block.
// `split_p`: P as bf16 hi + lo (the exact precision on bf16 pages).
KILN_MLA_HD constexpr MlaVariant mla_variant(int kernel, int heads, int max_seq_len_q, bool fp8, bool split_p, bool sm90a) {
  const int kv_rows = mla_kv_rows(heads, max_seq_len_q);
  const MlaVariant kv{true, mla_small_tile_config(), kv_rows, mla_kv_warpgroups(kv_rows, split_p)};
  if (kernel == kMlaKernelWgmma) return MlaVariant{true, mla_small_tile_config(), 0, 0};
  if (kernel == kMlaKernelWgmmaKv) return kv;
  if (kernel == kMlaKernelMmaSync || !sm90a) return MlaVariant{false, mla_small_tile_config(), 0, 0};
  if (!fp8 && mla_max_rows(heads, max_seq_len_q) <= kMlaKvMaxRows) return kv;
  return MlaVariant{true, mla_small_tile_config(), 0, 0};
}

KILN_MLA_HD constexpr int mla_threads(MlaTileConfig c) { return 32 * c.row_groups * c.col_groups; }
KILN_MLA_HD constexpr int mla_tile_rows(MlaTileConfig c) { return 16 * c.row_groups; }

// Shared-memory carve-up of the mma.sync kernel (bytes), in this order: Q tile, KV stages, [fp8:
// converted f16 tile], P tile, row-max partials, row-sum partials, scheduler scratch. Every offset is
// a multiple of 16.
struct MlaSmemLayout {
  int q_offset;
  int stage_offset;
  int stage_bytes;
  int tile_offset;  // fp8: the f16 copy of the current stage; bf16: unused (== stage_offset)
  int p_offset;
  int p_pitch;      // 16-bit elements per P row
  int red_max_offset;
  int red_sum_offset;
  int sched_offset;
  int total;
};

KILN_MLA_HD constexpr int mla_align16(int x) { return (x + 15) / 16 * 16; }

// Scratch of the block-wide reductions and scan that find a part's range and first request: two
// 8-byte slots per warp (12 warps at most) and the two results.
constexpr int kMlaSchedScratchBytes = 8 * (2 * 12 + 2);

KILN_MLA_HD constexpr MlaSmemLayout mla_smem_layout(MlaTileConfig c, bool fp8) {
  MlaSmemLayout l{};
  const int rows = mla_tile_rows(c);
  l.q_offset = 0;
  l.stage_offset = rows * kMlaSmemPitch * 2;
  l.stage_bytes = fp8 ? c.tile_tokens * kMlaDimQk : c.tile_tokens * kMlaSmemPitch * 2;
  int end = l.stage_offset + c.stages * l.stage_bytes;
  l.tile_offset = fp8 ? end : l.stage_offset;
  if (fp8) end += c.tile_tokens * kMlaSmemPitch * 2;
  l.p_offset = end;
  l.p_pitch = c.tile_tokens + 8;
  // bf16 room for P as hi + lo (kMlaPrecisionExact; the one-P precision leaves the lo half unused),
  // fp8 runs on one f16 P.
  end += rows * l.p_pitch * 2 * (fp8 ? 1 : 2);
  l.red_max_offset = mla_align16(end);
  end = l.red_max_offset + c.col_groups * rows * 4;
  l.red_sum_offset = end;
  end += c.col_groups * rows * 4;
  l.sched_offset = mla_align16(end);
  end = l.sched_offset + kMlaSchedScratchBytes;
  l.total = mla_align16(end);
  return l;
}

// Named barriers of the wgmma kernels (id 0 is __syncthreads). Heads-on-M kernels: the piece
// boundary (every thread is done with the previous piece's shared memory), the two consumer
// warpgroups' row exchange through shared memory (the epilogue's row sums; in the fp8 kernel also
// each tile's row max and Q staged) and the fp8 kernel's P tile complete; the seesaw kernel's two
// meetings per tile pair (warpgroup 0's max and P published, then warpgroup 1's). The KV-on-M kernel
// is one warpgroup: one barrier for all of it.
constexpr int kMlaBarPiece = 1;
constexpr int kMlaBarRowExchange = 2;
constexpr int kMlaBarP = 3;
constexpr int kMlaBarSeesawM0 = 4;
constexpr int kMlaBarSeesawM1 = 5;
constexpr int kMlaKvBar = 1;

// ---- wgmma kernel (sm_90a) geometry ----
// Every wgmma operand is held in the 128-byte swizzle layout (common/wgmma.cuh) in blocks of 64 bf16
// columns: a row's (or token's) 64 columns are one 128-byte line and 64 lines one block. A k16 step
// is 32 bytes along the lines of a K-major operand and 16 lines of an MN-major one; a descriptor's
// stride between 8-line core groups is 8 lines.
constexpr int kMlaWgLineBytes = 128;
constexpr int kMlaWgBlockBytes = 64 * kMlaWgLineBytes;
constexpr int kMlaWgKStepBytes = 32;
constexpr int kMlaWgMnStepBytes = 16 * kMlaWgLineBytes;
constexpr int kMlaWgSbo = 8 * kMlaWgLineBytes;

// 64 query rows per CTA, KV tiles of 64 tokens, two consumer warpgroups (output columns 0-255 and
// 256-511). Shared memory, each tile a row of 64-column blocks:
//   Q (64 rows x 512 latent columns; the 64 RoPE columns live in registers), two KV stages
//   (64 tokens x 576), the P area (two 64 x 64 bf16 tiles: the seesaw kernel's P lo per stage with
//   the exact precision), row sum exchange, scheduler scratch, mbarriers, the seesaw kernel's max
//   exchange.
constexpr int kMlaWgRows = 64;
constexpr int kMlaWgTileTokens = 64;
constexpr int kMlaWgThreads = 256;
constexpr int kMlaWgQOffset = 0;
constexpr int kMlaWgQBytes = kMlaWgRows * kMlaDimV * 2;                 // 65536
constexpr int kMlaWgStageOffset = kMlaWgQOffset + kMlaWgQBytes;
constexpr int kMlaWgStageBytes = kMlaWgTileTokens * kMlaDimQk * 2;      // 73728
constexpr int kMlaWgRopeOffset = 8 * kMlaWgBlockBytes;                  // a stage's RoPE column block
constexpr int kMlaWgStages = 2;
constexpr int kMlaWgPOffset = kMlaWgStageOffset + kMlaWgStages * kMlaWgStageBytes;
constexpr int kMlaWgPBytes = kMlaWgRows * kMlaWgTileTokens * 2;          // 8192 per tile, two tiles
constexpr int kMlaWgRedOffset = kMlaWgPOffset + 2 * kMlaWgPBytes;
constexpr int kMlaWgRedBytes = 2 * kMlaWgRows * 4;                      // [warpgroup][row] fp32
constexpr int kMlaWgSchedOffset = kMlaWgRedOffset + kMlaWgRedBytes;
constexpr int kMlaWgBarOffset = kMlaWgSchedOffset + kMlaSchedScratchBytes;
// Q full, then a full barrier per stage (the seesaw kernel: a full and an empty barrier per stage
// part, two parts per stage, and one per warpgroup for its zeroing of stale rows); then the seesaw
// kernel's max exchange ([warpgroup][row] fp32).
constexpr int kMlaWgExchangeOffset = kMlaWgBarOffset + 8 * (1 + 4 * kMlaWgStages + 2);
constexpr int kMlaWgUsedBytes = kMlaWgExchangeOffset + 2 * kMlaWgRows * 4;
// + 1 KB: the kernel aligns its base to the 1024-byte swizzle atom itself.
constexpr int kMlaWgSmemBytes = kMlaWgUsedBytes + 1024;

// The seesaw kernel (bf16 pages, heads-on-M) loads KV with TMA where pages hold at least 16 tokens
// (a TMA box per page run). With fixed query lengths and an even number of row tiles the row tiles of
// a part run in clusters of two CTAs that share every KV tile: each CTA loads half of it, multicast
// into both, which halves the KV traffic from L2 (the limit at 128 rows and more: 82% of L2
// throughput on the H200 with each row tile loading its own copy); both CTAs then walk the same
// pieces and tiles. With a single row tile (64 rows or fewer) the CTA loads every box itself: on the
// H200 its 64-row grid configs ran 1.02-1.11x as fast as with cp.async, in both precisions (NOTES.md).
// Returns the CTAs that share a KV tile: 0 (no TMA: cp.async), 1 or 2.
KILN_MLA_HD constexpr int mla_kv_tma_ctas(MlaVariant v, bool fp8, int heads, int max_seq_len_q, bool packed, int page_size) {
  const int row_tiles = (mla_max_rows(heads, max_seq_len_q) + kMlaWgRows - 1) / kMlaWgRows;
  if (!v.wgmma || v.kv_rows != 0 || fp8 || page_size < 16) return 0;
  if (row_tiles == 1) return 1;
  return !packed && row_tiles % 2 == 0 ? 2 : 0;
}

// The decode kernel's machine code depends on H x SQ only through the variant and the TMA cluster
// (mla_variant, mla_kv_rows and mla_kv_tma_ctas: up to 16 or 32 rows, one 64-row tile, an even or an
// odd number of them), and not at all for e4m3 pages or the mma.sync kernel; H and SQ themselves are
// run-time values (MlaDecodeParams), used per piece and in the epilogue, never per tile. So the
// kernel is instantiated for the smallest row count of that class, and keys of one class (H 64 / SQ 2
// and H 128 / SQ 1, say) compile to one module.
KILN_MLA_HD constexpr int mla_row_class(int kernel, int heads, int max_seq_len_q, bool fp8) {
  const int rows = mla_max_rows(heads, max_seq_len_q);
  if (fp8 || kernel == kMlaKernelMmaSync) return kMlaWgRows;
  if (rows <= kMlaKvMaxRows) return mla_kv_rows(heads, max_seq_len_q);
  const int row_tiles = (rows + kMlaWgRows - 1) / kMlaWgRows;
  return row_tiles == 1 ? kMlaWgRows : (row_tiles % 2 == 0 ? 2 : 3) * kMlaWgRows;
}

// CTAs per cluster of the paired kernels (along grid y, the row tiles).
constexpr int kMlaKvTmaCluster = 2;

// ---- fp8 wgmma kernel (sm_90a) geometry ----
// The same 64 rows, 64-token tiles and consumer warpgroups, plus a third warpgroup that loads e4m3
// and widens it to f16. Shared memory, each tile 128-byte-swizzled in 9 column blocks of 64 f16 (8 KB
// per 64 rows): Q (64 rows x 576), two KV stages (64 tokens x 576), P (64 x 64 f16), row max / sum
// exchange, scheduler scratch, mbarriers (stage full x 2, stage empty x 2).
constexpr int kMlaWgFp8Threads = 384;
constexpr int kMlaWgFp8TileBytes = kMlaWgTileTokens * kMlaDimQk * 2;     // 73728: Q or one stage
constexpr int kMlaWgFp8QOffset = 0;
constexpr int kMlaWgFp8StageOffset = kMlaWgFp8QOffset + kMlaWgFp8TileBytes;
constexpr int kMlaWgFp8Stages = 2;
constexpr int kMlaWgFp8POffset = kMlaWgFp8StageOffset + kMlaWgFp8Stages * kMlaWgFp8TileBytes;
constexpr int kMlaWgFp8RedOffset = kMlaWgFp8POffset + kMlaWgPBytes;
constexpr int kMlaWgFp8SchedOffset = kMlaWgFp8RedOffset + kMlaWgRedBytes;
constexpr int kMlaWgFp8BarOffset = kMlaWgFp8SchedOffset + kMlaSchedScratchBytes;
constexpr int kMlaWgFp8UsedBytes = kMlaWgFp8BarOffset + 8 * 2 * kMlaWgFp8Stages;
constexpr int kMlaWgFp8SmemBytes = kMlaWgFp8UsedBytes + 1024;  // + the 1024-byte alignment, as above
static_assert(kMlaWgFp8SmemBytes <= 232448, "the fp8 wgmma kernel exceeds sm_90's 227 KB per block");

// ---- KV-on-M wgmma kernel (sm_90a) geometry ----
// kv_warpgroups warpgroups; N = kv_rows query rows (16 or 32) per CTA; KV tiles of 64 tokens (the
// wgmma M). Shared memory, every operand in the 128-byte swizzle layout: Q (9 column blocks of N rows
// x 128 B), two KV stages (64 tokens x 576), P^T hi and lo (N rows x 64 tokens each), the per-warp
// column max / sum exchange, the O factors of a tile (for a second warpgroup), scheduler scratch,
// mbarriers (Q full, stage full x 2).
constexpr int kMlaKvTileTokens = 64;
constexpr int kMlaKvThreads = 128;
constexpr int kMlaKvStages = 2;
struct MlaKvSmem {
  int q_offset, stage_offset, p_offset, p_bytes, red_offset, alpha_offset, sched_offset, bar_offset, total;
};
KILN_MLA_HD constexpr MlaKvSmem mla_kv_smem(int n) {
  MlaKvSmem l{};
  l.q_offset = 0;
  l.stage_offset = 9 * n * kMlaWgLineBytes;               // a multiple of 1024 for n = 16, 32
  l.p_offset = l.stage_offset + kMlaKvStages * kMlaWgStageBytes;
  l.p_bytes = n * kMlaWgLineBytes;                         // hi, then lo
  l.red_offset = l.p_offset + 2 * l.p_bytes;
  l.alpha_offset = l.red_offset + 4 * n * 4;               // [warp][column] fp32
  l.sched_offset = l.alpha_offset + n * 4;                 // [column] fp32
  l.bar_offset = l.sched_offset + kMlaSchedScratchBytes;
  l.total = l.bar_offset + 8 * (1 + kMlaKvStages) + 1024;  // + the kernel's own 1024-byte alignment
  return l;
}

KILN_MLA_HD constexpr int mla_variant_threads(MlaVariant v, bool fp8) {
  return v.kv_rows > 0 ? kMlaKvThreads * v.kv_warpgroups : v.wgmma ? (fp8 ? kMlaWgFp8Threads : kMlaWgThreads) : mla_threads(v.tile);
}
KILN_MLA_HD constexpr int mla_variant_rows(MlaVariant v) {
  return v.kv_rows > 0 ? v.kv_rows : v.wgmma ? kMlaWgRows : mla_tile_rows(v.tile);
}
KILN_MLA_HD constexpr int mla_variant_smem(MlaVariant v, bool fp8) {
  if (v.kv_rows > 0) return mla_kv_smem(v.kv_rows).total;
  return v.wgmma ? (fp8 ? kMlaWgFp8SmemBytes : kMlaWgSmemBytes) : mla_smem_layout(v.tile, fp8).total;
}

}  // namespace kiln
