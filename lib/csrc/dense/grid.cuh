// Persistent kernels of the dense family at D = 256 .. 2048, multiples of 128 (bf16, sm_90):
// the grid design. persistent.cu gives it the widths the cluster design (persistent.cuh) does
// and the wide design (wide.cuh) do not take: 384, 640, 896, 1152 and 1408 .. 2048.
//
// W_h (up to 8 MiB of bf16) does not fit in one cluster, and at most 30 clusters of 4, 15 of 8
// or 7 of 16 CTAs fit on an H100 at once (measured occupancy), so this design uses no
// clusters: 4 D / 64 CTAs (128 at D = 2048), all resident (a cooperative launch guarantees
// it), hold W_h (forward) or W_h^T (backward) in registers for the whole sequence. CTA c owns
// the 64 rows [64 r, 64 r + 64) (r = c / 4) and the quarter q = c % 4 of the columns,
// [512 q, 512 q + 512), of W_h padded with zero columns to 2048: a 64 x 512 tile (32 registers
// a thread) whose column blocks of 64 are the state of row blocks 8q .. 8q + 7. Below
// D = 2048 the blocks at or beyond D / 64 do not exist: the warps that own them load no
// weights, fetch nothing and contribute a zero partial product (the number of row blocks is
// even, so a wgmma warpgroup's two blocks both exist or both do not). D = 2048 is compiled
// with D as a constant (kD), the other widths with D from the arguments (kD = 0). The tile is
// held in one of two ways:
//   - at 8 and 16 batch columns by 16 warps in a 2 x 8 grid as mma.sync A fragments, warp
//     (m, k) multiplying rows [32 m, + 32) by source block k: 8 partial products a row;
//   - at 32 and 64 columns by 4 warpgroups as the register operand of wgmma.m64n{32,64}k16,
//     warpgroup k multiplying all 64 rows by source blocks 2k and 2k + 1 (4 partial products
//     a row). The state slices in shared memory are read by wgmma directly: their layout (swz
//     below, 1024-byte aligned) is wgmma's K-major operand with 128-byte swizzle. mma.sync
//     reads each A fragment anew for every 8 columns, wgmma once for all of them (the
//     multiply took 1.3 us of a 6.3 us step on mma.sync at B = 64).
// A step crosses L2 twice:
//   1. fetch: the tile's columns are the state of row blocks 8q .. 8q + 7; warp (0, k) waits
//      until the four producers of block 8q + k have published it (a counter per block,
//      release/acquire at GPU scope) and bulk-copies it from its global slot into shared
//      memory, counted on an mbarrier; both warps of column group k multiply as soon as it
//      lands (mma.m16n8k16, fp32 accumulate).
//   2. partial sums: the CTA sums its 8 column groups and writes its 64 x bc fp32 partial
//      product to global memory, then counts it on its row block's partial counter.
//   3. reduce and epilogue: CTA (r, q) finishes rows [64 r + 16 q, + 16) of the step: it
//      waits for the four partials of row block r, adds them in the order q = 0..3 (the same
//      sum on every run), applies the epilogue functor (epilogues.cuh), writes its 16 rows
//      of the new state into row block r's slot and counts them on the block's counter, then
//      stores the step's outputs.
// Buffers: the slots and the partial sums are double-buffered by step parity. A CTA writes
// buffer s + 2 only after a chain through every CTA's step s + 1, which starts after every
// read of buffer s (each row block's state at s + 1 needs all four quarters of the state at
// s, hence every CTA's multiply of step s + 1, each of which follows that CTA's reads of
// step s). The counters only grow: the waits compare with 4 (s + 1); they are zeroed before
// each launch. B is at most 64 (8 n-tiles of 8 columns). The counters, slots and partial
// sums are laid out for 32 row blocks at every D.
// Per-step inputs of the CTA's 16 rows are staged three steps ahead with cp.async, as in the
// cluster design, and everything of the epilogue that needs no product is computed first.
// Kernels and launch helpers are templates over the epilogue; persistent.cu instantiates them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cluster.cuh"
#include "common/mma.cuh"
#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "dense/gate_args.cuh"

namespace elman {
namespace grid_design {
// Internal linkage: each module that compiles this (elman_dense, elman_dense_jitter, elman_dev)
// keeps its own kernels and plan caches. (With external linkage the function-local caches of
// the plan templates are unique symbols that the dynamic linker shares across modules: the
// jitter module then found the attributes set only on the other module's kernels.)
namespace {

constexpr int kDim = 2048;                        // the widest D (the layout of the workspace)
constexpr int kMinDim = 256;                      // the narrowest D of this design
constexpr int kRows = 64;                         // rows of a CTA's tile
constexpr int kQuarters = 4;                      // column quarters: CTAs per row block
constexpr int kCols = kDim / kQuarters;           // columns of a tile
constexpr int kBlocks = kDim / kRows;             // row blocks at D = 2048 (32)
constexpr int kCtas = kBlocks * kQuarters;        // CTAs at D = 2048 (128)
constexpr int kSources = kCols / kRows;           // row blocks whose state a tile reads (8)
constexpr int kSub = kRows / kQuarters;           // rows a CTA finishes (16)
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kKGroups = 8;                       // mma.sync: warps splitting the columns
constexpr int kMTiles = 2;                        // mma.sync: 16-row mma tiles per warp
constexpr int kSteps = kCols / kKGroups / 16;     // k-steps of one source block (4)
constexpr int kGroups = kWarps / 4;               // wgmma: warpgroups, two sources each
constexpr int kRedStride = kRows + 4;             // floats per (k-group, batch) row of partials
constexpr int kLead = 3;
constexpr int kStages = kLead + 1;
constexpr int kMaxBc = 64;
constexpr int kCounters = 2 * kBlocks;            // state counters, then partial counters
constexpr size_t kCounterBytes = 256;
static_assert(kSources == kKGroups, "one warp column group per source row block");
static_assert(kCounters * 4 <= int(kCounterBytes), "counters fit their region");

struct Args {
  int steps, batch;
  const __nv_bfloat16* w;
  const __nv_bfloat16* b;                 // bias [D] (zeros for none)
  const __nv_bfloat16* wx;
  const __nv_bfloat16* g0;                // the epilogue's first gate input
  const __nv_bfloat16* h0;
  __nv_bfloat16* out;
  __nv_bfloat16* h_all;
  const __nv_bfloat16* d_out;
  const __nv_bfloat16* d_hT;
  __nv_bfloat16* dv;
  __nv_bfloat16* dg0;                     // its gradient
  __nv_bfloat16* dh0;
  unsigned* counters;                    // [2][kBlocks]: state, partial
  __nv_bfloat16* slots;                  // [2][kBlocks][bc][64] (swizzled, see swz)
  float* partials;                       // [2][kBlocks][kQuarters][bc][64]
  long long* trace;                      // optional: per-step phase clocks of CTA 0
  int dim;                               // D (read by the kD = 0 kernels)
};
template <int kG>
using ArgsFor = GateArgs<Args, kG>;
template <class Epi>
using ArgsOf = EpiArgs<Args, Epi>;

// The trace of the cluster design (persistent.cuh), same layout: clock64 at six phase
// boundaries of each step (start, state slice 0 arrived, multiplied, partial sums of the
// four quarters in, epilogue done, published), then clock64 and %globaltimer at kernel
// start and end. Only the traced instantiation has the marks.
constexpr int kTracePhases = 6;
template <bool kTrace>
__device__ __forceinline__ void mark(const Args& p, int step, int phase) {
  trace_mark<kTrace>(p.trace, kTracePhases, step, phase);
}
template <bool kTrace>
__device__ __forceinline__ void stamp(const Args& p, int slot) {
  trace_stamp<kTrace>(p.trace, kTracePhases, p.steps, slot);
}

// A state slice is [batch column n][64 values]; value k of column n sits at k ^ 8 (n % 8),
// so that the mma B-fragment loads of the 8 columns of an n-tile hit 32 distinct banks.
__device__ __forceinline__ int swz(int n, int k) { return k ^ ((n & 7) << 3); }

__device__ __forceinline__ void count_release(unsigned* c) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(c) : "memory");
}
__device__ __forceinline__ void wait_count(const unsigned* c, unsigned target) {
  unsigned v;
  while (true) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
    if (v >= target) return;
    __nanosleep(20);
  }
}
// A bulk copy of `bytes` from global memory into this CTA's shared memory, counted on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}


// NT n-tiles of 8 batch columns; staged inputs: forward wx and the kGates gates, backward
// d_out, h (with kPrev also h_{t-1} and v) and the gates; kD: D = 2048, or 0 for D = p.dim.
template <int NT, int kGates, bool kBackward, bool kPrev = false, int kD = kDim>
struct Tile {
  static constexpr int kGateAt = kBackward ? (kPrev ? 4 : 2) : 1;  // first staged gate input
  static constexpr int kIn = kGateAt + kGates;
  static constexpr int kBc = NT * 8;
  static constexpr int kSlice = kBc * kRows;                  // one source's state slice
  static constexpr uint32_t kSliceBytes = kSlice * 2;
  static constexpr int kSubElems = kBc * kSub;                // the CTA's rows of a step
  static constexpr int kPerSub = (kSubElems + kThreads - 1) / kThreads;
  static constexpr int kPerPartial = kBc * kRows / kThreads;  // partial sums per thread
  static constexpr bool kWgmma = NT >= 4;
  static constexpr int kParts = kWgmma ? kGroups : kKGroups;  // partial products a row
  // Shared memory (from a 1024-byte aligned base: wgmma's swizzle atoms):
  // state[source][n][64] | red[part][n][kRedStride] | stage | mbar[source]
  static constexpr int kRedOffset = kSources * kSlice * 2;
  static constexpr int kStageOffset = kRedOffset + kParts * kBc * kRedStride * 4;
  static constexpr int kBarOffset = kStageOffset + kStages * kIn * kSubElems * 2;
  static constexpr int kSmem = kBarOffset + kSources * 8 + 1024;  // + alignment slack

  unsigned char* base;
  int r, q;
  // A fragments: mma.sync [m-tile][k-step]; wgmma [1][k-step of the group's two sources]
  uint32_t a[kWgmma ? 1 : kMTiles][kWgmma ? 2 * kSteps : kSteps][4];

  __device__ __nv_bfloat16* state() const { return reinterpret_cast<__nv_bfloat16*>(base); }
  __device__ float* red() const { return reinterpret_cast<float*>(base + kRedOffset); }
  __device__ __nv_bfloat16* stage() const {
    return reinterpret_cast<__nv_bfloat16*>(base + kStageOffset);
  }
  __device__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base + kBarOffset); }
  __device__ static int lane() { return int(threadIdx.x) & 31; }
  __device__ static int kgroup() { return (int(threadIdx.x) >> 5) % kKGroups; }
  __device__ static int mrow0() { return (int(threadIdx.x) >> 5) / kKGroups * kMTiles * 16; }
  __device__ static int group() { return int(threadIdx.x) >> 7; }            // wgmma
  __device__ static int grow0() { return ((int(threadIdx.x) >> 5) & 3) * 16; }  // wgmma
  __device__ int row0() const { return r * kRows; }
  template <class A>
  __device__ static int dim(const A& p) { return kD > 0 ? kD : p.dim; }
  // Whether row block `block` (a column block of the tiles) exists at width d.
  __device__ static bool present(int block, int d) { return kD == kDim || block * kRows < d; }
  __device__ int sub0() const { return r * kRows + q * kSub; }  // first row this CTA finishes

  __device__ explicit Tile(unsigned char* smem)
      : base(smem + ((1024u - (smem_u32(smem) & 1023u)) & 1023u)) {
    r = int(blockIdx.x) / kQuarters;
    q = int(blockIdx.x) % kQuarters;
    if (threadIdx.x == 0) {
      for (int i = 0; i < kSources; ++i) mbar_init(&bar()[i]);
      mbar_init_fence();
    }
  }

  __device__ void load_weights(const __nv_bfloat16* w, int d, bool transposed) {
    if constexpr (kWgmma) {
      if (present(q * kSources + 2 * group(), d))
        load_a(a, w, d, row0() + grow0(), q * kCols + group() * 2 * kRows, transposed);
    } else {
      if (present(q * kSources + kgroup(), d))
        load_a(a, w, d, row0() + mrow0(), q * kCols + kgroup() * (kCols / kKGroups), transposed);
    }
  }

  template <class A>
  __device__ static const __nv_bfloat16* source(const A& p, int k) {
    if (!kBackward) return k == 0 ? p.wx : gate_input<kGates>(p, k - 1);
    if constexpr (kPrev) {
      if (k == 2) return p.h_all;
      if (k == 3) return p.v_all;
    }
    return k == 0 ? p.d_out : k == 1 ? p.h_all + size_t(p.batch) * dim(p)
                                     : gate_input<kGates>(p, k - kGateAt);
  }
  // Stage step t of the inputs of this CTA's 16 rows into ring buffer i: [kIn][bc][16].
  template <class A>
  __device__ void stage_inputs(int i, const A& p, int t, bool skip) const {
    __nv_bfloat16* dst = stage() + (i % kStages) * kIn * kSubElems;
    constexpr int kChunks = kBc * 2;  // two 16-byte chunks per (column, 16 rows)
    for (int c = threadIdx.x; !skip && c < kIn * kChunks; c += kThreads) {
      const int tensor = c / kChunks, n = (c % kChunks) / 2, half = c % 2;
      if (n >= p.batch) continue;
      const __nv_bfloat16* g =
          source(p, tensor) + (size_t(t) * p.batch + n) * dim(p) + sub0() + half * 8;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                       smem_u32(dst + tensor * kSubElems + n * kSub + half * 8)),
                   "l"(g));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  __device__ static void wait_inputs() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kLead - 1) : "memory");
  }
  __device__ const __nv_bfloat16* inputs(int i) const {
    return stage() + (i % kStages) * kIn * kSubElems;
  }

  __device__ __nv_bfloat16* slot(const Args& p, int e, int block) const {
    return p.slots + (size_t(e & 1) * kBlocks + block) * kSlice;
  }
  __device__ float* partial(const Args& p, int m, int block, int quarter) const {
    return p.partials + ((size_t(m & 1) * kBlocks + block) * kQuarters + quarter) * kSlice;
  }

  // Fetch exchange e (the state slices of the 8 source blocks) into shared memory: lane 0 of
  // warp (0, k) waits for block 8q + k's counter and bulk-copies its slot. Called after a
  // block barrier that ended every read of the previous state.
  __device__ void fetch(const Args& p, int e) {
    if (threadIdx.x < kKGroups * 32 && lane() == 0 && present(q * kSources + kgroup(), dim(p))) {
      const int k = kgroup(), block = q * kSources + k;
      wait_count(&p.counters[block], unsigned(kQuarters * (e + 1)));
      jitter(e, 2);  // between the counter and the copy
      fence_async_global();  // the slot was written by generic stores; the copy is async
      mbar_expect(&bar()[k], kSliceBytes);
      bulk_load(state() + k * kSlice, slot(p, e, block), kSliceBytes, &bar()[k]);
    }
    __syncwarp();  // the mma below are warp-wide
  }

  // This warp's (wgmma: warpgroup's) partial product with the state (fetch number `e` >= 0,
  // or the prologue's state when e < 0), into red[part][n][row]; zero where its blocks do not
  // exist at width d.
  template <class Arrived>
  __device__ void multiply(int e, int d, Arrived arrived) {
    if constexpr (kWgmma)
      multiply_wgmma(e, d, arrived);
    else
      multiply_mma(e, d, arrived);
  }
  template <class Arrived>
  __device__ void multiply_mma(int e, int d, Arrived arrived) {
    const int g = lane() >> 2, qq = lane() & 3, k = kgroup();
    const bool on = present(q * kSources + k, d);
    if (e >= 0 && on) mbar_wait(&bar()[k], uint32_t(e & 1));
    jitter(e, 6 + k);  // between the arrival of a slice and its use
    arrived();
    const __nv_bfloat16* src = state() + k * kSlice;
    // n-tiles in groups of at most 4 (at 8 the accumulators of all would spill); with one
    // n-tile two alternating chains keep four mma in flight.
    constexpr int kGroup = NT > 4 ? 4 : NT;
    constexpr int kChains = NT == 1 ? 2 : 1;
    float* mine = red() + k * kBc * kRedStride;
#pragma unroll
    for (int n0 = 0; n0 < NT; n0 += kGroup) {
      float acc[kChains][kMTiles][kGroup][4] = {};
#pragma unroll
      for (int s = 0; s < kSteps && on; ++s) {
#pragma unroll
        for (int nt = 0; nt < kGroup; ++nt) {
          const int n = (n0 + nt) * 8 + g, kk = s * 16 + 2 * qq;
          const __nv_bfloat16* row = src + n * kRows;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row + swz(n, kk));
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + swz(n, kk + 8));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) mma(acc[s % kChains][mt][nt], a[mt][s], b0, b1);
        }
      }
      store_acc(acc, mine, kRedStride, mrow0(), n0 * 8);
    }
  }

  // The warpgroup's sources 2k and 2k + 1, one commit group each, issued after its wait (the
  // wait loops stay outside the runs of wgmma, so the compiler keeps them asynchronous).
  template <class Arrived>
  __device__ void multiply_wgmma(int e, int d, Arrived arrived) {
    const int g = lane() >> 2, qq = lane() & 3, k = group();
    float acc[NT * 4];
    if (present(q * kSources + 2 * k, d)) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int src = 2 * k + c;
        if (e >= 0) mbar_wait(&bar()[src], uint32_t(e & 1));
        jitter(e, 6 + src);
        if (c == 0) arrived();
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
          wgmma<NT>(acc, a[0][c * kSteps + s],
                    desc_sw128(smem_u32(state() + src * kSlice) + 32 * s), c + s > 0);
        wgmma_commit();
      }
      wgmma_wait_all();
      fence_operands(acc);
    } else {
#pragma unroll
      for (int i = 0; i < NT * 4; ++i) acc[i] = 0.f;
    }
    float* mine = red() + k * kBc * kRedStride;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int row = grow0() + g, col = nt * 8 + 2 * qq;
      mine[col * kRedStride + row] = acc[nt * 4 + 0];
      mine[(col + 1) * kRedStride + row] = acc[nt * 4 + 1];
      mine[col * kRedStride + row + 8] = acc[nt * 4 + 2];
      mine[(col + 1) * kRedStride + row + 8] = acc[nt * 4 + 3];
    }
  }

  // After the multiply (and a block barrier): this CTA's partial product of multiply m to
  // global memory, counted on row block r's partial counter; then wait for all four.
  __device__ void exchange_partials(const Args& p, int m) const {
    float* dst = partial(p, m, r, q);
#pragma unroll
    for (int i = 0; i < kPerPartial; ++i) {
      const int j = int(threadIdx.x) + i * kThreads, n = j / kRows, row = j % kRows;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kParts; ++k) s += red()[(k * kBc + n) * kRedStride + row];
      dst[j] = s;
    }
    jitter(m, 14);
    __syncthreads();
    if (threadIdx.x == 0) {  // the block barrier, then a release at GPU scope: every
      count_release(&p.counters[kBlocks + r]);  // thread's writes are visible before the count
      wait_count(&p.counters[kBlocks + r], unsigned(kQuarters * (m + 1)));
    }
    __syncthreads();
    jitter(m, 15);  // between the partials' counter and their reads
  }
  // Element i of this thread among the CTA's 16 rows: batch column j / 16, row j % 16.
  __device__ static int sub_j(int i) { return int(threadIdx.x) + i * kThreads; }
  __device__ float reduce(const Args& p, int m, int j) const {
    const int n = j / kSub, row = q * kSub + j % kSub;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kQuarters; ++k) s += __ldcg(partial(p, m, r, k) + n * kRows + row);
    return s;
  }
  // Row j % 16 of batch column j / 16 of the new state into row block r's slot for exchange e.
  __device__ void put(const Args& p, int e, int j, __nv_bfloat16 v) const {
    const int n = j / kSub;
    slot(p, e, r)[n * kRows + swz(n, q * kSub + j % kSub)] = v;
  }
  // Every thread's slot writes are in; publish them to the readers of row block r.
  __device__ void publish(const Args& p) const {
    fence_async_global();
    __syncthreads();
    if (threadIdx.x == 0) {
      count_release(&p.counters[r]);
    }
  }
  __device__ size_t offset(const Args& p, int j) const {  // of element j in a [B][D] plane
    return size_t(j / kSub) * dim(p) + sub0() + j % kSub;
  }
  __device__ bool live(const Args& p, int j) const {
    return j < kSubElems && j / kSub < p.batch;
  }
};

template <int NT, class Epi, bool kTrace, int kD>
__global__ void __launch_bounds__(kThreads, 1) grid_forward(ArgsOf<Epi> p) {
  using G = Tile<NT, Epi::kGates, false, false, kD>;
  constexpr bool kPrev = kReadsPrevOf<Epi>;
  extern __shared__ __align__(128) unsigned char smem[];
  G g(smem);
  stamp<kTrace>(p, 0);
  const int d = G::dim(p);
  const size_t BD = size_t(p.batch) * d;
  for (int i = 0; i < kLead; ++i) g.stage_inputs(i, p, i, i >= p.steps);
  g.load_weights(p.w, d, false);
  // The prologue's state: h0's columns of this quarter (zeros beyond D).
  for (int i = threadIdx.x; i < G::kBc * kCols; i += kThreads) {
    const int n = i / kCols, k = i % kCols;
    const __nv_bfloat16 v = n < p.batch && G::present(g.q * kSources + k / kRows, d)
                                ? p.h0[size_t(n) * d + g.q * kCols + k]
                                : __float2bfloat16_rn(0.f);
    g.state()[(k / kRows) * G::kSlice + n * kRows + swz(n, k % kRows)] = v;
  }
  float bias[G::kPerSub];
  float h_prev[kPrev ? G::kPerSub : 1];  // kPrev: this thread's h_{t-1}, fp32
#pragma unroll
  for (int i = 0; i < G::kPerSub; ++i) {
    const int j = G::sub_j(i);
    bias[i] = to_float(p.b[g.sub0() + j % kSub]);
    if (g.live(p, j)) p.h_all[g.offset(p, j)] = p.h0[g.offset(p, j)];
    if constexpr (kPrev) h_prev[i] = g.live(p, j) ? to_float(p.h0[g.offset(p, j)]) : 0.f;
  }
  fence_async_shared();  // h0 was written by threads; wgmma reads it through the async proxy
  G::wait_inputs();
  __syncthreads();

  for (int t = 0; t < p.steps; ++t) {
    const bool last = t + 1 == p.steps;
    mark<kTrace>(p, t, 0);
    jitter(t, 0);
    const __nv_bfloat16* in = g.inputs(t);
    float pre_v[G::kPerSub];
    typename Epi::Pre pre[G::kPerSub];
#pragma unroll
    for (int i = 0; i < G::kPerSub; ++i) {
      const int j = min(G::sub_j(i), G::kSubElems - 1);
      pre_v[i] = to_float(in[j]) + bias[i];
      Gates<Epi> gv;
#pragma unroll
      for (int k = 0; k < Epi::kGates; ++k) gv[k] = to_float(in[(1 + k) * G::kSubElems + j]);
      pre[i] = Epi::prepare(gv);
    }
    g.stage_inputs(t + kLead, p, t + kLead, t + kLead >= p.steps);
    jitter(t, 1);
    if (t > 0) g.fetch(p, t - 1);                // h_t is exchange t - 1 (h0: the prologue)
    g.multiply(t > 0 ? t - 1 : -1, d, [&] { mark<kTrace>(p, t, 1); });
    jitter(t, 3);
    __syncthreads();                             // partial sums of the 8 column groups
    mark<kTrace>(p, t, 2);
    g.exchange_partials(p, t);
    mark<kTrace>(p, t, 3);
    __nv_bfloat16 hb[G::kPerSub], ob[G::kPerSub], vb[kPrev ? G::kPerSub : 1];
#pragma unroll
    for (int i = 0; i < G::kPerSub; ++i) {
      const int j = G::sub_j(i);
      if (j >= G::kSubElems) continue;
      float h;
      if constexpr (kPrev) {
        const float v = Epi::act(g.reduce(p, t, j) + pre_v[i]);
        h = Epi::blend(v, h_prev[i], pre[i]);
        h_prev[i] = h;
        vb[i] = __float2bfloat16_rn(v);
      } else {
        h = Epi::act(g.reduce(p, t, j) + pre_v[i]);
      }
      hb[i] = __float2bfloat16_rn(h);
      ob[i] = __float2bfloat16_rn(Epi::output(h, pre[i]));
      if (!last) g.put(p, t, j, hb[i]);
    }
    mark<kTrace>(p, t, 4);
    jitter(t, 4);
    G::wait_inputs();                            // step t + 1's: the barrier below shows them
    if (!last) g.publish(p); else __syncthreads();
    jitter(t, 5);
    mark<kTrace>(p, t, 5);
#pragma unroll
    for (int i = 0; i < G::kPerSub; ++i) {
      const int j = G::sub_j(i);
      if (!g.live(p, j)) continue;
      p.out[t * BD + g.offset(p, j)] = ob[i];
      p.h_all[(t + 1) * BD + g.offset(p, j)] = hb[i];
      if constexpr (kPrev) p.v_all[t * BD + g.offset(p, j)] = vb[i];
    }
  }
  stamp<kTrace>(p, 1);
}

template <int NT, class Epi, int kD>
__global__ void __launch_bounds__(kThreads, 1) grid_backward(ArgsOf<Epi> p) {
  constexpr bool kPrev = kReadsPrevOf<Epi>;
  // staged: d_out_t, h_t, (h_{t-1}, v_t,) gates_t
  using G = Tile<NT, Epi::kGates, true, kPrev, kD>;
  constexpr int kG = Epi::kGates;
  extern __shared__ __align__(128) unsigned char smem[];
  G g(smem);
  const int d = G::dim(p);
  const size_t BD = size_t(p.batch) * d;
  const int T = p.steps;
  for (int i = 0; i < kLead; ++i) g.stage_inputs(i, p, T - 1 - i, i >= T);
  g.load_weights(p.w, d, true);
  G::wait_inputs();
  __syncthreads();
  float carry[kPrev ? G::kPerSub : 1] = {};  // kPrev: dh_{t+1} dh_{t+1}/dh_t of this element

  for (int u = 0; u < T; ++u) {  // u-th step from the end: t = T - 1 - u
    const int t = T - 1 - u;
    jitter(u, 0);
    const __nv_bfloat16* in = g.inputs(u);
    float pre_c[G::kPerSub], pre_f[G::kPerSub];
    __nv_bfloat16 dgb[kG > 0 ? kG : 1][G::kPerSub];
    float pre_q[kPrev ? kG : 1][kPrev ? G::kPerSub : 1], pre_a[kPrev ? G::kPerSub : 1];
#pragma unroll
    for (int i = 0; i < G::kPerSub; ++i) {
      const int j = min(G::sub_j(i), G::kSubElems - 1);
      const float d_out = to_float(in[j]), h = to_float(in[G::kSubElems + j]);
      Gates<Epi> gv, dg;
#pragma unroll
      for (int k = 0; k < kG; ++k) gv[k] = to_float(in[(G::kGateAt + k) * G::kSubElems + j]);
      if constexpr (kPrev) {  // the gate gradients need dh: dh q_k after the product
        typename Epi::Back b;
        Epi::backward_prev(d_out, h, to_float(in[2 * G::kSubElems + j]),
                           to_float(in[3 * G::kSubElems + j]), gv, b);
        pre_c[i] = b.c;
        pre_f[i] = b.f;
        pre_a[i] = b.a;
#pragma unroll
        for (int k = 0; k < kG; ++k) pre_q[k][i] = b.q[k];
      } else {
        Epi::backward_parts(d_out, h, gv, pre_c[i], pre_f[i], dg);
#pragma unroll
        for (int k = 0; k < kG; ++k) dgb[k][i] = __float2bfloat16_rn(dg[k]);
      }
    }
    g.stage_inputs(u + kLead, p, t - kLead, u + kLead >= T);
    jitter(u, 1);
    if (u > 0) {                                 // W_h^T dv_{t+1}: exchange u - 1
      g.fetch(p, u - 1);
      g.multiply(u - 1, d, [] {});
      jitter(u, 3);
      __syncthreads();
      g.exchange_partials(p, u - 1);
    }
    __nv_bfloat16 dvb[G::kPerSub];
#pragma unroll
    for (int i = 0; i < G::kPerSub; ++i) {
      const int j = G::sub_j(i);
      if (j >= G::kSubElems) continue;
      const float acc = u > 0 ? g.reduce(p, u - 1, j)
                              : (g.live(p, j) ? to_float(p.d_hT[g.offset(p, j)]) : 0.f);
      if constexpr (kPrev) {
        const float dh = acc + pre_c[i] + carry[i];
        dvb[i] = __float2bfloat16_rn(dh * pre_f[i]);
#pragma unroll
        for (int k = 0; k < kG; ++k) dgb[k][i] = __float2bfloat16_rn(dh * pre_q[k][i]);
        carry[i] = dh * pre_a[i];
      } else {
        dvb[i] = __float2bfloat16_rn((acc + pre_c[i]) * pre_f[i]);
      }
      g.put(p, u, j, dvb[i]);
    }
    jitter(u, 4);
    G::wait_inputs();
    g.publish(p);
    jitter(u, 5);
#pragma unroll
    for (int i = 0; i < G::kPerSub; ++i) {
      const int j = G::sub_j(i);
      if (!g.live(p, j)) continue;
      p.dv[t * BD + g.offset(p, j)] = dvb[i];
#pragma unroll
      for (int k = 0; k < kG; ++k) gate_grad<kG>(p, k)[t * BD + g.offset(p, j)] = dgb[k][i];
    }
  }
  // dh0 = W_h^T dv_0: exchange T - 1, multiply T - 1.
  g.fetch(p, T - 1);
  g.multiply(T - 1, d, [] {});
  __syncthreads();
  g.exchange_partials(p, T - 1);
#pragma unroll
  for (int i = 0; i < G::kPerSub; ++i) {
    const int j = G::sub_j(i);
    if constexpr (kPrev) {
      if (g.live(p, j)) p.dh0[g.offset(p, j)] = __float2bfloat16_rn(g.reduce(p, T - 1, j) + carry[i]);
    } else {
      if (g.live(p, j)) p.dh0[g.offset(p, j)] = __float2bfloat16_rn(g.reduce(p, T - 1, j));
    }
  }
}

// ---- planning and launch (templates over the epilogue) ---------------------------------
template <class Epi>
using KernelPtr = void (*)(ArgsOf<Epi>);

// The kernel of D = 2048 (kD = kDim) or of the narrower widths (kD = 0).
template <class Epi, int kD>
KernelPtr<Epi> pick_width(int nt, bool backward, bool trace) {
#ifdef ELMAN_TRACE  // the traced forward exists in the development build only
#define ELMAN_FORWARD(NT) \
  trace ? grid_forward<NT, Epi, true, kD> : grid_forward<NT, Epi, false, kD>
#else
#define ELMAN_FORWARD(NT) trace ? nullptr : grid_forward<NT, Epi, false, kD>
#endif
#define ELMAN_CASE(NT) \
  case NT:             \
    return backward ? grid_backward<NT, Epi, kD> : ELMAN_FORWARD(NT);
  switch (nt) {
    ELMAN_CASE(1) ELMAN_CASE(2) ELMAN_CASE(4) ELMAN_CASE(8)
    default: return nullptr;
  }
#undef ELMAN_CASE
#undef ELMAN_FORWARD
}
template <class Epi>
KernelPtr<Epi> pick(int dim, int nt, bool backward, bool trace = false) {
  return dim == kDim ? pick_width<Epi, kDim>(nt, backward, trace)
                     : pick_width<Epi, 0>(nt, backward, trace);
}
inline int ctas_for(int dim) { return dim / kRows * kQuarters; }
template <int kGates, bool kPrev = false>
int smem_for(int nt, bool backward) {
  switch (nt) {
    case 1: return backward ? Tile<1, kGates, true, kPrev>::kSmem : Tile<1, kGates, false>::kSmem;
    case 2: return backward ? Tile<2, kGates, true, kPrev>::kSmem : Tile<2, kGates, false>::kSmem;
    case 4: return backward ? Tile<4, kGates, true, kPrev>::kSmem : Tile<4, kGates, false>::kSmem;
    default: return backward ? Tile<8, kGates, true, kPrev>::kSmem : Tile<8, kGates, false>::kSmem;
  }
}
inline int tiles_for(int batch) {  // n-tiles of 8 batch columns per launch: 1, 2, 4 or 8
  int nt = 1;
  while (nt < kMaxBc / 8 && nt * 8 < batch) nt *= 2;
  return nt;
}

// Workspace: counters | slots | partials.
inline size_t slot_bytes(int bc) { return size_t(2) * kBlocks * bc * kRows * 2; }
inline size_t partial_bytes(int bc) { return size_t(2) * kCtas * bc * kRows * 4; }

template <class Epi>
cudaError_t launch(const PersistentPlan& plan, bool backward, cudaStream_t stream,
                   ArgsOf<Epi> a,
                   void* xchg) {
  KernelPtr<Epi> k = pick<Epi>(a.dim, plan.bc / 8, backward, a.trace != nullptr);
  if (k == nullptr) return cudaErrorInvalidValue;  // a trace asked of a build without it
  if (a.trace != nullptr) {  // the plan set the attribute of the untraced kernel only
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem);
    if (e != cudaSuccess) return e;
  }
  unsigned char* ws = static_cast<unsigned char*>(xchg);
  a.counters = reinterpret_cast<unsigned*>(ws);
  a.slots = reinterpret_cast<__nv_bfloat16*>(ws + kCounterBytes);
  a.partials = reinterpret_cast<float*>(ws + kCounterBytes + slot_bytes(plan.bc));
  cudaError_t e = cudaMemsetAsync(a.counters, 0, kCounterBytes, stream);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(plan.clusters);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = plan.smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeCooperative;  // every CTA resident, or an error
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, k, a);
  return e == cudaSuccess ? cudaGetLastError() : e;
}

// The grid design's plan for epilogue Epi (D = 256 .. 2048, multiples of 128).
template <class Epi>
PersistentPlan make_plan(int batch, int dim, bool backward) {
  PersistentPlan plan;
  plan.design = "grid";
  if (dim % 128 != 0 || dim < kMinDim || dim > kDim) {
    plan.reason = "D must be a multiple of 128 from 256 to 2048";
    return plan;
  }
  if (batch < 1) { plan.reason = "B must be at least 1"; return plan; }
  if (batch > kMaxBc) {  // measured: two launches of 64 columns at B = 70 took 14.3 us a
    // step, the per-step path 7.7
    plan.reason = "at D other than 256, 512, 768, 1024, 1280 (the grid design) B must be <= 64; "
                  "beyond, the per-step path is faster";
    return plan;
  }
  int dev = 0;
  cudaGetDevice(&dev);
  const int nt = tiles_for(batch);
  const int smem = smem_for<Epi::kGates, kReadsPrevOf<Epi>>(nt, backward);
  // CTAs of this kernel the GPU holds at once, per device (and kD: each kernel gets its
  // shared-memory attribute here)
  static int cache[8][9][2][2];
  static bool cached[8][9][2][2];
  const bool fixed = dim == kDim;
  int& resident = cache[dev & 7][nt][backward][fixed];
  if (!cached[dev & 7][nt][backward][fixed]) {
    cached[dev & 7][nt][backward][fixed] = true;
    KernelPtr<Epi> k = pick<Epi>(dim, nt, backward);
    int per_sm = 0, sms = 0;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      per_sm = sms = 0;
    }
    resident = per_sm * sms;
  }
  plan.max_active = resident;
  if (resident < ctas_for(dim)) {
    plan.reason = "the grid design needs 4 D / 64 resident CTAs of 512 threads (128 SMs at D = 2048)";
    return plan;
  }
  plan.ok = true;
  plan.cluster = 1;
  plan.bc = nt * 8;
  plan.clusters = ctas_for(dim);
  plan.smem = smem;
  plan.xchg_bytes = kCounterBytes + slot_bytes(plan.bc) + partial_bytes(plan.bc);
  return plan;
}

template <class Epi>
cudaError_t forward(const PersistentPlan& plan, const DenseForward& f, long long* trace) {
  ArgsOf<Epi> a = {};
  set_forward<Epi::kGates>(a, f);
  set_candidate<Epi>(a, f.v_all);
  a.dim = f.dim;
  a.trace = trace;
  return launch<Epi>(plan, false, f.stream, a, f.xchg);
}

template <class Epi>
cudaError_t backward(const PersistentPlan& plan, const DenseBackward& g) {
  ArgsOf<Epi> a = {};
  set_backward<Epi::kGates>(a, g);
  set_candidate<Epi>(a, g.v_all);
  a.dim = g.dim;
  return launch<Epi>(plan, true, g.stream, a, g.xchg);
}

}  // namespace
}  // namespace grid_design
}  // namespace elman
