#pragma once
// NVFP4 cache writer: packs bf16 latent rows into the 384-byte format (pack), or scatters them into an
// existing cache through a slot mapping (append).
//
// Duplicate slots in an append: the lowest input row wins (upstream keeps the first occurrence too).
// Small appends find an earlier row with the same slot by scanning the slots before their own. Large
// ones claim, then write: claims leave, in each target slot's 4 padding bytes, row + 1 of the lowest
// row that targets it, and only that row writes, its record clearing the padding again. Without a
// workspace the claims are a kernel of their own and the writes a dependent kernel; with one, one
// kernel does both, its blocks meeting at a counter in the workspace. Zero padding (what every
// writer leaves) is a free slot: one CAS claims it. A claim trusts nothing else a slot's padding held
// before (a cache written by someone else, or never written): a non-zero word is taken as a claim of
// this launch only if it names a row of this batch that targets this slot, so stale words and
// garbage lose to any row.
#include "common/numeric.cuh"
#include "common/nvfp4_encode.cuh"
#include "common/nvfp4_format.cuh"
#include "nvfp4_writer/params.cuh"

namespace kiln {

#ifdef __CUDACC__

// Every writer kernel is launched as a programmatic dependent of the previous kernel on the stream:
// its blocks may start before that kernel finishes, and read nothing until it has (the wait). The
// trigger lets the next dependent start early in turn.
__device__ __forceinline__ void nvfp4_wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void nvfp4_let_next_kernel_start() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void nvfp4_fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Before the wait a kernel may only warm L2 (coherent for every SM) with the lines it will read:
// nothing reaches registers or L1 until the previous kernel's writes are visible. In a chain of
// writer calls this overlaps the next call's source reads with the current call's tail.
__device__ __forceinline__ void nvfp4_prefetch_row(const Nvfp4WriterParams& p, int row) {
  if (row >= kNvfp4PrefetchRows || row >= p.num_rows) return;
  const u16* src = static_cast<const u16*>(p.src) + row * p.src_row_stride;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 1024;" ::"l"(src) : "memory");
}

struct Nvfp4WriterRow {
  uint4 a, b;             // this lane's 16 source values (lanes 28..31: RoPE, copied as they are)
  u32 lo = 0, hi = 0;     // lanes 0..27: the group's E2M1 codes
  u32 scale = 0;          // lanes 0..27: the group's E4M3 scale
};

__device__ __forceinline__ Nvfp4WriterRow nvfp4_writer_load(const Nvfp4WriterParams& p, int row, int lane) {
  Nvfp4WriterRow r;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const u16*>(p.src) + row * p.src_row_stride);
  r.a = src[2 * lane];
  r.b = src[2 * lane + 1];
  return r;
}

__device__ __forceinline__ void nvfp4_writer_encode(Nvfp4WriterRow& r, int lane) {
  if (lane < kNvfp4Groups) r.scale = nvfp4_encode_group16(r.a, r.b, r.lo, r.hi);
}

// Slots reaching here are in [0, num_slots) and int32 (pack: the launcher caps the rows at 2^31 - 1).
template <int kPageSize>
__device__ __forceinline__ u8* nvfp4_page(const Nvfp4WriterParams& p, int slot) {
  return static_cast<u8*>(p.cache) + static_cast<long long>(static_cast<unsigned>(slot) / kPageSize) * p.page_stride;
}

template <int kPageSize>
__device__ __forceinline__ u8* nvfp4_scale_record(const Nvfp4WriterParams& p, int slot) {
  return nvfp4_page<kPageSize>(p, slot) + kPageSize * kNvfp4DataBytes + static_cast<unsigned>(slot) % kPageSize * kNvfp4ScaleBytes;
}

template <int kPageSize>
__device__ __forceinline__ void nvfp4_writer_store(const Nvfp4WriterParams& p, int slot, int lane, const Nvfp4WriterRow& r) {
  u8* data = nvfp4_page<kPageSize>(p, slot) + static_cast<unsigned>(slot) % kPageSize * kNvfp4DataBytes;
  u8* scales = nvfp4_scale_record<kPageSize>(p, slot);
  if (lane < kNvfp4Groups) {
    *reinterpret_cast<uint2*>(data + lane * 8) = make_uint2(r.lo, r.hi);
    scales[lane] = static_cast<u8>(r.scale);
  } else {
    uint4* rope = reinterpret_cast<uint4*>(data + kNvfp4CodeBytes + (lane - kNvfp4Groups) * 32);
    rope[0] = r.a;
    rope[1] = r.b;
    // The zero padding in one 4-byte store: append's owner word never shows a half-cleared value.
    if (lane == kNvfp4Groups) *reinterpret_cast<u32*>(scales + kNvfp4Groups) = 0u;
  }
}

// Row i -> slot i. Each warp loads its rows before encoding any, so their reads overlap.
template <int kPageSize>
__global__ void __launch_bounds__(kNvfp4WriterThreads) nvfp4_pack_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kNvfp4WarpsPerBlock + threadIdx.x / 32) * kNvfp4RowsPerWarp;
  if (lane < kNvfp4RowsPerWarp) nvfp4_prefetch_row(p, row0 + lane);
  nvfp4_wait_for_previous_kernel();
  nvfp4_let_next_kernel_start();
  Nvfp4WriterRow r[kNvfp4RowsPerWarp];
#pragma unroll
  for (int i = 0; i < kNvfp4RowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = nvfp4_writer_load(p, row0 + i, lane);
  }
#pragma unroll
  for (int i = 0; i < kNvfp4RowsPerWarp; ++i) {
    if (row0 + i >= p.num_rows) return;
    nvfp4_writer_encode(r[i], lane);
    nvfp4_writer_store<kPageSize>(p, row0 + i, lane, r[i]);
  }
}

// Appends of at most kNvfp4AppendScanRows rows: a row yields if an earlier row targets its slot.
// The block stages the slots up to its last row in shared memory once.
template <int kPageSize>
__global__ void __launch_bounds__(kNvfp4WriterThreads) nvfp4_append_scan_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  __shared__ int slots[kNvfp4AppendScanRows];
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kNvfp4WarpsPerBlock + threadIdx.x / 32;  // one row per warp
  if (lane == 0) nvfp4_prefetch_row(p, row);
  nvfp4_wait_for_previous_kernel();
  nvfp4_let_next_kernel_start();
  const bool live = row < p.num_rows;
  Nvfp4WriterRow r;
  if (live) r = nvfp4_writer_load(p, row, lane);  // in flight during the staging
  const int staged = min(p.num_rows, (blockIdx.x + 1) * kNvfp4WarpsPerBlock);
#pragma unroll
  for (int k = 0; k < kNvfp4AppendScanRows / kNvfp4WriterThreads; ++k) {
    const int j = k * kNvfp4WriterThreads + threadIdx.x;
    if (j < staged) slots[j] = p.slot_mapping[j];
  }
  __syncthreads();
  if (!live) return;
  const int slot = slots[row];
  if (slot < 0 || slot >= p.num_slots) return;
  bool earlier = false;
  for (int j = lane; j < row; j += 32) earlier |= slots[j] == slot;
  if (__any_sync(0xffffffffu, earlier)) return;
  nvfp4_writer_encode(r, lane);
  nvfp4_writer_store<kPageSize>(p, slot, lane, r);
}

// Claims `row`'s target slot for it (a no-op for rows past the batch and skipped slots): afterwards
// the slot's padding word names the lowest row claimed so far. Needs the whole warp.
template <int kPageSize>
__device__ __forceinline__ void nvfp4_claim_slot(const Nvfp4WriterParams& p, int row) {
  const int lane = threadIdx.x % 32;
  const int slot = row < p.num_rows ? p.slot_mapping[row] : -1;
  const bool valid = slot >= 0 && slot < p.num_slots;
  // Rows of this warp with the same slot: only the lowest (lowest lane) claims.
  const unsigned same = __match_any_sync(0xffffffffu, valid ? slot : -1 - lane);
  if (!valid || __ffs(same) - 1 != lane) return;
  unsigned* owner = reinterpret_cast<unsigned*>(nvfp4_scale_record<kPageSize>(p, slot) + kNvfp4Groups);
  const unsigned me = static_cast<unsigned>(row) + 1u;
  for (unsigned cur = atomicCAS(owner, 0u, me); cur != 0u;) {
    const bool claimed = cur - 1u < static_cast<unsigned>(p.num_rows) && p.slot_mapping[cur - 1u] == slot;
    if (claimed && cur <= me) return;
    const unsigned seen = atomicCAS(owner, cur, me);
    if (seen == cur) return;
    cur = seen;
  }
}

// Before the wait: the owner word `row` will probably claim. The slot read here (from L2, past L1)
// may still change before the wait, so it only picks a line to warm.
template <int kPageSize>
__device__ __forceinline__ void nvfp4_prefetch_owner(const Nvfp4WriterParams& p, int row) {
  if (row >= p.num_rows || row >= kNvfp4PrefetchRows) return;
  int guess;
  asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(guess) : "l"(p.slot_mapping + row));
  if (guess >= 0 && guess < p.num_slots) asm volatile("prefetch.global.L2 [%0];" ::"l"(nvfp4_scale_record<kPageSize>(p, guess)) : "memory");
}

// One thread per row: the lowest row of each target slot ends up in the slot's padding word.
template <int kPageSize>
__global__ void __launch_bounds__(kNvfp4ClaimThreads) nvfp4_append_claim_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  const int row = blockIdx.x * kNvfp4ClaimThreads + threadIdx.x;
  // (Warming the write kernel's rows here too delays this grid's completion, which the write kernel
  // waits for.)
  nvfp4_prefetch_owner<kPageSize>(p, row);
  // After the wait, so that the write kernel, starting now, reads inputs that are complete: it reads
  // and encodes its rows, then waits for this whole grid before it reads an owner word.
  nvfp4_wait_for_previous_kernel();
  nvfp4_let_next_kernel_start();
  nvfp4_claim_slot<kPageSize>(p, row);
}

// After the claims: the owner word of the slot of row row0 + lane (lanes below
// kNvfp4RowsPerWarp; 0 when skipped).
template <int kPageSize>
__device__ __forceinline__ unsigned nvfp4_read_owner(const Nvfp4WriterParams& p, int slot) {
  unsigned word = 0;
  if (slot >= 0) asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(word) : "l"(nvfp4_scale_record<kPageSize>(p, slot) + kNvfp4Groups) : "memory");
  return word;
}

// Only the rows whose slot's owner word names them store.
template <int kPageSize>
__device__ __forceinline__ void nvfp4_store_if_owner(const Nvfp4WriterParams& p, int row0, int slot, unsigned owner,
                                                     const Nvfp4WriterRow (&r)[kNvfp4RowsPerWarp]) {
  const int lane = threadIdx.x % 32;
  const unsigned write = __ballot_sync(0xffffffffu, slot >= 0 && owner == static_cast<unsigned>(row0 + lane) + 1u);
#pragma unroll
  for (int i = 0; i < kNvfp4RowsPerWarp; ++i) {
    const int s = __shfl_sync(0xffffffffu, slot, i);
    if ((write >> i) & 1u) nvfp4_writer_store<kPageSize>(p, s, lane, r[i]);
  }
}

// The target slot of row row0 + lane for lanes below kNvfp4RowsPerWarp; -1 when skipped.
__device__ __forceinline__ int nvfp4_warp_slots(const Nvfp4WriterParams& p, int row0) {
  const int lane = threadIdx.x % 32;
  if (lane >= kNvfp4RowsPerWarp || row0 + lane >= p.num_rows) return -1;
  const int s = p.slot_mapping[row0 + lane];
  return s >= 0 && s < p.num_slots ? s : -1;
}

template <int kPageSize>
__device__ __forceinline__ void nvfp4_load_rows(const Nvfp4WriterParams& p, int row0, Nvfp4WriterRow (&r)[kNvfp4RowsPerWarp]) {
#pragma unroll
  for (int i = 0; i < kNvfp4RowsPerWarp; ++i) {
    if (row0 + i < p.num_rows) r[i] = nvfp4_writer_load(p, row0 + i, threadIdx.x % 32);
  }
}

__device__ __forceinline__ void nvfp4_encode_live(int slot, Nvfp4WriterRow (&r)[kNvfp4RowsPerWarp]) {
  const unsigned live = __ballot_sync(0xffffffffu, slot >= 0);
#pragma unroll
  for (int i = 0; i < kNvfp4RowsPerWarp; ++i) {
    if ((live >> i) & 1u) nvfp4_writer_encode(r[i], threadIdx.x % 32);
  }
}

// After the claim kernel: only each slot's owner writes. Each warp loads and encodes its rows
// before it waits for the claims.
template <int kPageSize>
__global__ void __launch_bounds__(kNvfp4WriterThreads) nvfp4_append_write_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  nvfp4_let_next_kernel_start();
  const int row0 = (blockIdx.x * kNvfp4WarpsPerBlock + threadIdx.x / 32) * kNvfp4RowsPerWarp;
  const int slot = nvfp4_warp_slots(p, row0);
  Nvfp4WriterRow r[kNvfp4RowsPerWarp];
  nvfp4_load_rows<kPageSize>(p, row0, r);
  nvfp4_encode_live(slot, r);
  nvfp4_wait_for_previous_kernel();  // the claims
  nvfp4_store_if_owner<kPageSize>(p, row0, slot, nvfp4_read_owner<kPageSize>(p, slot), r);
}

// Draws claim items until they run out, claiming each (one thread per row): a block's last draw is
// always past the last item. Returns the base (see below). The whole block calls it.
template <int kPageSize>
__device__ __forceinline__ unsigned nvfp4_draw_and_claim(const Nvfp4WriterParams& p, unsigned items, unsigned long long* ticket, unsigned* finished,
                                                         unsigned long long& ticket_shared) {
  if (threadIdx.x == 0) ticket_shared = atomicAdd(ticket, 1ull);
  __syncthreads();
  unsigned long long t = ticket_shared;  // rewritten only after the next barrier
  const unsigned base = static_cast<unsigned>(t >> 32);
  for (;;) {
    const unsigned draw = static_cast<unsigned>(t);
    if (draw >= items) {
      if (threadIdx.x == 0 && draw == items + gridDim.x - 1) atomicExch(ticket, static_cast<unsigned long long>(base + items) << 32);
      return base;
    }
    nvfp4_claim_slot<kPageSize>(p, static_cast<int>(draw * kNvfp4FusedThreads) + threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
      nvfp4_fence_acq_rel_gpu();  // the block's claims before the count (a release pattern)
      atomicAdd(finished, 1u);
      ticket_shared = atomicAdd(ticket, 1ull);
    }
    __syncthreads();
    t = ticket_shared;
  }
}

// Large appends with a workspace: claim and write in one launch, with no assumption about which
// blocks run at the same time. Claim items (kNvfp4FusedThreads rows each, one thread per row) are
// handed out by a ticket counter that every block draws from until the items run out; a block
// waits for the claims only after all items were handed to blocks already running, which finish
// them without waiting on anything, so the wait always ends, even if the blocks ran one at a time.
// Blocks start mostly in index order, so the first `items` blocks draw (and claim) before they load
// their rows, keeping the claims ahead of the grid's loads in the memory queues; the others load
// first and draw while the loads are in flight. A block that finds the claims done reads its owner
// words before it encodes; one that does not waits for them after it encodes.
// The workspace carries two counters from call to call, so that no block has to find out that it is
// the last one out: a 64-bit ticket word (high half: claim items finished before this call, the base;
// low half: tickets drawn in this call) and the count of claim items ever finished. Each block draws
// exactly once past the last item, so the draw numbered items + blocks - 1 is the call's last; it
// sets the ticket word to (base + items, 0) for the next call (which touches it only after its wait
// for this grid). A zero-filled workspace is such a state (base 0, nothing finished).
template <int kPageSize>
__global__ void __launch_bounds__(kNvfp4FusedThreads) nvfp4_append_fused_kernel(const __grid_constant__ Nvfp4WriterParams p) {
  __shared__ unsigned long long ticket_shared;
  __shared__ unsigned done_shared;
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kNvfp4FusedWarps + threadIdx.x / 32) * kNvfp4RowsPerWarp;
  const unsigned items = static_cast<unsigned>((p.num_rows + kNvfp4FusedThreads - 1) / kNvfp4FusedThreads);
  unsigned long long* ticket = reinterpret_cast<unsigned long long*>(p.workspace + kNvfp4WorkspaceTicket);
  unsigned* finished = p.workspace + kNvfp4WorkspaceFinished;
  const bool claims_first = blockIdx.x < items;  // probably draws item blockIdx.x
  if (lane < kNvfp4RowsPerWarp) nvfp4_prefetch_row(p, row0 + lane);
  if (claims_first) nvfp4_prefetch_owner<kPageSize>(p, blockIdx.x * kNvfp4FusedThreads + threadIdx.x);
  nvfp4_wait_for_previous_kernel();
  nvfp4_let_next_kernel_start();
  unsigned base = 0;
  if (claims_first) base = nvfp4_draw_and_claim<kPageSize>(p, items, ticket, finished, ticket_shared);
  const int slot = nvfp4_warp_slots(p, row0);
  Nvfp4WriterRow r[kNvfp4RowsPerWarp];
  nvfp4_load_rows<kPageSize>(p, row0, r);
  if (!claims_first) base = nvfp4_draw_and_claim<kPageSize>(p, items, ticket, finished, ticket_shared);
  const unsigned target = base + items;
  if (threadIdx.x == 0) {
    unsigned seen;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(finished) : "memory");
    done_shared = static_cast<int>(seen - target) >= 0;
  }
  __syncthreads();
  const bool done = done_shared;
  unsigned owner = 0;
  if (done) owner = nvfp4_read_owner<kPageSize>(p, slot);  // in flight during the encode
  nvfp4_encode_live(slot, r);
  if (!done) {
    if (threadIdx.x == 0) {
      for (;;) {
        unsigned seen;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(finished) : "memory");
        if (static_cast<int>(seen - target) >= 0) break;
        __nanosleep(kNvfp4ClaimPollNs);
      }
    }
    __syncthreads();  // every claim of this launch is in: owner words are final
    owner = nvfp4_read_owner<kPageSize>(p, slot);
  }
  nvfp4_store_if_owner<kPageSize>(p, row0, slot, owner, r);
}

#endif  // __CUDACC__

}  // namespace kiln
