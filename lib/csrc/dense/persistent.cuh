// Persistent kernels of the dense family (bf16, sm_90): one launch runs the whole sequence.
//
// A thread-block cluster of C = D / 64 CTAs holds W_h (forward) or W_h^T (backward) in
// registers for the whole sequence: CTA r owns rows [64 r, 64 r + 64); its 16 warps form a
// 2 x 8 grid, warp (m, k) holding rows [32 m, 32 m + 32) of the slice for one eighth of the
// columns as mma.sync A fragments. Each cluster owns `bc` (8 or 16) batch columns; clusters
// never talk to each other. Per step a CTA
//   1. multiplies its rows by the previous state (all D rows, bf16, in shared memory) with
//      mma.m16n8k16 (fp32 accumulate, four independent chains per warp; at 8 batch columns
//      the state's B fragments come by ldmatrix, two k-steps at a time), one partial per
//      warp; before each k-step a warp waits only for the slice of the CTA that owns those
//      columns (one mbarrier per source CTA), so early slices are multiplied while later
//      ones are still arriving;
//   2. sums the 8 partials of each row and applies the epilogue (bias, tanh, gate; or in
//      backward the gate and tanh gradients), writing its part of the new state to a global
//      staging slot;
//   3. publishes the slice: one thread (of the last warp) issues a bulk copy that multicasts
//      the slot from L2 into the other half of the state double buffer of every CTA of the
//      cluster, counted in bytes on each receiver's mbarrier of this source (measured: this
//      all-gather costs about half of st.async stores into every peer, because the slice
//      leaves the SM once), and only then stores the step's outputs, off the critical path.
// The per-step chores are spread over the warps: lane 0 of warp w arms the mbarrier of
// source w, and the input copies (at 8 batch columns) and the multicast are issued by the
// last warps (measured: piled on warp 0 they cost up to 9 % of a step).
// No cluster-wide barrier runs per step. The double buffer is safe: a CTA publishes state
// s + 2 into the buffer that held state s only after it received state s + 1 from every
// CTA, and each CTA publishes s + 1 only after it finished reading s. A state buffer is
// laid out [source CTA][batch column][64 + 8 padding], so that each source's slice is one
// contiguous block and the mma B-fragment loads hit 32 distinct banks.
// Per-step inputs (W_x x and the epilogue's kGates gate inputs, or d_out, h and the gate
// inputs) are staged three steps ahead with cp.async; a thread reads its own and computes
// everything of the epilogue that does not depend on the product (bias and gate; in backward
// the gate and activation gradients) before the partial-sum barrier: in forward while it
// waits for the state, in backward right after its multiply.
//
// Kernels and launch helpers are templates over the epilogue (dense/epilogues.cuh);
// persistent.cu instantiates them for the production table.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/cluster.cuh"
#include "common/mma.cuh"
#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "dense/gate_args.cuh"

namespace elman {
namespace cluster_design {
// Internal linkage: each module that compiles this (elman_dense, elman_dense_jitter, elman_dev)
// keeps its own kernels and plan caches. (With external linkage the function-local caches of
// the plan templates are unique symbols that the dynamic linker shares across modules: the
// jitter module then found the attributes set only on the other module's kernels.)
namespace {

namespace cg = cooperative_groups;

constexpr int kRows = 64;                 // rows of W_h per CTA (4 mma m-tiles)
constexpr int kSrcRow = kRows + 8;        // bf16 per (source, batch column) row of a state
                                          // buffer: 64 values and 8 of padding (bank spread)
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kKGroups = 8;               // warps splitting the columns
constexpr int kMTiles = 2;                // 16-row mma tiles per warp (2 x 16 = half the rows)
constexpr int kRedStride = kRows + 4;     // floats per (k-group, batch) row of partial sums
// Per-step inputs are staged kLead steps ahead in a ring of kLead + 1 buffers: they come from
// HBM, whose latency is about one step, so a lead of one step put its wait on the critical
// path (measured: 0.95 us a step at B = 16, D = 512 without the staging, 0.74 with it).
constexpr int kLead = 3;
constexpr int kStages = kLead + 1;

struct Args {
  int steps, batch, dim;
  const __nv_bfloat16* w;                 // W_h [D][D]
  const __nv_bfloat16* b;                 // forward: bias [D] (zeros for none)
  const __nv_bfloat16* wx;                // forward: W_x x [T][B][D]
  const __nv_bfloat16* g0;                // the epilogue's first gate input [T][B][D]
  const __nv_bfloat16* h0;                // forward: [B][D]
  __nv_bfloat16* out;                     // forward: [T][B][D]
  __nv_bfloat16* h_all;                   // [T+1][B][D] (written forward, read backward)
  const __nv_bfloat16* d_out;             // backward: [T][B][D]
  const __nv_bfloat16* d_hT;              // backward: [B][D]
  __nv_bfloat16* dv;                      // backward: [T][B][D]
  __nv_bfloat16* dg0;                     // backward: its gradient [T][B][D]
  __nv_bfloat16* dh0;                     // backward: [B][D]
  __nv_bfloat16* xchg;                    // [clusters][ranks][2][bc][kSrcRow]: published slices
  long long* trace;                       // optional: per-step phase clocks of CTA 0
};
template <int kG>
using ArgsFor = GateArgs<Args, kG>;
template <class Epi>
using ArgsOf = EpiArgs<Args, Epi>;

// Phases of a step recorded by `trace` (clock64 at each boundary, kTracePhases per step).
// After the T steps: clock64 and %globaltimer (ns) at kernel start and end, for the clock rate.
constexpr int kTracePhases = 6;  // start, state arrived, multiplied, inputs+partials ready,
                                 // epilogue done, sent

// The traced forward is its own instantiation (kTrace): in the untraced one the marks are no
// code at all (measured: their checks alone cost about 60 ns a step). A mark reads the
// pointer from the kernel parameters each time (no live register).
template <bool kTrace>
__device__ __forceinline__ void mark(const Args& p, int step, int phase) {
  trace_mark<kTrace>(p.trace, kTracePhases, step, phase);
}
template <bool kTrace>
__device__ __forceinline__ void stamp(const Args& p, int slot) {
  trace_stamp<kTrace>(p.trace, kTracePhases, p.steps, slot);
}

// ---- the per-CTA machinery shared by forward and backward ---------------------------------
// KS = D / 256; NT = bc / 8 mma n-tiles; kGates gate inputs; staged input tensors: forward
// wx and the gates, backward d_out, h (with kPrev also h_{t-1} and v) and the gates.
template <int KS, int NT, int kGates, bool kBackward, bool kPrev = false>
struct Cta {
  static constexpr int kGateAt = kBackward ? (kPrev ? 4 : 2) : 1;  // first staged gate input
  static constexpr int kIn = kGateAt + kGates;
  static constexpr int kBc = NT * 8;
  static constexpr int kDim = KS * 256;
  static constexpr int kRanks = kDim / kRows;                  // CTAs of the cluster
  static constexpr int kSteps = kDim / kKGroups / 16;          // mma k-steps per warp
  static_assert(kSteps % 2 == 0, "the multiply loads B fragments two k-steps at a time");
  static_assert(kRanks <= kWarps, "one warp arms the mbarrier of each source");
  static constexpr int kBlock = kBc * kSrcRow;                // one source's slice in a buffer
  static constexpr int kStateElems = kRanks * kBlock;         // one state buffer
  static constexpr int kSlice = kBc * kRows;                   // one CTA's slice, elements
  static constexpr uint32_t kBlockBytes = kBlock * 2;
  static constexpr int kPerThread = kSlice / kThreads;         // outputs per thread
  static constexpr int kChunks = kSlice / 8;                   // 16-byte chunks per slice

  // Shared memory: state[2][source][n][kSrcRow] | red | stage[kStages][kIn] | mbar[2][source]
  static constexpr int kRedOffset = 2 * kStateElems * 2;
  static constexpr int kStageOffset = kRedOffset + kKGroups * kBc * kRedStride * 4;
  static constexpr int kBarOffset = kStageOffset + kStages * kIn * kSlice * 2;
  static constexpr int kSmem = kBarOffset + 2 * kRanks * 8;

  // Shared memory is addressed from one base, so the layout costs no registers.
  unsigned char* base;
  int rank, row0, n0;
  uint32_t a[kMTiles][kSteps][4];  // A fragments: [m-tile][k-step][reg]

  __device__ __nv_bfloat16* state() const { return reinterpret_cast<__nv_bfloat16*>(base); }
  __device__ float* red() const { return reinterpret_cast<float*>(base + kRedOffset); }
  __device__ __nv_bfloat16* stage() const {
    return reinterpret_cast<__nv_bfloat16*>(base + kStageOffset);
  }
  __device__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base + kBarOffset); }
  __device__ static int lane() { return int(threadIdx.x) & 31; }
  __device__ static int kgroup() { return (int(threadIdx.x) >> 5) % kKGroups; }
  __device__ static int mrow0() { return (int(threadIdx.x) >> 5) / kKGroups * kMTiles * 16; }

  __device__ Cta(unsigned char* smem, const cg::cluster_group& cluster) : base(smem) {
    rank = int(cluster.block_rank());
    row0 = rank * kRows;
    n0 = int(blockIdx.x) / kRanks * kBc;
    if (threadIdx.x == 0) {  // one thread initialises the barriers and fences its own inits
      for (int i = 0; i < 2 * kRanks; ++i) mbar_init(&bar()[i]);
      mbar_init_fence();
    }
  }

  __device__ __nv_bfloat16* buffer(int i) const { return state() + (i & 1) * kStateElems; }
  __device__ const __nv_bfloat16* inputs(int i) const {
    return stage() + (i % kStages) * kIn * kSlice;
  }
  // Element k of batch column n of buffer i (the layout the exchange writes).
  __device__ __nv_bfloat16* at(int i, int n, int k) const {
    return buffer(i) + (k / kRows) * kBlock + n * kSrcRow + k % kRows;
  }

  // This warp's A fragments of rows [row0, row0 + 64) of W (transposed: of W^T).
  __device__ void load_weights(const __nv_bfloat16* w, bool transposed) {
    load_a(a, w, kDim, row0 + mrow0(), kgroup() * (kDim / kKGroups), transposed);
  }

  // The staged [T][B][D] inputs, read from the kernel parameters when needed (they cost no
  // registers): forward wx, gates; backward d_out, h (h_all shifted by one step), with kPrev
  // h_{t-1} (h_all) and v, then the gates.
  template <class A>
  __device__ static const __nv_bfloat16* source(const A& p, int k) {
    if (!kBackward) return k == 0 ? p.wx : gate_input<kGates>(p, k - 1);
    if constexpr (kPrev) {
      if (k == 2) return p.h_all;
      if (k == 3) return p.v_all;
    }
    return k == 0 ? p.d_out : k == 1 ? p.h_all + size_t(p.batch) * kDim
                                     : gate_input<kGates>(p, k - kGateAt);
  }

  // Stage step t of the inputs into input buffer i (live batches only), as one cp.async
  // group; `skip` commits an empty group (keeps the group count uniform). At 8 batch columns
  // the copies are issued by the last warps, away from warp 0, which also records the trace
  // (measured: 0.74 -> 0.70 us a step at B = 4, D = 512; at 16 columns it was slower).
  template <class A>
  __device__ void stage_inputs(int i, const A& p, int t, bool skip) {
    const int batch = p.batch;
    __nv_bfloat16* dst = stage() + (i % kStages) * kIn * kSlice;
    const int first = NT == 1 ? kThreads - 1 - int(threadIdx.x) : int(threadIdx.x);
    for (int c = first; !skip && c < kIn * kChunks; c += kThreads) {
      const int tensor = c / kChunks, chunk = c % kChunks;
      const int n = chunk / (kRows / 8), r = (chunk % (kRows / 8)) * 8;
      if (n0 + n >= batch) continue;
      const __nv_bfloat16* g = source(p, tensor) + (size_t(t) * batch + n0 + n) * kDim + row0 + r;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                       smem_u32(dst + tensor * kSlice + n * kRows + r)),
                   "l"(g));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  // All but the kLead - 1 most recent groups of this thread's copies have landed: called
  // after staging step t + kLead, the inputs of step t + 1 are in (a block barrier then shows
  // them to every thread).
  __device__ static void wait_inputs() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kLead - 1) : "memory");
  }

  // The receiver side of exchange number e (into buffer e + 1): one mbarrier per source
  // CTA, each expecting one slice; lane 0 of warp w arms the barrier of source w. (Lanes
  // 0-15 of warp 0 arming all 16 held that warp up: 0.98 -> 0.89 us a step at B = 4,
  // D = 1024 and 1.01 -> 0.96 at B = 16 when spread.)
  __device__ void expect(int e) {
    const int w = int(threadIdx.x) >> 5;
    if (lane() == 0 && w < kRanks) mbar_expect(&bar()[((e + 1) & 1) * kRanks + w], kBlockBytes);
  }
  // Wait until source CTA `src`'s slice of exchange e has arrived. (A wait that kept the tensor
  // pipe busy with dummy mma.sync between test_wait polls was 3-13 % slower a step.)
  __device__ void wait_source(int e, int src) const {
    mbar_wait(&bar()[((e + 1) & 1) * kRanks + src], (e >> 1) & 1);
  }

  // Partial products of this warp's rows and columns with state buffer i, into
  // red[k-group][n][row]. With `e` >= 0 the buffer is being filled by exchange e: before
  // each k-step the warp waits for the slice of the CTA that owns those columns, so the
  // multiply of early slices overlaps the arrival of later ones. `first` runs after the
  // first wait.
  template <class First>
  __device__ void multiply(int i, int e, First first) {
    const __nv_bfloat16* src = buffer(i);
    const int k0 = kgroup() * (kDim / kKGroups);
    // Independent accumulator chains: with one n-tile a warp alternates two (even and odd
    // k-steps) so that it has four mma in flight; with two n-tiles it has them already (and
    // the registers of a second chain would spill).
    constexpr int kChains = NT == 1 ? 2 : 1;
    float acc[kChains][kMTiles][NT][4] = {};
    const int lane_ = lane();
#pragma unroll
    for (int s = 0; s < kSteps; s += NT == 1 ? 2 : 1) {
      const int col = k0 + s * 16;
      if (e >= 0 && (s == 0 || col % kRows == 0)) {
        wait_source(e, col / kRows);
        jitter(e, 6 + col / kRows);  // between the arrival of a slice and its use
        if (s == 0) first();
      }
      const __nv_bfloat16* blk = src + (col / kRows) * kBlock + col % kRows;
      if constexpr (NT == 1) {
        // Two k-steps (32 columns; never across a slice, k0 being a multiple of 32) by one
        // ldmatrix: 0.99-1.01 against 1.06-1.07 us a step at B = 16, D = 1024.
        uint32_t b[4];
        ldmatrix_x4(b, smem_u32(blk + (lane_ & 7) * kSrcRow + 8 * (lane_ >> 3)));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) mma(acc[0][mt][0], a[mt][s], b[0], b[1]);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) mma(acc[1][mt][0], a[mt][s + 1], b[2], b[3]);
      } else {
        // Two n-tiles: 32-bit loads (ldmatrix.x2 per n-tile was slower here).
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const __nv_bfloat16* row = blk + (nt * 8 + (lane_ >> 2)) * kSrcRow + 2 * (lane_ & 3);
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + 8);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) mma(acc[0][mt][nt], a[mt][s], b0, b1);
        }
      }
    }
    store_acc(acc, red() + kgroup() * kBc * kRedStride, kRedStride, mrow0(), 0);
  }

  __device__ float reduce(int n, int r) const {
    float s = 0.f;
    const float* partial = red() + n * kRedStride + r;
#pragma unroll
    for (int w = 0; w < kKGroups; ++w) s += partial[w * kBc * kRedStride];
    return s;
  }

  // Output k of this thread (j = tid + 512 k): batch column n = j / 64, row r = j % 64. A
  // warp holds rows [r0, r0 + 32) of one column, as lanes.
  __device__ static int out_n(int k) { return (int(threadIdx.x) + k * kThreads) / kRows; }
  __device__ static int out_r(int k) { return (int(threadIdx.x) + k * kThreads) % kRows; }

  // Store this thread's outputs of one step, a[k] into x and b[k] into y ([B][D] planes of
  // [T][B][D] tensors), for the live batch columns. Runs after the slice has been published,
  // off the step's critical path (the values are in registers: the staged inputs may be
  // overwritten by then).
  __device__ void store(const Args& p, __nv_bfloat16* x, const __nv_bfloat16 (&a)[kPerThread],
                        __nv_bfloat16* y, const __nv_bfloat16 (&b)[kPerThread]) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int n = out_n(k), r = out_r(k);
      if (n0 + n < p.batch) {
        const size_t off = size_t(n0 + n) * kDim + row0 + r;
        x[off] = a[k];
        y[off] = b[k];
      }
    }
  }
  // The same for one plane (a backward without gates) and for three (two gates).
  __device__ void store(const Args& p, __nv_bfloat16* x, const __nv_bfloat16 (&a)[kPerThread]) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int n = out_n(k), r = out_r(k);
      if (n0 + n < p.batch) x[size_t(n0 + n) * kDim + row0 + r] = a[k];
    }
  }
  __device__ void store(const Args& p, __nv_bfloat16* x, const __nv_bfloat16 (&a)[kPerThread],
                        __nv_bfloat16* y, const __nv_bfloat16 (&b)[kPerThread],
                        __nv_bfloat16* z, const __nv_bfloat16 (&c)[kPerThread]) const {
    store(p, x, a, y, b);
    store(p, z, c);
  }

  // This CTA's slot for exchange e in the global staging buffer: [bc][kSrcRow].
  __device__ __nv_bfloat16* slot(const Args& p, int e) const {
    return p.xchg + ((size_t(blockIdx.x) * 2 + ((e + 1) & 1)) * kBlock);
  }
  // Exchange e: the slice is in this CTA's slot (written by every thread). Each thread makes
  // its writes visible to the async proxy; after the block barrier lane 0 of the last warp
  // issues a bulk copy that multicasts the slot from global memory (L2) into the same place
  // of buffer e + 1 of every CTA of the cluster, counted on each receiver's mbarrier of this
  // source. (Measured: faster than one 64-byte multicast per warp with no block barrier;
  // issued by the last warp rather than warp 0, 1 % faster.)
  // The barrier also ends every read of this step's partial sums and staged inputs, so the
  // next step may overwrite them.
  __device__ void publish(const Args& p, int e) const {
    fence_async_global();
    __syncthreads();
    if (int(threadIdx.x) == kThreads - 32)
      bulk_multicast(buffer(e + 1) + rank * kBlock, slot(p, e), kBlockBytes,
                     &bar()[((e + 1) & 1) * kRanks + rank], uint16_t((1u << kRanks) - 1));
  }
};

template <int KS, int NT, class Epi, bool kTrace>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(ArgsOf<Epi> p) {
  using C = Cta<KS, NT, Epi::kGates, false>;  // staged inputs: wx, gates
  constexpr bool kPrev = kReadsPrevOf<Epi>;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  C cta(smem, cluster);
  stamp<kTrace>(p, 0);
  const size_t BD = size_t(p.batch) * C::kDim;

  for (int i = 0; i < kLead; ++i) cta.stage_inputs(i, p, i, i >= p.steps);
  cta.load_weights(p.w, false);
  for (int i = threadIdx.x; i < C::kBc * C::kDim; i += kThreads) {
    const int n = i / C::kDim, k = i % C::kDim;
    *cta.at(0, n, k) =
        cta.n0 + n < p.batch ? p.h0[size_t(cta.n0 + n) * C::kDim + k] : __float2bfloat16_rn(0.f);
  }
  float bias[C::kPerThread];
  float h_prev[kPrev ? C::kPerThread : 1];  // kPrev: this thread's h_{t-1}, fp32
#pragma unroll
  for (int k = 0; k < C::kPerThread; ++k) {
    const int n = C::out_n(k), r = C::out_r(k);
    bias[k] = to_float(p.b[cta.row0 + r]);
    const size_t off = size_t(cta.n0 + n) * C::kDim + cta.row0 + r;
    if (cta.n0 + n < p.batch) p.h_all[off] = p.h0[off];
    if constexpr (kPrev) h_prev[k] = cta.n0 + n < p.batch ? to_float(p.h0[off]) : 0.f;
  }
  C::wait_inputs();
  cluster.sync();  // barriers initialised, h0 and the inputs of step 0 in place in every CTA

  for (int t = 0; t < p.steps; ++t) {
    const bool last = t + 1 == p.steps;
    mark<kTrace>(p, t, 0);
    jitter(t, 0);
    if (!last) cta.expect(t);                     // h_t arrives as exchange t
    jitter(t, 1);
    const __nv_bfloat16* in = cta.inputs(t);
    float pre_v[C::kPerThread];                  // wx + b and the epilogue's part before the
    typename Epi::Pre pre[C::kPerThread];        // product
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int j = C::out_n(k) * kRows + C::out_r(k);
      pre_v[k] = to_float(in[j]) + bias[k];
      Gates<Epi> g;
#pragma unroll
      for (int i = 0; i < Epi::kGates; ++i) g[i] = to_float(in[(1 + i) * C::kSlice + j]);
      pre[k] = Epi::prepare(g);
    }
    cta.stage_inputs(t + kLead, p, t + kLead, t + kLead >= p.steps);
    jitter(t, 2);
    if (t == 0) mark<kTrace>(p, t, 1);
    cta.multiply(t, t - 1, [&] { mark<kTrace>(p, t, 1); });  // h_{t-1}: exchange t - 1 (h0 at t = 0)
    mark<kTrace>(p, t, 2);
    jitter(t, 3);
    __syncthreads();  // partial sums complete
    mark<kTrace>(p, t, 3);
    __nv_bfloat16* slot = cta.slot(p, t);
    __nv_bfloat16 hb[C::kPerThread], ob[C::kPerThread], vb[kPrev ? C::kPerThread : 1];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int n = C::out_n(k), r = C::out_r(k);
      float h;
      if constexpr (kPrev) {
        const float v = Epi::act(cta.reduce(n, r) + pre_v[k]);
        h = Epi::blend(v, h_prev[k], pre[k]);
        h_prev[k] = h;
        vb[k] = __float2bfloat16_rn(v);
      } else {
        h = Epi::act(cta.reduce(n, r) + pre_v[k]);
      }
      hb[k] = __float2bfloat16_rn(h);
      slot[n * kSrcRow + r] = hb[k];
      ob[k] = __float2bfloat16_rn(Epi::output(h, pre[k]));
    }
    mark<kTrace>(p, t, 4);
    jitter(t, 4);
    C::wait_inputs();                  // step t + 1's inputs: the publish barrier shows them
    if (!last) cta.publish(p, t);
    jitter(t, 5);
    mark<kTrace>(p, t, 5);
    if constexpr (kPrev) cta.store(p, p.out + t * BD, ob, p.h_all + (t + 1) * BD, hb, p.v_all + t * BD, vb);
    else cta.store(p, p.out + t * BD, ob, p.h_all + (t + 1) * BD, hb);
  }
  cluster.sync();  // no CTA leaves while another may still address its shared memory
  stamp<kTrace>(p, 1);
}

template <int KS, int NT, class Epi>
__global__ void __launch_bounds__(kThreads, 1) backward_kernel(ArgsOf<Epi> p) {
  constexpr bool kPrev = kReadsPrevOf<Epi>;
  // staged: d_out_t, h_t (= h_all[t + 1]), with kPrev h_{t-1} and v_t, gates_t
  using C = Cta<KS, NT, Epi::kGates, true, kPrev>;
  constexpr int kG = Epi::kGates;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  C cta(smem, cluster);
  const size_t BD = size_t(p.batch) * C::kDim;
  const int T = p.steps;
  auto none = [] {};

  for (int i = 0; i < kLead; ++i) cta.stage_inputs(i, p, T - 1 - i, i >= T);
  cta.load_weights(p.w, true);
  C::wait_inputs();
  cluster.sync();
  float carry[kPrev ? C::kPerThread : 1] = {};  // kPrev: dh_{t+1} dh_{t+1}/dh_t of this element

  for (int u = 0; u < T; ++u) {  // u-th step from the end: t = T - 1 - u
    const int t = T - 1 - u;
    jitter(u, 0);
    cta.expect(u);                                // dv_t is exchange u
    jitter(u, 1);
    cta.stage_inputs(u + kLead, p, t - kLead, u + kLead >= T);
    jitter(u, 2);
    if (u > 0) cta.multiply(u, u - 1, none);      // W_h^T dv_{t+1}: exchange u - 1
    jitter(u, 3);
    // dv = (acc + c) f: c, f and the gate gradients need no product. Computed after this
    // warp's multiply (its accumulators are dead: before it, at 16 batch columns, they would
    // spill) while the other warps finish theirs.
    const __nv_bfloat16* in = cta.inputs(u);
    float pre_c[C::kPerThread], pre_f[C::kPerThread];
    __nv_bfloat16 dgb[kG > 0 ? kG : 1][C::kPerThread];  // the gate gradients
    float pre_q[kPrev ? kG : 1][kPrev ? C::kPerThread : 1], pre_a[kPrev ? C::kPerThread : 1];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int j = C::out_n(k) * kRows + C::out_r(k);
      const float d_out = to_float(in[j]), h = to_float(in[C::kSlice + j]);
      Gates<Epi> g, dg;
#pragma unroll
      for (int i = 0; i < kG; ++i) g[i] = to_float(in[(C::kGateAt + i) * C::kSlice + j]);
      if constexpr (kPrev) {  // the gate gradients need dh: dh q_i after the product
        typename Epi::Back b;
        Epi::backward_prev(d_out, h, to_float(in[2 * C::kSlice + j]),
                           to_float(in[3 * C::kSlice + j]), g, b);
        pre_c[k] = b.c;
        pre_f[k] = b.f;
        pre_a[k] = b.a;
#pragma unroll
        for (int i = 0; i < kG; ++i) pre_q[i][k] = b.q[i];
      } else {
        Epi::backward_parts(d_out, h, g, pre_c[k], pre_f[k], dg);
#pragma unroll
        for (int i = 0; i < kG; ++i) dgb[i][k] = __float2bfloat16_rn(dg[i]);
      }
    }
    __syncthreads();  // partial sums complete
    __nv_bfloat16* slot = cta.slot(p, u);
    __nv_bfloat16 dvb[C::kPerThread];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int n = C::out_n(k), r = C::out_r(k);
      const size_t off = size_t(cta.n0 + n) * C::kDim + cta.row0 + r;
      const float acc = u > 0 ? cta.reduce(n, r) : (cta.n0 + n < p.batch ? to_float(p.d_hT[off]) : 0.f);
      if constexpr (kPrev) {
        const float dh = acc + pre_c[k] + carry[k];
        dvb[k] = __float2bfloat16_rn(dh * pre_f[k]);
#pragma unroll
        for (int i = 0; i < kG; ++i) dgb[i][k] = __float2bfloat16_rn(dh * pre_q[i][k]);
        carry[k] = dh * pre_a[k];
      } else {
        dvb[k] = __float2bfloat16_rn((acc + pre_c[k]) * pre_f[k]);
      }
      slot[n * kSrcRow + r] = dvb[k];
    }
    jitter(u, 4);
    C::wait_inputs();
    cta.publish(p, u);
    jitter(u, 5);
    if constexpr (kG == 0) cta.store(p, p.dv + t * BD, dvb);
    else if constexpr (kG == 1) cta.store(p, p.dv + t * BD, dvb, p.dg0 + t * BD, dgb[0]);
    else cta.store(p, p.dv + t * BD, dvb, p.dg0 + t * BD, dgb[0], gate_grad<kG>(p, 1) + t * BD, dgb[1]);
  }
  // dh0 = W_h^T dv_0 (+ the carried direct term), exchange T - 1.
  cta.multiply(T, T - 1, none);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < C::kPerThread; ++k) {
    const int n = C::out_n(k), r = C::out_r(k);
    float acc = cta.reduce(n, r);
    if constexpr (kPrev) acc += carry[k];
    if (cta.n0 + n < p.batch)
      p.dh0[size_t(cta.n0 + n) * C::kDim + cta.row0 + r] = __float2bfloat16_rn(acc);
  }
  cluster.sync();
}

// ---- planning and launch (templates over the epilogue) ---------------------------------
template <class Epi>
using KernelPtr = void (*)(ArgsOf<Epi>);

template <class Epi>
KernelPtr<Epi> pick(int ks, int nt, bool backward, bool trace = false) {
#ifdef ELMAN_TRACE  // the traced forward exists in the development build only
#define ELMAN_FORWARD(KS, NT) \
  trace ? forward_kernel<KS, NT, Epi, true> : forward_kernel<KS, NT, Epi, false>
#else
#define ELMAN_FORWARD(KS, NT) trace ? nullptr : forward_kernel<KS, NT, Epi, false>
#endif
#define ELMAN_CASE(KS, NT) \
  if (ks == KS && nt == NT) return backward ? backward_kernel<KS, NT, Epi> : ELMAN_FORWARD(KS, NT);
  ELMAN_CASE(1, 1) ELMAN_CASE(1, 2) ELMAN_CASE(2, 1) ELMAN_CASE(2, 2)
  ELMAN_CASE(3, 1) ELMAN_CASE(3, 2) ELMAN_CASE(4, 1) ELMAN_CASE(4, 2)
#undef ELMAN_CASE
#undef ELMAN_FORWARD
  return nullptr;
}

template <int KS, int kGates, bool kPrev>
int smem_for_ks(int nt, bool backward) {
  if (nt == 1)
    return backward ? Cta<KS, 1, kGates, true, kPrev>::kSmem : Cta<KS, 1, kGates, false>::kSmem;
  return backward ? Cta<KS, 2, kGates, true, kPrev>::kSmem : Cta<KS, 2, kGates, false>::kSmem;
}

template <int kGates, bool kPrev = false>
int smem_for(int ks, int nt, bool backward) {
  switch (ks) {
    case 1: return smem_for_ks<1, kGates, kPrev>(nt, backward);
    case 2: return smem_for_ks<2, kGates, kPrev>(nt, backward);
    case 3: return smem_for_ks<3, kGates, kPrev>(nt, backward);
    default: return smem_for_ks<4, kGates, kPrev>(nt, backward);
  }
}

template <class Epi>
cudaError_t launch(const PersistentPlan& plan, int dim, bool backward, cudaStream_t stream,
                   const ArgsOf<Epi>& args) {
  KernelPtr<Epi> k = pick<Epi>(dim / 256, plan.bc / 8, backward, args.trace != nullptr);
  if (k == nullptr) return cudaErrorInvalidValue;  // a trace asked of a build without it
  if (args.trace != nullptr) {  // the plan set the attributes of the untraced kernel only
    const cudaError_t e = allow_cluster_launch(k, plan.smem, plan.cluster);
    if (e != cudaSuccess) return e;
  }
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg =
      cluster_launch_config(plan.cluster, plan.clusters, kThreads, plan.smem, stream, attr);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args);  // attributes were set by the plan
  return e == cudaSuccess ? cudaGetLastError() : e;
}

// The cluster design's plan for epilogue Epi (D = 256..1024).
template <class Epi>
PersistentPlan make_plan(int batch, int dim, bool backward) {
  PersistentPlan plan;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dim % 256 != 0 || dim < 256 || dim > 1024) {
    plan.reason = "the cluster design takes D = 256, 512, 768, 1024";
    return plan;
  }
  if (batch < 1) { plan.reason = "B must be at least 1"; return plan; }
  if (size_t(batch) * dim >= (size_t(1) << 31)) { plan.reason = "B * D must be below 2^31"; return plan; }
  plan.cluster = dim / kRows;
  // Clusters of each shape the GPU holds at once, asked once per process, device and epilogue.
  static int active_cache[8][5][3][2];
  static bool cached[8][5][3][2];
  for (int nt = 1; nt <= 2; ++nt) {
    const int smem = smem_for<Epi::kGates, kReadsPrevOf<Epi>>(dim / 256, nt, backward);
    int& active = active_cache[dev & 7][dim / 256][nt][backward];
    if (!cached[dev & 7][dim / 256][nt][backward]) {
      cached[dev & 7][dim / 256][nt][backward] = true;
      active = 0;
      KernelPtr<Epi> k = pick<Epi>(dim / 256, nt, backward);
      cudaLaunchAttribute attr[1];
      cudaLaunchConfig_t cfg = cluster_launch_config(plan.cluster, 1, kThreads, smem, nullptr, attr);
      if (allow_cluster_launch(k, smem, plan.cluster) != cudaSuccess ||
          cudaOccupancyMaxActiveClusters(&active, k, &cfg) != cudaSuccess) {
        cudaGetLastError();
        active = 0;
      }
    }
    const int clusters = (batch + nt * 8 - 1) / (nt * 8);
    if (active > 0 && (clusters <= active || nt == 2)) {
      plan.ok = true;
      plan.bc = nt * 8;
      plan.clusters = clusters;
      plan.smem = smem;
      plan.max_active = active;
      plan.xchg_bytes = size_t(clusters) * plan.cluster * 2 * plan.bc * kSrcRow * 2;
      if (clusters > active) plan.reason = "more clusters than fit at once: they run in waves";
      return plan;
    }
  }
  plan.reason = "the GPU cannot hold one cluster of this shape (registers / shared memory)";
  return plan;
}

template <class Epi>
cudaError_t forward(const PersistentPlan& plan, const DenseForward& f, long long* trace) {
  ArgsOf<Epi> a = {};
  set_forward<Epi::kGates>(a, f);
  set_candidate<Epi>(a, f.v_all);
  a.dim = f.dim;
  a.xchg = static_cast<__nv_bfloat16*>(f.xchg);
  a.trace = trace;
  return launch<Epi>(plan, f.dim, false, f.stream, a);
}

template <class Epi>
cudaError_t backward(const PersistentPlan& plan, const DenseBackward& g) {
  ArgsOf<Epi> a = {};
  set_backward<Epi::kGates>(a, g);
  set_candidate<Epi>(a, g.v_all);
  a.dim = g.dim;
  a.xchg = static_cast<__nv_bfloat16*>(g.xchg);
  return launch<Epi>(plan, g.dim, true, g.stream, a);
}

}  // namespace
}  // namespace cluster_design
}  // namespace elman
