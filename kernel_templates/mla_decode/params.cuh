#pragma once
// Paged MLA decode: the launch parameter block and the tile/shared-memory geometry that the host
// planner and the device kernels must agree on. Included by g++ (host) and NVRTC (device), so it
// holds only plain scalars, pointers and constexpr arithmetic.

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
// Shared-memory row pitch in 16-bit elements: 16 B of padding moves each row by one 16-byte bank
// group, so ldmatrix over 8 consecutive rows is conflict-free without a swizzle.
constexpr int kMlaSmemPitch = kMlaDimQk + 8;
// Upper bound on KV splits of one request; workspace sizing depends on it, never on the SM count.
constexpr int kMlaMaxSplits = 64;

// Combine: one CTA per output row, one warp per 128-column slice of it. Spreading a row over four
// warps (not one) keeps a small batch's combine from being a few warps walking every split in turn.
constexpr int kMlaCombineThreads = 128;
constexpr int kMlaCombineRowsPerCta = 1;

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
  void* lse_partial;         // fp32 [B][max_rows][num_splits]; log2-domain LSE, -inf = empty split
  void* o_partial;           // fp32 [B][max_rows][num_splits][512]; normalised per split
  long long block_table_stride;  // elements between block-table rows
  int num_splits;            // 1 = decode kernel writes `out` directly, no combine launch
  float scale_log2;          // bmm1_scale * log2(e)
  float out_scale;           // bmm2_scale
};

// Planner choice baked into the kernel: rows per CTA = 16 * row_groups; warps split the 512 output
// columns into col_groups slices (and the tile's tokens, for Q*K^T, the same way).
struct MlaTileConfig {
  int row_groups;
  int col_groups;
  int tile_tokens;
  int stages;
};

KILN_MLA_HD constexpr int mla_max_rows(int heads, int max_seq_len_q) { return heads * max_seq_len_q; }

// Up to 16 rows: small CTAs, two per SM, so one CTA's barriers overlap the other's loads and MMAs.
// Larger row counts keep the 64-row tile that amortises K/V shared-memory reads over more MMA work.
KILN_MLA_HD constexpr MlaTileConfig mla_tile_config(int heads, int max_seq_len_q, bool fp8) {
  const int rows = mla_max_rows(heads, max_seq_len_q);
  if (rows <= 16) return MlaTileConfig{1, 4, 32, fp8 ? 4 : 2};  // ~100 KB: two CTAs per SM
  if (rows <= 32) return MlaTileConfig{2, 4, 32, fp8 ? 6 : 4};
  return MlaTileConfig{4, 2, 32, fp8 ? 4 : 3};
}

KILN_MLA_HD constexpr int mla_threads(MlaTileConfig c) { return 32 * c.row_groups * c.col_groups; }
KILN_MLA_HD constexpr int mla_tile_rows(MlaTileConfig c) { return 16 * c.row_groups; }

// Shared-memory carve-up (bytes), in this order: Q tile, KV stages, [fp8: converted f16 tile],
// P tile, row-max partials, row-sum partials. Every offset is a multiple of 16.
struct MlaSmemLayout {
  int q_offset;
  int stage_offset;
  int stage_bytes;
  int tile_offset;  // fp8: the f16 copy of the current stage; bf16: unused (== stage_offset)
  int p_offset;
  int p_pitch;      // 16-bit elements per P row
  int red_max_offset;
  int red_sum_offset;
  int total;
};

KILN_MLA_HD constexpr int mla_align16(int x) { return (x + 15) / 16 * 16; }

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
  // bf16 keeps P as hi + lo bf16 pairs (a single bf16 P misses the 1e-2 / 5e-4 tolerance on
  // peaked rows); fp8 runs on f16, whose P is accurate enough alone.
  end += rows * l.p_pitch * 2 * (fp8 ? 1 : 2);
  l.red_max_offset = mla_align16(end);
  end = l.red_max_offset + c.col_groups * rows * 4;
  l.red_sum_offset = end;
  end += c.col_groups * rows * 4;
  l.total = mla_align16(end);
  return l;
}

KILN_MLA_HD constexpr int mla_decode_smem_bytes(MlaTileConfig c, bool fp8) { return mla_smem_layout(c, fp8).total; }

}  // namespace kiln
