#pragma once
// Launch geometry of the sparse DeepSeek-V4.1 MLA decode family (528 B FP8 main cache, optional
// 288 B FP4 extra cache; runtime/sparse_dsv41/README.md). The launch parameters are the NVFP4 sparse
// family's SparseNvfp4Params (kv / extra_kv address the 528 B and 288 B caches), and a split plan is
// merged by that family's merge kernel: only the gather and the decode of a record differ.
#include "common/dsv41_format.cuh"  // record geometry (FOOTER layout)
#include "sparse_nvfp4/params.cuh"

namespace kiln {

// The portable kernel ("default" variant): mma.sync, one 16-head tile per CTA, 256 threads, fits
// sm_120's 99 KiB. Grid: sparse_decode_grid(T, H, 1, num_splits).
constexpr int kDsv41SmallThreads = 256;
// The Hopper kernel ("sm90" variant): warpgroup MMA, 64 heads per CTA, kSparseSm90Threads threads,
// grid sparse_sm90_grid(T, H, num_splits), clusters of sparse_sm90_cluster(H).
// Dynamic shared memory per CTA: the portable variant has the NVFP4 compact layout (87,600 B).
KILN_SPARSE_HD constexpr unsigned sparse_dsv41_small_smem_bytes() { return sparse_decode_smem_bytes(1, true); }
// Its staged body (sm_90a, SparseNvfp4Params::bulk_gather): the NVFP4 staged layout, one head tile,
// with raw stage rows of a record's data bytes then its scale bytes (a 528 B main record or a 288 B
// extra one), padded to 544 B: 544 = 32 mod 128, so the 8 lanes of a phase (4 candidates x 2
// halves) read distinct banks, where 528 would pair them.
constexpr unsigned kDsv41StageRowBytes = 544;
KILN_SPARSE_HD constexpr unsigned sparse_dsv41_staged_smem_bytes() { return sparse_decode_smem_bytes(1, false, kDsv41StageRowBytes); }
// The default variant's module holds the compact kernel (entry 0) and the staged one.
constexpr int kDsv41StagedEntry = 1;
// The Hopper variant has the NVFP4 sm90 layout (its raw stage holds 32 of these records).
KILN_SPARSE_HD constexpr unsigned sparse_dsv41_sm90_smem_bytes() { return sparse_sm90_smem_bytes(); }

}  // namespace kiln
