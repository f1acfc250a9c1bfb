// The wide cluster design of the dense persistent path (bf16, sm_90): D = 1280, where one
// 16-CTA cluster can no longer hold W_h in registers alone.
//
// A cluster of 16 CTAs (a non-portable size) owns 8 batch columns; CTA r owns rows
// [R r, R r + R) of W_h (backward: of W_h^T), R = D / 16 = 80, five mma m-tiles. Warp w of
// its 16 multiplies all 80 rows by the columns of source slice w (5 k-steps: 25 mma a step,
// five independent accumulator chains), so it waits for exactly one slice and each state B
// fragment is loaded once a CTA. Of a warp's 25 fragments (i = 5 m-tile + k-step) the first
// kRegFrags stay in registers (kRegFragsOf: 15-19, 60-76 registers a thread); the rest live in
// shared memory in fragment order (lane l's four registers are 16 consecutive bytes: one
// conflict-free 16-byte load each) and are read every step. The 16 partial sums of a row (one
// per slice) are added in the epilogue, in a fixed order; a thread reduces all its elements
// before the epilogue of any and stores its state slice last, so that no element's partial-sum
// loads are issued behind another element's stores (threads 0-127 finish two elements).
//
// The forward also runs with 12 batch columns a cluster (two n-tiles, the second with 4 live
// columns): an H100 holds 7 of these clusters at once, so 12 columns take B = 57-84 in one wave
// where 8 take two. Its warp multiplies m-tile by m-tile against the B fragments of both
// n-tiles (loaded first, 20 registers; 50 mma a step, two chains), keeps fewer fragments in
// registers (15-16), stages inputs two steps ahead and finishes two elements a thread (960 of a
// slice; threads 0-447 two, the others one). The backward keeps 8 columns: it reads the
// forward's states from h_all in global memory, so the two directions choose independently.
//
// Budget at D = 1280 (per CTA): W_h slice 80 x 1280 bf16 = 200 KB: 136-152 KB in registers,
// 48-64 KB (6-8 fragments of 512 bytes a warp) in shared memory; state double buffer
// 2 x 16 sources x 8 columns x (80 + 8) bf16 = 44 KB; partial sums 16 planes x 8 x 84 floats
// = 42 KB; staged inputs 4 x kIn x 1.25 KB (5-30 KB): 139-164 KB of the 227 (E1 forward 144).
// At 12 columns: weights 72-80 KB (9-10 fragments a warp) in shared memory, state 66 KB,
// partial sums 63 KB, staged inputs 3 x kIn x 1.875 KB (6-17 KB): 212-226 KB (E1 212.5).
// Every kernel: 128 registers, no spills. Per step a warp reads 3-3.5 KB of weights and
// 1.25 KB of B fragments from shared memory: 70-78 KB a CTA, 540-610 clocks at 128 bytes a
// clock, spread over the multiply (at D = 1024: 32 KB of B fragments); at 12 columns 4.5-5 KB
// and 2.5 KB, 112-120 KB a CTA, and the partial sums 60 KB each way (8 columns: 40). The
// exchange is one 1408-byte slice a CTA a step (12 columns: 2112), multicast to the 16 CTAs.
// D = 1536 does not fit one cluster: 96 x 1536 bf16 = 288 KB a CTA; with 80 registers of
// fragments a thread (160 KB, beyond what the kernels hold at 1280 without spilling) the
// other 128 KB of weights, a 52 KB state buffer and 50 KB of partial sums exceed 227 KB.
//
// Everything else is the cluster design's protocol: one mbarrier per source CTA, the slice
// published by one bulk copy that multicasts it from the CTA's global staging slot to every
// CTA, inputs staged kLead steps ahead by cp.async, the same epilogue table, and a thread
// finishing the same elements every step (kReadsPrev epilogues keep h_{t-1} and the carry in
// registers). A slice of 640 elements over 512 threads (8 columns): threads 0-127 finish two,
// the others one.
// Kernels and launch helpers are templates over the epilogue; persistent.cu instantiates them.
#pragma once

#include <cstdlib>

#include "dense/persistent.cuh"

namespace elman {
namespace wide_design {
namespace {  // internal linkage, as the cluster design (persistent.cuh)

namespace cg = cooperative_groups;
using cluster_design::Args;
using cluster_design::ArgsOf;
using cluster_design::mark;
using cluster_design::stamp;

constexpr int kDim = 1280;     // the one width of this design
constexpr int kRanks = 16;     // CTAs of a cluster
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kNarrow = 8;     // batch columns of a cluster: one mma n-tile
constexpr int kBroad = 12;     // the forward's other width: two n-tiles, the second 4 columns
// The forward's columns forced for side-by-side timing: ELMAN_WIDE_COLUMNS=8 or 12 (read by
// make_plan at every plan); by default the forward takes 12 where that needs fewer waves.
constexpr const char* kColumnsEnv = "ELMAN_WIDE_COLUMNS";
// Fragments a warp keeps in registers (of 25): as many as ptxas (CUDA 13.0) allocates in 128
// registers without spilling, found per kernel. At 8 columns: 19 (76 registers) for the
// forward of the epilogues that do not read h_{t-1} and the backward of those that do, else
// 18; the traced forward (development build) 17. At 12 columns (the forward only; B
// fragments of both n-tiles and two accumulator tiles live): 16 (64 registers), 15 for the
// epilogues of two gate inputs. There is no traced forward at 12 columns: it spills at 15
// (E1: 28 bytes) and at 14 its shared memory exceeds the SM's (E1: 233,984 bytes); the traced
// forward's plan takes 8.
template <class Epi, bool kBackward, bool kTrace = false, int kBc = kNarrow>
constexpr int kRegFragsOf = kBc == kBroad ? (Epi::kGates == 2 ? 15 : 16)
                            : kTrace      ? 17
                            : (kBackward == kReadsPrevOf<Epi>) ? 19 : 18;

inline bool takes(int dim) { return dim == kDim; }

// The B fragments of one k-step (two 8 x 8 matrices; lanes 0-15 give the row addresses).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&b)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(addr)
               : "memory");
}

template <int kGates, bool kBackward, bool kPrev, int kRegFrags, int kBc = kNarrow>
struct Cta {
  static constexpr int kNt = (kBc + 7) / 8;                   // mma n-tiles
  // Inputs staged kLead steps ahead (a ring of kLead + 1): the cluster design's three at 8
  // columns, two at 12, whose step (about 2 us) is still twice the latency of HBM.
  static constexpr int kLead = kBc == kNarrow ? cluster_design::kLead : 2;
  static constexpr int kStages = kLead + 1;
  static constexpr int kRows = kDim / kRanks;                 // 80
  static constexpr int kSrcRow = kRows + 8;                   // bf16 per (source, column) row
  static constexpr int kTiles = kRows / 16;                   // m-tiles of a CTA
  static constexpr int kSliceSteps = kRows / 16;              // k-steps of one source slice
  static constexpr int kFrags = kTiles * kSliceSteps;         // fragments a warp
  static constexpr int kWFrags = kFrags - kRegFrags;          // of them in shared memory
  static constexpr int kRedStride = kRows + 4;  // floats per (plane, column): banks spread
  static constexpr int kPlanes = kRanks;        // partial sums: one plane per source slice
  static constexpr int kGateAt = kBackward ? (kPrev ? 4 : 2) : 1;
  static constexpr int kIn = kGateAt + kGates;
  static constexpr int kBlock = kBc * kSrcRow;
  static constexpr int kStateElems = kRanks * kBlock;
  static constexpr int kSlice = kBc * kRows;
  static constexpr uint32_t kBlockBytes = kBlock * 2;
  static constexpr int kPerThread = (kSlice + kThreads - 1) / kThreads;
  static constexpr int kChunks = kSlice / 8;
  static_assert(kRows % 16 == 0 && kWarps == kRanks, "one warp per source slice");
  static_assert(kRegFrags >= 1 && kRegFrags <= kFrags, "fragments");
  static_assert(kBlockBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  static_assert(kBc == kNarrow || (kBc > 8 && kBc <= 16 && kBc % 2 == 0), "one or two n-tiles");

  // Shared memory: state[2][source][n][kSrcRow] | red | stage | weights | mbar[2][source]
  static constexpr int kRedOffset = 2 * kStateElems * 2;
  static constexpr int kStageOffset = kRedOffset + kPlanes * kBc * kRedStride * 4;
  static constexpr int kWeightOffset = kStageOffset + kStages * kIn * kSlice * 2;
  static constexpr int kBarOffset = kWeightOffset + kWarps * kWFrags * 512;
  static constexpr int kSmem = kBarOffset + 2 * kRanks * 8;
  static_assert(kSmem <= 227 * 1024, "the shared memory of one SM");

  unsigned char* base;
  int rank, row0, n0;
  uint32_t a[kRegFrags][4];  // register fragments: [5 m-tile + k-step][reg]

  __device__ __nv_bfloat16* state() const { return reinterpret_cast<__nv_bfloat16*>(base); }
  __device__ float* red() const { return reinterpret_cast<float*>(base + kRedOffset); }
  __device__ __nv_bfloat16* stage() const {
    return reinterpret_cast<__nv_bfloat16*>(base + kStageOffset);
  }
  __device__ uint4* weights() const { return reinterpret_cast<uint4*>(base + kWeightOffset); }
  __device__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base + kBarOffset); }
  __device__ static int lane() { return int(threadIdx.x) & 31; }
  __device__ static int warp() { return int(threadIdx.x) >> 5; }
  __device__ Cta(unsigned char* smem, const cg::cluster_group& cluster) : base(smem) {
    rank = int(cluster.block_rank());
    row0 = rank * kRows;
    n0 = int(blockIdx.x) / kRanks * kBc;
    if (threadIdx.x == 0) {
      for (int i = 0; i < 2 * kRanks; ++i) mbar_init(&bar()[i]);
      mbar_init_fence();
    }
  }

  __device__ __nv_bfloat16* buffer(int i) const { return state() + (i & 1) * kStateElems; }
  __device__ const __nv_bfloat16* inputs(int i) const {
    return stage() + (i % kStages) * kIn * kSlice;
  }
  __device__ __nv_bfloat16* at(int i, int n, int k) const {
    return buffer(i) + (k / kRows) * kBlock + n * kSrcRow + k % kRows;
  }

  // This warp's fragments of rows [row0, row0 + 80) of W (transposed: of W^T) at the columns
  // of slice w: fragment i (m-tile i / 5, k-step i % 5) in registers for i < kRegFrags, else
  // at position i - kRegFrags of the warp's shared-memory fragments.
  __device__ void load_weights(const __nv_bfloat16* w, bool transposed) {
    uint4* dst = weights() + warp() * kWFrags * 32 + lane();
#pragma unroll
    for (int i = 0; i < kFrags; ++i) {
      uint32_t f[1][1][4];
      load_a(f, w, kDim, row0 + 16 * (i / kSliceSteps), warp() * kRows + 16 * (i % kSliceSteps),
             transposed);
      if (i < kRegFrags) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[i][j] = f[0][0][j];
      } else {
        dst[(i - kRegFrags) * 32] = make_uint4(f[0][0][0], f[0][0][1], f[0][0][2], f[0][0][3]);
      }
    }
  }

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

  // Stage step t of the inputs into input buffer i (live batch columns), one cp.async group,
  // issued from the last warps (as the cluster design at 8 columns).
  template <class A>
  __device__ void stage_inputs(int i, const A& p, int t, bool skip) {
    const int batch = p.batch;
    __nv_bfloat16* dst = stage() + (i % kStages) * kIn * kSlice;
    for (int c = kThreads - 1 - int(threadIdx.x); !skip && c < kIn * kChunks; c += kThreads) {
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
  __device__ static void wait_inputs() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kLead - 1) : "memory");
  }

  __device__ void expect(int e) {
    const int w = warp();
    if (lane() == 0 && w < kRanks) mbar_expect(&bar()[((e + 1) & 1) * kRanks + w], kBlockBytes);
  }
  __device__ void wait_source(int e, int src) const {
    mbar_wait(&bar()[((e + 1) & 1) * kRanks + src], (e >> 1) & 1);
  }

  // Partial products of this warp (all rows, the columns of slice w) with state buffer i, into
  // plane w of red. With e >= 0 the buffer is being filled by exchange e: the warp first waits
  // for slice w.
  template <class First>
  __device__ void multiply(int i, int e, First first) {
    const int lane_ = lane(), w = warp();
    if (e >= 0) {
      wait_source(e, w);
      jitter(e, 6 + w);
      first();
    }
    if constexpr (kNt == 1) {
      multiply_one(i);
    } else {
      multiply_two(i);
    }
  }

  // multiply's product at one n-tile (8 columns), k-step by k-step: five accumulator chains.
  __device__ void multiply_one(int i) {
    const int lane_ = lane(), w = warp();
    // ldmatrix.x4 of k-steps s, s + 1: lane l addresses row l % 8 (batch column) of matrix
    // l / 8, the 8 columns (l / 8) % 2 of k-step s + l / 16; the odd last k-step by .x2.
    const uint32_t src = smem_u32(buffer(i) + w * kBlock + (lane_ & 7) * kSrcRow +
                                  ((lane_ >> 3) & 1) * 8 + (lane_ >> 4) * 16);
    const uint4* wf = weights() + w * kWFrags * 32 + lane_;
    float acc[kTiles][4] = {};
#pragma unroll
    for (int s = 0; s < kSliceSteps; s += 2) {
      uint32_t b[4];
      if (s + 1 < kSliceSteps) {
        ldmatrix_x4(b, src + s * 32);
      } else {
        uint32_t b2[2];
        ldmatrix_x2(b2, src + s * 32);
        b[0] = b2[0];
        b[1] = b2[1];
        b[2] = b[3] = 0;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int st = s + h;
        if (st >= kSliceSteps) break;
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) {
          const int f = mt * kSliceSteps + st;
          if (f < kRegFrags) {
            mma(acc[mt], a[f], b[2 * h], b[2 * h + 1]);
          } else {
            const uint4 v = wf[(f - kRegFrags) * 32];
            const uint32_t fr[4] = {v.x, v.y, v.z, v.w};
            mma(acc[mt], fr, b[2 * h], b[2 * h + 1]);
          }
        }
      }
    }
    const int g = lane_ >> 2, q = lane_ & 3;
    float* r = red() + w * kBc * kRedStride;
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) {
      const int row = mt * 16 + g;
      r[(2 * q) * kRedStride + row] = acc[mt][0];
      r[(2 * q + 1) * kRedStride + row] = acc[mt][1];
      r[(2 * q) * kRedStride + row + 8] = acc[mt][2];
      r[(2 * q + 1) * kRedStride + row + 8] = acc[mt][3];
    }
  }

  // multiply's product at two n-tiles (kBc > 8), m-tile by m-tile: the B fragments of the five
  // k-steps first (one ldmatrix.x4 a k-step: lane l addresses batch column 8 (l / 16) + l % 8,
  // the last live column for those beyond kBc, the 8 columns (l / 8) % 2 of the k-step; b[s][0..1]
  // n-tile 0, b[s][2..3] n-tile 1), then for each m-tile its five fragments against both n-tiles
  // (two chains, 8 accumulators live). The partial sums of the columns beyond kBc are dropped.
  __device__ void multiply_two(int i) {
    const int lane_ = lane(), w = warp();
    const int n = min(((lane_ >> 4) << 3) + (lane_ & 7), kBc - 1);
    const uint32_t src = smem_u32(buffer(i) + w * kBlock + n * kSrcRow + ((lane_ >> 3) & 1) * 8);
    uint32_t b[kSliceSteps][4];
#pragma unroll
    for (int s = 0; s < kSliceSteps; ++s) ldmatrix_x4(b[s], src + s * 32);
    const uint4* wf = weights() + w * kWFrags * 32 + lane_;
    const int g = lane_ >> 2, q = lane_ & 3;
    float* r = red() + w * kBc * kRedStride;
    const bool second = 8 + 2 * q < kBc;  // this lane's columns of n-tile 1 are live
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) {
      float acc[2][4] = {};
#pragma unroll
      for (int st = 0; st < kSliceSteps; ++st) {
        const int f = mt * kSliceSteps + st;
        uint32_t fr[4];
        if (f < kRegFrags) {
#pragma unroll
          for (int j = 0; j < 4; ++j) fr[j] = a[f][j];
        } else {
          const uint4 v = wf[(f - kRegFrags) * 32];
          fr[0] = v.x, fr[1] = v.y, fr[2] = v.z, fr[3] = v.w;
        }
        mma(acc[0], fr, b[st][0], b[st][1]);
        mma(acc[1], fr, b[st][2], b[st][3]);
      }
      const int row = mt * 16 + g;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        if (nt == 1 && !second) break;
        float* c = r + (8 * nt + 2 * q) * kRedStride + row;
        c[0] = acc[nt][0];
        c[kRedStride] = acc[nt][1];
        c[8] = acc[nt][2];
        c[kRedStride + 8] = acc[nt][3];
      }
    }
  }

  // W h of row r for column n: the 16 slice planes, as four interleaved sums of four (a chain
  // of 16 dependent adds would sit on the step's critical path).
  __device__ float reduce(int n, int r) const {
    const float* partial = red() + n * kRedStride + r;
    float s[4] = {};
#pragma unroll
    for (int w = 0; w < kPlanes; ++w) s[w % 4] += partial[w * kBc * kRedStride];
    return (s[0] + s[1]) + (s[2] + s[3]);
  }

  // Element k of this thread: j = tid + 512 k of the slice (n = j / 80, r = j % 80), live
  // while j < 640.
  __device__ static bool live(int k) { return int(threadIdx.x) + k * kThreads < kSlice; }
  __device__ static int out_j(int k) { return live(k) ? int(threadIdx.x) + k * kThreads : 0; }
  __device__ static int out_n(int k) { return out_j(k) / kRows; }
  __device__ static int out_r(int k) { return out_j(k) % kRows; }
  __device__ bool owns(const Args& p, int k) const { return live(k) && n0 + out_n(k) < p.batch; }

  __device__ void store(const Args& p, __nv_bfloat16* x, const __nv_bfloat16 (&a_)[kPerThread]) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      if (owns(p, k)) x[size_t(n0 + out_n(k)) * kDim + row0 + out_r(k)] = a_[k];
  }

  __device__ __nv_bfloat16* slot(const Args& p, int e) const {
    return p.xchg + ((size_t(blockIdx.x) * 2 + ((e + 1) & 1)) * kBlock);
  }
  __device__ void publish(const Args& p, int e) const {
    fence_async_global();
    __syncthreads();
    if (int(threadIdx.x) == kThreads - 32)
      bulk_multicast(buffer(e + 1) + rank * kBlock, slot(p, e), kBlockBytes,
                     &bar()[((e + 1) & 1) * kRanks + rank], uint16_t((1u << kRanks) - 1));
  }
};

template <class Epi, bool kTrace, int kBc = kNarrow>
__global__ void __launch_bounds__(kThreads, 1) wide_forward(ArgsOf<Epi> p) {
  using C = Cta<Epi::kGates, false, kReadsPrevOf<Epi>, kRegFragsOf<Epi, false, kTrace, kBc>, kBc>;
  constexpr bool kPrev = kReadsPrevOf<Epi>;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  C cta(smem, cluster);
  stamp<kTrace>(p, 0);
  const size_t BD = size_t(p.batch) * kDim;

  for (int i = 0; i < C::kLead; ++i) cta.stage_inputs(i, p, i, i >= p.steps);
  cta.load_weights(p.w, false);
  for (int i = threadIdx.x; i < kBc * kDim; i += kThreads) {
    const int n = i / kDim, k = i % kDim;
    *cta.at(0, n, k) =
        cta.n0 + n < p.batch ? p.h0[size_t(cta.n0 + n) * kDim + k] : __float2bfloat16_rn(0.f);
  }
  float bias[C::kPerThread];
  float h_prev[kPrev ? C::kPerThread : 1];
#pragma unroll
  for (int k = 0; k < C::kPerThread; ++k) {
    const int n = C::out_n(k), r = C::out_r(k);
    bias[k] = to_float(p.b[cta.row0 + r]);
    const size_t off = size_t(cta.n0 + n) * kDim + cta.row0 + r;
    if (cta.owns(p, k)) p.h_all[off] = p.h0[off];
    if constexpr (kPrev) h_prev[k] = cta.owns(p, k) ? to_float(p.h0[off]) : 0.f;
  }
  C::wait_inputs();
  cluster.sync();

  for (int t = 0; t < p.steps; ++t) {
    const bool last = t + 1 == p.steps;
    mark<kTrace>(p, t, 0);
    jitter(t, 0);
    if (!last) cta.expect(t);
    jitter(t, 1);
    const __nv_bfloat16* in = cta.inputs(t);
    float pre_v[C::kPerThread];
    typename Epi::Pre pre[C::kPerThread];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int j = C::out_j(k);
      pre_v[k] = to_float(in[j]) + bias[k];
      Gates<Epi> g;
#pragma unroll
      for (int i = 0; i < Epi::kGates; ++i) g[i] = to_float(in[(1 + i) * C::kSlice + j]);
      pre[k] = Epi::prepare(g);
    }
    cta.stage_inputs(t + C::kLead, p, t + C::kLead, t + C::kLead >= p.steps);
    jitter(t, 2);
    if (t == 0) mark<kTrace>(p, t, 1);
    cta.multiply(t, t - 1, [&] { mark<kTrace>(p, t, 1); });
    mark<kTrace>(p, t, 2);
    jitter(t, 3);
    __syncthreads();  // partial sums complete
    mark<kTrace>(p, t, 3);
    __nv_bfloat16* slot = cta.slot(p, t);
    float wh[C::kPerThread];  // W h of every element first
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) wh[k] = cta.reduce(C::out_n(k), C::out_r(k));
    __nv_bfloat16 hb[C::kPerThread], ob[C::kPerThread], vb[kPrev ? C::kPerThread : 1];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      float h;
      if constexpr (kPrev) {
        const float v = Epi::act(wh[k] + pre_v[k]);
        h = Epi::blend(v, h_prev[k], pre[k]);
        h_prev[k] = h;
        vb[k] = __float2bfloat16_rn(v);
      } else {
        h = Epi::act(wh[k] + pre_v[k]);
      }
      hb[k] = __float2bfloat16_rn(h);
      ob[k] = __float2bfloat16_rn(Epi::output(h, pre[k]));
    }
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k)
      if (C::live(k)) slot[C::out_n(k) * C::kSrcRow + C::out_r(k)] = hb[k];
    mark<kTrace>(p, t, 4);
    jitter(t, 4);
    C::wait_inputs();
    if (!last) cta.publish(p, t);
    jitter(t, 5);
    mark<kTrace>(p, t, 5);
    cta.store(p, p.out + t * BD, ob);
    cta.store(p, p.h_all + (t + 1) * BD, hb);
    if constexpr (kPrev) cta.store(p, p.v_all + t * BD, vb);
  }
  cluster.sync();
  stamp<kTrace>(p, 1);
}

template <class Epi>
__global__ void __launch_bounds__(kThreads, 1) wide_backward(ArgsOf<Epi> p) {
  constexpr bool kPrev = kReadsPrevOf<Epi>;
  using C = Cta<Epi::kGates, true, kPrev, kRegFragsOf<Epi, true>>;  // 8 columns
  constexpr int kG = Epi::kGates;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  C cta(smem, cluster);
  const size_t BD = size_t(p.batch) * kDim;
  const int T = p.steps;
  auto none = [] {};

  for (int i = 0; i < C::kLead; ++i) cta.stage_inputs(i, p, T - 1 - i, i >= T);
  cta.load_weights(p.w, true);
  C::wait_inputs();
  cluster.sync();
  float carry[kPrev ? C::kPerThread : 1] = {};

  for (int u = 0; u < T; ++u) {
    const int t = T - 1 - u;
    jitter(u, 0);
    cta.expect(u);
    jitter(u, 1);
    cta.stage_inputs(u + C::kLead, p, t - C::kLead, u + C::kLead >= T);
    jitter(u, 2);
    if (u > 0) cta.multiply(u, u - 1, none);
    jitter(u, 3);
    const __nv_bfloat16* in = cta.inputs(u);
    float pre_c[C::kPerThread], pre_f[C::kPerThread];
    __nv_bfloat16 dgb[kG > 0 ? kG : 1][C::kPerThread];
    float pre_q[kPrev ? kG : 1][kPrev ? C::kPerThread : 1], pre_a[kPrev ? C::kPerThread : 1];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int j = C::out_j(k);
      const float d_out = to_float(in[j]), h = to_float(in[C::kSlice + j]);
      Gates<Epi> g, dg;
#pragma unroll
      for (int i = 0; i < kG; ++i) g[i] = to_float(in[(C::kGateAt + i) * C::kSlice + j]);
      if constexpr (kPrev) {
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
    float wv[C::kPerThread];  // W^T dv of every element first
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const size_t off = size_t(cta.n0 + C::out_n(k)) * kDim + cta.row0 + C::out_r(k);
      wv[k] = u > 0 ? cta.reduce(C::out_n(k), C::out_r(k))
                    : (cta.owns(p, k) ? to_float(p.d_hT[off]) : 0.f);
    }
    __nv_bfloat16 dvb[C::kPerThread];
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const float acc = wv[k];
      if constexpr (kPrev) {
        const float dh = acc + pre_c[k] + carry[k];
        dvb[k] = __float2bfloat16_rn(dh * pre_f[k]);
#pragma unroll
        for (int i = 0; i < kG; ++i) dgb[i][k] = __float2bfloat16_rn(dh * pre_q[i][k]);
        carry[k] = dh * pre_a[k];
      } else {
        dvb[k] = __float2bfloat16_rn((acc + pre_c[k]) * pre_f[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k)
      if (C::live(k)) slot[C::out_n(k) * C::kSrcRow + C::out_r(k)] = dvb[k];
    jitter(u, 4);
    C::wait_inputs();
    cta.publish(p, u);
    jitter(u, 5);
    cta.store(p, p.dv + t * BD, dvb);
#pragma unroll
    for (int i = 0; i < kG; ++i) cta.store(p, gate_grad<kG>(p, i) + t * BD, dgb[i]);
  }
  cta.multiply(T, T - 1, none);  // dh0 = W_h^T dv_0 (+ the carried direct term)
  __syncthreads();
#pragma unroll
  for (int k = 0; k < C::kPerThread; ++k) {
    const int n = C::out_n(k), r = C::out_r(k);
    float acc = cta.reduce(n, r);
    if constexpr (kPrev) acc += carry[k];
    if (cta.owns(p, k)) p.dh0[size_t(cta.n0 + n) * kDim + cta.row0 + r] = __float2bfloat16_rn(acc);
  }
  cluster.sync();
}

// ---- planning and launch ---------------------------------------------------------------
template <class Epi>
using KernelPtr = void (*)(ArgsOf<Epi>);

template <class Epi, bool kBackward, int kBc = kNarrow, bool kTrace = false>
using CtaOf = Cta<Epi::kGates, kBackward, kReadsPrevOf<Epi>,
                  kRegFragsOf<Epi, kBackward, kTrace, kBc>, kBc>;

// The kernel of a direction and column count: the backward at 8 columns only, the traced
// forward at 8 and in the development build only (else null).
template <class Epi>
KernelPtr<Epi> pick(bool backward, int bc, bool trace = false) {
  if (backward) return bc == kNarrow && !trace ? wide_backward<Epi> : nullptr;
  if (bc == kBroad) return trace ? nullptr : wide_forward<Epi, false, kBroad>;
#ifdef ELMAN_TRACE
  return trace ? wide_forward<Epi, true> : wide_forward<Epi, false>;
#else
  return trace ? nullptr : wide_forward<Epi, false>;
#endif
}

template <class Epi>
int smem_for(bool backward, int bc, bool trace = false) {
  if (backward) return CtaOf<Epi, true>::kSmem;
  if (bc == kBroad) return CtaOf<Epi, false, kBroad>::kSmem;
  return trace ? CtaOf<Epi, false, kNarrow, true>::kSmem : CtaOf<Epi, false>::kSmem;
}

template <class Epi>
cudaError_t launch(const PersistentPlan& plan, bool backward, cudaStream_t stream,
                   const ArgsOf<Epi>& args) {
  const bool trace = args.trace != nullptr;
  KernelPtr<Epi> k = pick<Epi>(backward, plan.bc, trace);
  if (k == nullptr) return cudaErrorInvalidValue;  // a trace asked of a build or width without it
  // The plan set the attributes of the untraced kernel, whose shared memory the traced one
  // may exceed (fewer fragments in registers).
  const int smem = trace ? smem_for<Epi>(backward, plan.bc, true) : plan.smem;
  if (trace) {
    const cudaError_t e = allow_cluster_launch(k, smem, plan.cluster);
    if (e != cudaSuccess) return e;
  }
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg =
      cluster_launch_config(plan.cluster, plan.clusters, kThreads, smem, stream, attr);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args);
  return e == cudaSuccess ? cudaGetLastError() : e;
}

// Clusters of the kernel (direction, columns) that the GPU holds at once (0: none), asked once
// per process, device and epilogue; the kernel's attributes are set on the way.
template <class Epi>
int active_clusters(bool backward, int bc) {
  static int active_cache[8][2][2];
  static bool cached[8][2][2];
  int dev = 0;
  cudaGetDevice(&dev);
  const bool broad = bc == kBroad;
  int& active = active_cache[dev & 7][backward][broad];
  if (!cached[dev & 7][backward][broad]) {
    cached[dev & 7][backward][broad] = true;
    active = 0;
    const int smem = smem_for<Epi>(backward, bc);
    KernelPtr<Epi> k = pick<Epi>(backward, bc);
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = cluster_launch_config(kRanks, 1, kThreads, smem, nullptr, attr);
    if (k == nullptr || allow_cluster_launch(k, smem, kRanks) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&active, k, &cfg) != cudaSuccess) {
      cudaGetLastError();
      active = 0;
    }
  }
  return active;
}

// The forward's columns forced by ELMAN_WIDE_COLUMNS (8 or 12), else 0.
inline int forced_columns() {
  const char* v = std::getenv(kColumnsEnv);
  const int bc = v != nullptr ? std::atoi(v) : 0;
  return bc == kNarrow || bc == kBroad ? bc : 0;
}

// Waves of clusters of bc columns that B columns take when the GPU holds `active` at once.
inline int waves(int batch, int bc, int active) {
  return ((batch + bc - 1) / bc + active - 1) / active;
}

// The wide design's plan for epilogue Epi (D = 1280, any B; in waves beyond what the GPU holds
// at once): the backward in clusters of 8 columns, the forward of 8 or 12, whichever takes
// fewer waves (on an H100, 7 clusters at once: 12 at every B > 56 but 85-112), 8 at a tie
// (its step is cheaper), unless ELMAN_WIDE_COLUMNS forces one; the traced forward takes 8.
template <class Epi>
PersistentPlan make_plan(int batch, int dim, bool backward, bool traced = false) {
  PersistentPlan plan;
  plan.design = "wide";
  if (!takes(dim)) { plan.reason = "the wide cluster design takes D = 1280"; return plan; }
  if (batch < 1) { plan.reason = "B must be at least 1"; return plan; }
  if (size_t(batch) * dim >= (size_t(1) << 31)) { plan.reason = "B * D must be below 2^31"; return plan; }
  plan.cluster = kRanks;
  int bc = kNarrow, active = active_clusters<Epi>(backward, kNarrow);
  if (!backward && !traced) {
    const int forced = forced_columns();
    const int broad = forced == kNarrow ? 0 : active_clusters<Epi>(false, kBroad);
    const bool fewer = broad > 0 && (active <= 0 || waves(batch, kBroad, broad) <
                                                        waves(batch, kNarrow, active));
    if (broad > 0 && (forced == kBroad || (!forced && fewer))) bc = kBroad, active = broad;
  }
  if (active <= 0) {
    plan.reason = "the GPU cannot hold one 16-CTA cluster of the wide design";
    return plan;
  }
  plan.ok = true;
  plan.bc = bc;
  plan.clusters = (batch + bc - 1) / bc;
  plan.smem = smem_for<Epi>(backward, bc);
  plan.max_active = active;
  const int block = bc == kBroad ? CtaOf<Epi, false, kBroad>::kBlock : CtaOf<Epi, false>::kBlock;
  plan.xchg_bytes = size_t(plan.clusters) * kRanks * 2 * block * 2;
  if (plan.clusters > active) plan.reason = "more clusters than fit at once: they run in waves";
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
  return launch<Epi>(plan, false, f.stream, a);
}

template <class Epi>
cudaError_t backward(const PersistentPlan& plan, const DenseBackward& g) {
  ArgsOf<Epi> a = {};
  set_backward<Epi::kGates>(a, g);
  set_candidate<Epi>(a, g.v_all);
  a.dim = g.dim;
  a.xchg = static_cast<__nv_bfloat16*>(g.xchg);
  return launch<Epi>(plan, true, g.stream, a);
}

}  // namespace
}  // namespace wide_design
}  // namespace elman
