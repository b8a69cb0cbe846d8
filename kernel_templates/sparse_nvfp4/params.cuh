#pragma once
// Launch parameters and launch geometry of the sparse NVFP4 MLA decode family. Included by host C++
// (g++) and by device code, so only plain scalars and pointers live here.

// constexpr helpers below are also evaluated in device code (no -default-device under NVRTC).
#ifdef __CUDACC__
#define KILN_SPARSE_HD __host__ __device__
#else
#define KILN_SPARSE_HD
#endif

namespace kiln {

// One struct by value (`const __grid_constant__`), filled by the host launcher.
struct SparseNvfp4Params {
  const void* q;  // [T, H, 512] bf16, contiguous

  // Main pool: page p starts at kv + p * kv_page_stride (bytes); token r of a page is described in
  // runtime/nvfp4_writer/README.md (352 data bytes at r*352, 32 scale bytes at page_size*352 + r*32).
  const void* kv;
  long long kv_page_stride;  // bytes, multiple of 16, >= kv_page_size * 384
  int kv_page_size;
  int topk;                         // slots per token row in `indices`
  const void* indices;              // int32, row t at indices + t * indices_row_stride
  long long indices_row_stride;     // elements
  const void* topk_length;          // int32 [>= T] or null (every slot active)

  // Extra pool (used only by has_extra instantiations); same format, its own page geometry.
  const void* extra_kv;
  long long extra_page_stride;
  int extra_page_size;
  int extra_topk;
  const void* extra_indices;
  long long extra_indices_row_stride;
  const void* extra_topk_length;  // int32 [>= T] or null

  const void* attn_sink;  // fp32 [>= H] natural-log logits, or null

  void* output;   // [T, H, 512] bf16
  void* out_lse;  // [T, H] fp32
  void* mid_out;  // [T, H, split_stride, 512] bf16 (split launches only)
  void* mid_lse;  // [T, H, split_stride] fp32, -1e30 marks a split that saw no candidate
  int split_stride;

  float sm_scale_log2;  // sm_scale * log2(e), folded on the host
  float lse_scale;      // multiplies the base-2 LSE written to out_lse
  int num_tokens;       // T
  int heads;            // H: a run-time value of every kernel (per CTA and per output row, never per chunk)
  int num_splits;
  int chunks_per_block;

  // The policy's split as a run-time flag, so that keys differing only in it share one kernel (one
  // compile, one cubin); it selects work once per CTA and in the epilogue, never in a chunk loop.
  bool split;  // num_splits > 1: write mid_out/mid_lse for the merge kernel instead of output/out_lse
  // The staged mma.sync configuration's gather (the planner's choice per launch, sparse_bulk_gather):
  // one bulk copy per record's data instead of 16-byte cp.asyncs. Read once per CTA.
  bool bulk_gather;
};

// ---- launch geometry shared by the host planner and the kernels ----
// Block: one consumer team (4 MMA warps) per 16-head tile, plus producer (gather/decode) warps:
// 4 with one tile (256 threads), 2 with two tiles (320 threads, so a team keeps ~200 registers).
constexpr int kSparseConsumerThreads = 128;  // one team
KILN_SPARSE_HD constexpr int sparse_producer_threads(int head_tiles) { return head_tiles == 1 ? 128 : 64; }
KILN_SPARSE_HD constexpr int sparse_block_threads(int head_tiles) {
  return head_tiles * kSparseConsumerThreads + sparse_producer_threads(head_tiles);
}
constexpr int kSparseChunk = 64;             // candidate slots per chunk
constexpr int kSparseMaxChunksPerBlock = 16;
constexpr int kSparseMaxCluster = 8;         // CTAs of one split (portable cluster size)
constexpr int kSparseHeadsPerTile = 16;
constexpr int kSparseMergeThreadsPerRow = 64;  // 8 dims each
constexpr int kSparseMergeMaxRowsPerBlock = 4;
constexpr float kSparseEmptySplitLse = -1e30f;

// Shared-memory carve-up (bytes). Decoded tiles: 64 rows x 1024 B (448 f16 + 64 bf16), two buffers.
// Raw staging: 64 rows of `stage_row` bytes, two stages (NVFP4: 416, its 384 B record padded so 8
// lanes of a phase hit distinct banks; a format's decode passes its own, Dsv41 528).
// The compact configuration (`small`, for GPUs with 99 KiB per block such as sm_120) keeps one
// decoded tile and no raw staging (its producers gather into registers), and one 16-head tile.
constexpr unsigned kSparseTileBytes = 64u * 1024u;
constexpr unsigned kSparseStageRowBytes = 416u;
KILN_SPARSE_HD constexpr int sparse_tile_buffers(bool small) { return small ? 1 : 2; }
KILN_SPARSE_HD constexpr unsigned sparse_smem_q_offset(bool small, unsigned stage_row = kSparseStageRowBytes) {
  return small ? kSparseTileBytes : 2u * kSparseTileBytes + 2u * 64u * stage_row;
}
KILN_SPARSE_HD constexpr unsigned sparse_smem_p_offset(int head_tiles, bool small, unsigned stage_row = kSparseStageRowBytes) {
  return sparse_smem_q_offset(small, stage_row) + unsigned(head_tiles) * 16u * 1024u;
}
KILN_SPARSE_HD constexpr unsigned sparse_smem_red_offset(int head_tiles, bool small, unsigned stage_row = kSparseStageRowBytes) {
  return sparse_smem_p_offset(head_tiles, small, stage_row) + 2u * unsigned(head_tiles) * 16u * 128u;
}
// red_max[2][4][32] + red_l[4][32] floats, then mask[2][4] u32.
KILN_SPARSE_HD constexpr unsigned sparse_smem_mask_offset(int head_tiles, bool small, unsigned stage_row = kSparseStageRowBytes) {
  return sparse_smem_red_offset(head_tiles, small, stage_row) + (2u * 4u * 32u + 4u * 32u) * 4u;
}
// Then per decoded tile buffer a "tile empty" mbarrier, then per buffer a "tile full" one, then (staged
// configuration) per raw stage a "records landed" one for bulk gathers.
KILN_SPARSE_HD constexpr unsigned sparse_smem_empty_offset(int head_tiles, bool small, unsigned stage_row = kSparseStageRowBytes) {
  return sparse_smem_mask_offset(head_tiles, small, stage_row) + 2u * 4u * 4u;
}
// Dynamic shared memory of one decode block: 206,416 B (head_tiles 1) or 226,896 B (head_tiles 2);
// 87,600 B in the compact configuration.
KILN_SPARSE_HD constexpr unsigned sparse_decode_smem_bytes(int head_tiles, bool small = false, unsigned stage_row = kSparseStageRowBytes) {
  return sparse_smem_empty_offset(head_tiles, small, stage_row) + 16u * unsigned(sparse_tile_buffers(small)) + (small ? 0u : 16u);
}
static_assert(sparse_decode_smem_bytes(1, true) <= 99u * 1024u, "the compact configuration must fit sm_120's 99 KiB");
KILN_SPARSE_HD constexpr int sparse_head_groups(int heads, int head_tiles) {
  return (heads + kSparseHeadsPerTile * head_tiles - 1) / (kSparseHeadsPerTile * head_tiles);
}
// grid.x of the decode kernel (1-D, so T is not limited to 65535).
KILN_SPARSE_HD constexpr long long sparse_decode_grid(int tokens, int heads, int head_tiles, int num_splits) {
  return (long long)tokens * sparse_head_groups(heads, head_tiles) * num_splits;
}
// A merge block's reads all go through one SM, so a call of few (token, head) rows gives each row a
// block of its own: at T = 1 a block of 4 rows reads 4 x splits x 1 KB (64 KB at 16 splits).
KILN_SPARSE_HD constexpr int sparse_merge_rows_per_block(int tokens, int heads) {
  return (long long)tokens * heads <= 128 ? 1 : kSparseMergeMaxRowsPerBlock;
}
KILN_SPARSE_HD constexpr long long sparse_merge_grid(int tokens, int heads) {
  const int rows = sparse_merge_rows_per_block(tokens, heads);
  return ((long long)tokens * heads + rows - 1) / rows;
}

// ---- the Hopper (sm_90a) warpgroup-MMA kernel (sparse_nvfp4/kernel_sm90.cuh) ----
// One CTA per (token, 64-head group, split): two consumer warpgroups and one producer warpgroup.
constexpr int kSparseSm90Threads = 384;
constexpr int kSparseSm90Heads = 64;
// Q (64 KiB) + two decoded K tiles (128 KiB) + a 64-record raw stage (25,600 B) + P (8 KiB) +
// per-row scalars, masks and mbarriers: 230,984 B (the sm_90 opt-in limit is 232,448).
KILN_SPARSE_HD constexpr unsigned sparse_sm90_smem_bytes() { return 230984u; }
KILN_SPARSE_HD constexpr int sparse_sm90_head_groups(int heads) { return (heads + kSparseSm90Heads - 1) / kSparseSm90Heads; }
// The two head groups of H > 64 share each chunk's decode as a cluster of two CTAs.
KILN_SPARSE_HD constexpr int sparse_sm90_cluster(int heads) { return sparse_sm90_head_groups(heads) == 2 ? 2 : 1; }
// A module for H > 64 holds the pair kernel (entry 0) and the one-group kernel, which an unpaired
// launch runs once per head group (entry 1).
constexpr int kSparseSm90UnpairedEntry = 1;
KILN_SPARSE_HD constexpr long long sparse_sm90_grid(int tokens, int heads, int num_splits) {
  return (long long)tokens * sparse_sm90_head_groups(heads) * num_splits;
}

}  // namespace kiln
