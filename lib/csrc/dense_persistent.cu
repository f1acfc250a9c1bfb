// Persistent kernels of the dense family (bf16, sm_90): one launch runs the whole sequence.
//
// A thread-block cluster of C = D / 64 CTAs holds W_h (forward) or W_h^T (backward) in
// registers for the whole sequence: CTA r owns rows [64 r, 64 r + 64); its 16 warps form a
// 2 x 8 grid, warp (m, k) holding rows [32 m, 32 m + 32) of the slice for one eighth of the
// columns as mma.sync A fragments. Each cluster
// owns `bc` (8 or 16) batch columns; clusters never talk to each other. Per step a CTA
//   1. waits until the previous state (all D rows, bf16) has arrived in its shared memory;
//   2. multiplies its rows by it with mma.m16n8k16 (fp32 accumulate), one partial per warp;
//   3. sums the 8 partials of each row and applies the epilogue (bias, tanh, gate; or in backward the
//      gate and tanh gradients), writing outputs to global memory;
//   4. sends its 64-row slice of the new state to every CTA of the cluster with st.async
//      (16-byte distributed-shared-memory stores that count their bytes on the receiver's
//      mbarrier), into the other half of a double buffer.
// No cluster-wide barrier runs per step: a receiver knows a state is complete when its own
// mbarrier has counted all its bytes. The double buffer is safe: a CTA sends state s + 2
// into the buffer that held state s only after it received state s + 1 from every CTA,
// and each CTA sends s + 1 only after it finished reading s.
// Per-step inputs (W_x x and z, or d_out, h and z) are staged one step ahead with cp.async.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "dense.h"
#include "dense_cell.cuh"

namespace cg = cooperative_groups;

namespace elman {
namespace {

constexpr int kRows = 64;                 // rows of W_h per CTA (4 mma m-tiles)
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;                   // bf16 padding per state row (bank spread)
constexpr int kKGroups = 8;               // warps splitting the columns
constexpr int kMTiles = 2;                // 16-row mma tiles per warp (2 x 16 = half the rows)
constexpr int kRedStride = kRows + 4;     // floats per (k-group, batch) row of partial sums

struct Args {
  int steps, batch, dim;
  const __nv_bfloat16* w;                 // W_h [D][D]
  const __nv_bfloat16* b;                 // forward: bias [D]
  const __nv_bfloat16* wx;                // forward: W_x x [T][B][D]
  const __nv_bfloat16* z;                 // [T][B][D]
  const __nv_bfloat16* h0;                // forward: [B][D]
  __nv_bfloat16* out;                     // forward: [T][B][D]
  __nv_bfloat16* h_all;                   // [T+1][B][D] (written forward, read backward)
  const __nv_bfloat16* d_out;             // backward: [T][B][D]
  const __nv_bfloat16* d_hT;              // backward: [B][D]
  __nv_bfloat16* dv;                      // backward: [T][B][D]
  __nv_bfloat16* dz;                      // backward: [T][B][D]
  __nv_bfloat16* dh0;                     // backward: [B][D]
  long long* trace;                       // optional: per-step phase clocks of CTA 0
};

// Phases of a step recorded by `trace` (clock64 at each boundary, kTracePhases per step).
// After the T steps: clock64 and %globaltimer (ns) at kernel start and end, for the clock rate.
constexpr int kTracePhases = 6;  // start, state arrived, multiplied, inputs+partials ready,
                                 // epilogue done, sent

__device__ __forceinline__ long long globaltimer() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Trace marks read the pointer from the kernel parameters each time (no live register).
__device__ __forceinline__ bool tracing(const Args& p) {
  return p.trace != nullptr && blockIdx.x == 0 && threadIdx.x == 0;
}
__device__ __forceinline__ void mark(const Args& p, int step, int phase) {
  if (tracing(p)) p.trace[step * kTracePhases + phase] = clock64();
}
__device__ __forceinline__ void stamp(const Args& p, int slot) {
  if (tracing(p)) {
    p.trace[p.steps * kTracePhases + 2 * slot] = clock64();
    p.trace[p.steps * kTracePhases + 2 * slot + 1] = globaltimer();
  }
}
// ---- PTX helpers ------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)));
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// 16 bytes into another CTA's shared memory, counted on that CTA's mbarrier.
__device__ __forceinline__ void st_async(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(remote),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

// ---- the per-CTA machinery shared by forward and backward ---------------------------------
// KS = D / 256; NT = bc / 8 mma n-tiles; kIn staged input tensors.
template <int KS, int NT, int kIn>
struct Cta {
  static constexpr int kBc = NT * 8;
  static constexpr int kDim = KS * 256;
  static constexpr int kSteps = kDim / kKGroups / 16;          // mma k-steps per warp
  static constexpr int kRowElems = kDim + kPad;
  static constexpr int kStateElems = kBc * kRowElems;         // one state buffer
  static constexpr int kSlice = kBc * kRows;                   // one CTA's slice, elements
  static constexpr int kPerThread = kSlice / kThreads;         // outputs per thread (= NT)
  static constexpr int kChunks = kSlice / 8;                   // 16-byte chunks per slice

  // Shared memory: state[2] | red | stage[2][kIn] | slice | mbar[2]
  static constexpr int kRedOffset = 2 * kStateElems * 2;
  static constexpr int kStageOffset = kRedOffset + kKGroups * kBc * kRedStride * 4;
  static constexpr int kSliceOffset = kStageOffset + 2 * kIn * kSlice * 2;
  static constexpr int kBarOffset = kSliceOffset + kSlice * 2;
  static constexpr int kSmem = kBarOffset + 2 * 8;

  // Shared memory is addressed from one base, so the layout costs no registers.
  unsigned char* base;
  int ranks, row0, n0;
  uint32_t a[kMTiles][kSteps][4];  // A fragments: [m-tile][k-step][reg]

  __device__ __nv_bfloat16* state() const { return reinterpret_cast<__nv_bfloat16*>(base); }
  __device__ float* red() const { return reinterpret_cast<float*>(base + kRedOffset); }
  __device__ __nv_bfloat16* stage() const {
    return reinterpret_cast<__nv_bfloat16*>(base + kStageOffset);
  }
  __device__ __nv_bfloat16* slice() const {
    return reinterpret_cast<__nv_bfloat16*>(base + kSliceOffset);
  }
  __device__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base + kBarOffset); }
  __device__ static int lane() { return int(threadIdx.x) & 31; }
  __device__ static int kgroup() { return (int(threadIdx.x) >> 5) % kKGroups; }
  __device__ static int mrow0() { return (int(threadIdx.x) >> 5) / kKGroups * kMTiles * 16; }

  __device__ Cta(unsigned char* smem, const cg::cluster_group& cluster) : base(smem) {
    ranks = int(cluster.num_blocks());
    row0 = int(cluster.block_rank()) * kRows;
    n0 = int(blockIdx.x) / ranks * kBc;
    if (threadIdx.x == 0) {
      mbar_init(&bar()[0]);
      mbar_init(&bar()[1]);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
  }

  __device__ __nv_bfloat16* buffer(int i) const { return state() + (i & 1) * kStateElems; }
  __device__ const __nv_bfloat16* inputs(int i) const { return stage() + (i & 1) * kIn * kSlice; }

  // This warp's A fragments of rows [row0, row0 + 64) of W (transposed: of W^T).
  __device__ void load_weights(const __nv_bfloat16* w, bool transposed) {
    const int g = lane() >> 2, q = lane() & 3;
    const int k0 = kgroup() * (kDim / kKGroups);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = row0 + mrow0() + mt * 16 + g + ((r & 1) ? 8 : 0);
          const int col = k0 + s * 16 + 2 * q + ((r & 2) ? 8 : 0);
          const size_t lo = transposed ? size_t(col) * kDim + row : size_t(row) * kDim + col;
          const size_t hi = transposed ? size_t(col + 1) * kDim + row : size_t(row) * kDim + col + 1;
          a[mt][s][r] = pack(w[lo], w[hi]);
        }
  }

  // The staged [T][B][D] inputs, read from the kernel parameters when needed (they cost no
  // registers): forward wx, z; backward d_out, h (h_all shifted by one step), z.
  __device__ static const __nv_bfloat16* source(const Args& p, int k) {
    if (kIn == 2) return k == 0 ? p.wx : p.z;
    return k == 0 ? p.d_out : k == 1 ? p.h_all + size_t(p.batch) * kDim : p.z;
  }

  // Stage step t of the inputs into input buffer i (live batches only), as one cp.async
  // group; `skip` commits an empty group (keeps the group count uniform).
  __device__ void stage_inputs(int i, const Args& p, int t, bool skip) {
    const int batch = p.batch;
    __nv_bfloat16* dst = stage() + (i & 1) * kIn * kSlice;
    for (int c = threadIdx.x; !skip && c < kIn * kChunks; c += kThreads) {
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
  __device__ static void wait_inputs() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

  // Partial products of this warp's rows and columns with state buffer i, into
  // red[k-group][n][row].
  __device__ void multiply(int i) {
    const __nv_bfloat16* src = buffer(i);
    const int g = lane() >> 2, q = lane() & 3;
    const int k0 = kgroup() * (kDim / kKGroups);
    float acc[kMTiles][NT][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __nv_bfloat16* row = src + (nt * 8 + g) * kRowElems + k0 + s * 16 + 2 * q;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + 8);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) mma(acc[mt][nt], a[mt][s], b0, b1);
      }
    float* mine = red() + kgroup() * kBc * kRedStride;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int row = mrow0() + mt * 16 + g, col = nt * 8 + 2 * q;
        mine[col * kRedStride + row] = acc[mt][nt][0];
        mine[(col + 1) * kRedStride + row] = acc[mt][nt][1];
        mine[col * kRedStride + row + 8] = acc[mt][nt][2];
        mine[(col + 1) * kRedStride + row + 8] = acc[mt][nt][3];
      }
  }

  __device__ float reduce(int n, int r) const {
    float s = 0.f;
    const float* partial = red() + n * kRedStride + r;
#pragma unroll
    for (int w = 0; w < kKGroups; ++w) s += partial[w * kBc * kRedStride];
    return s;
  }

  // The receiver side of one state exchange into buffer i: expect the bytes of a whole state.
  __device__ void expect(int i) {
    if (threadIdx.x == 0) mbar_expect(&bar()[i & 1], kBc * kDim * 2);
  }
  // Wait for the exchange number `s` (0, 1, 2, ...) into buffer s + 1.
  __device__ void wait_state(int s) const { mbar_wait(&bar()[(s + 1) & 1], (s >> 1) & 1); }

  // Send this CTA's slice (gathered in `slice`) into buffer i of every CTA of the cluster.
  __device__ void send(int i) {
    __syncthreads();  // the slice is complete
    const uint32_t local = smem_u32(buffer(i));
    const uint32_t bar_local = smem_u32(&bar()[i & 1]);
    for (int c = threadIdx.x; c < ranks * kChunks; c += kThreads) {
      const int peer = c / kChunks, chunk = c % kChunks;
      const int n = chunk / (kRows / 8), r = (chunk % (kRows / 8)) * 8;
      const uint4 v = *reinterpret_cast<const uint4*>(slice() + n * kRows + r);
      const uint32_t dst = local + uint32_t((n * kRowElems + row0 + r) * 2);
      st_async(map_to_rank(dst, peer), v, map_to_rank(bar_local, peer));
    }
  }
};

template <int KS, int NT, class Epi>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(Args p) {
  using C = Cta<KS, NT, 2>;  // staged inputs: wx, z
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  C cta(smem, cluster);
  stamp(p, 0);
  const size_t BD = size_t(p.batch) * C::kDim;

  cta.stage_inputs(0, p, 0, false);
  cta.load_weights(p.w, false);
  for (int i = threadIdx.x; i < C::kBc * C::kDim; i += kThreads) {
    const int n = i / C::kDim, k = i % C::kDim;
    cta.buffer(0)[n * C::kRowElems + k] =
        cta.n0 + n < p.batch ? p.h0[size_t(cta.n0 + n) * C::kDim + k] : __float2bfloat16_rn(0.f);
  }
  // This thread finishes outputs (n, r) = (j / 64, j % 64) for j = tid + 512 i.
  float bias[C::kPerThread];
#pragma unroll
  for (int i = 0; i < C::kPerThread; ++i) {
    const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
    bias[i] = to_float(p.b[cta.row0 + r]);
    const size_t off = size_t(cta.n0 + n) * C::kDim + cta.row0 + r;
    if (cta.n0 + n < p.batch) p.h_all[off] = p.h0[off];
  }
  cluster.sync();  // barriers initialised and h0 in place in every CTA

  for (int t = 0; t < p.steps; ++t) {
    const bool last = t + 1 == p.steps;
    mark(p, t, 0);
    if (!last) cta.expect(t + 1);                 // h_t arrives in buffer t + 1
    cta.stage_inputs(t + 1, p, t + 1, last);
    if (t > 0) cta.wait_state(t - 1);             // h_{t-1} is complete
    mark(p, t, 1);
    cta.multiply(t);
    mark(p, t, 2);
    C::wait_inputs();
    __syncthreads();
    mark(p, t, 3);
    const __nv_bfloat16* in = cta.inputs(t);
#pragma unroll
    for (int i = 0; i < C::kPerThread; ++i) {
      const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
      float h, o;
      Epi::forward(cta.reduce(n, r) + to_float(in[j]) + bias[i], to_float(in[C::kSlice + j]), h, o);
      const __nv_bfloat16 hb = __float2bfloat16_rn(h);
      cta.slice()[j] = hb;
      if (cta.n0 + n < p.batch) {
        const size_t off = size_t(cta.n0 + n) * C::kDim + cta.row0 + r;
        p.out[t * BD + off] = __float2bfloat16_rn(o);
        p.h_all[(t + 1) * BD + off] = hb;
      }
    }
    mark(p, t, 4);
    if (!last) cta.send(t + 1);
    mark(p, t, 5);
  }
  cluster.sync();  // no CTA leaves while another may still address its shared memory
  stamp(p, 1);
}

template <int KS, int NT, class Epi>
__global__ void __launch_bounds__(kThreads, 1) backward_kernel(Args p) {
  using C = Cta<KS, NT, 3>;  // staged inputs: d_out_t, h_t (= h_all[t + 1]), z_t
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  C cta(smem, cluster);
  const size_t BD = size_t(p.batch) * C::kDim;
  const int T = p.steps;

  cta.stage_inputs(0, p, T - 1, false);
  cta.load_weights(p.w, true);
  cluster.sync();

  for (int u = 0; u < T; ++u) {  // u-th step from the end: t = T - 1 - u
    const int t = T - 1 - u;
    cta.expect(u + 1);                            // dv_t arrives in buffer u + 1
    cta.stage_inputs(u + 1, p, t > 0 ? t - 1 : 0, t == 0);
    if (u > 0) {
      cta.wait_state(u - 1);                      // dv_{t+1} is complete
      cta.multiply(u);
    }
    C::wait_inputs();
    __syncthreads();
    const __nv_bfloat16* in = cta.inputs(u);
#pragma unroll
    for (int i = 0; i < C::kPerThread; ++i) {
      const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
      const bool live = cta.n0 + n < p.batch;
      const size_t off = size_t(cta.n0 + n) * C::kDim + cta.row0 + r;
      const float acc = u > 0 ? cta.reduce(n, r) : (live ? to_float(p.d_hT[off]) : 0.f);
      float dv, dz;
      Epi::backward(acc, to_float(in[j]), to_float(in[C::kSlice + j]),
                    to_float(in[2 * C::kSlice + j]), dv, dz);
      const __nv_bfloat16 dvb = __float2bfloat16_rn(dv);
      cta.slice()[j] = dvb;
      if (live) {
        p.dv[t * BD + off] = dvb;
        p.dz[t * BD + off] = __float2bfloat16_rn(dz);
      }
    }
    cta.send(u + 1);
  }
  // dh0 = W_h^T dv_0, the exchange number T - 1.
  cta.wait_state(T - 1);
  cta.multiply(T);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < C::kPerThread; ++i) {
    const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
    const float acc = cta.reduce(n, r);
    if (cta.n0 + n < p.batch)
      p.dh0[size_t(cta.n0 + n) * C::kDim + cta.row0 + r] = __float2bfloat16_rn(acc);
  }
  cluster.sync();
}

// ---- planning and launch -------------------------------------------------------------
using KernelPtr = void (*)(Args);

template <class Epi>
KernelPtr pick(int ks, int nt, bool backward) {
#define ELMAN_CASE(KS, NT)                                                                   \
  if (ks == KS && nt == NT)                                                                  \
    return backward ? backward_kernel<KS, NT, Epi> : forward_kernel<KS, NT, Epi>;
  ELMAN_CASE(1, 1) ELMAN_CASE(1, 2) ELMAN_CASE(2, 1) ELMAN_CASE(2, 2)
  ELMAN_CASE(3, 1) ELMAN_CASE(3, 2) ELMAN_CASE(4, 1) ELMAN_CASE(4, 2)
#undef ELMAN_CASE
  return nullptr;
}

template <int KS>
int smem_for_ks(int nt, bool backward) {
  if (nt == 1) return backward ? Cta<KS, 1, 3>::kSmem : Cta<KS, 1, 2>::kSmem;
  return backward ? Cta<KS, 2, 3>::kSmem : Cta<KS, 2, 2>::kSmem;
}

int smem_for(int ks, int nt, bool backward) {
  switch (ks) {
    case 1: return smem_for_ks<1>(nt, backward);
    case 2: return smem_for_ks<2>(nt, backward);
    case 3: return smem_for_ks<3>(nt, backward);
    default: return smem_for_ks<4>(nt, backward);
  }
}

cudaError_t prepare(KernelPtr k, int smem, int cluster) {
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess && cluster > 8)
    e = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return e;
}

cudaLaunchConfig_t config(int cluster, int clusters, int smem, cudaStream_t stream,
                          cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster * clusters);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

cudaError_t launch(const PersistentPlan& plan, int dim, bool backward, cudaStream_t stream,
                   const Args& args) {
  KernelPtr k = pick<TanhSiluGateT<true>>(dim / 256, plan.bc / 8, backward);
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = config(plan.cluster, plan.clusters, plan.smem, stream, attr);
  
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args);  // attributes were set by the plan
  return e == cudaSuccess ? cudaGetLastError() : e;
}

}  // namespace

PersistentPlan dense_persistent_plan(int batch, int dim, bool backward) {
  PersistentPlan plan;
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major < 9) { plan.reason = "needs thread-block clusters (compute capability 9.0+)"; return plan; }
  if (dim % 256 != 0 || dim < 256 || dim > 1024) {
    plan.reason = "D must be 256, 512, 768 or 1024 (W_h must fit in one cluster's registers)";
    return plan;
  }
  if (batch < 1) { plan.reason = "B must be at least 1"; return plan; }
  if (size_t(batch) * dim >= (size_t(1) << 31)) { plan.reason = "B * D must be below 2^31"; return plan; }
  plan.cluster = dim / kRows;
  // Clusters of each shape the GPU holds at once, asked once per process and device.
  static int active_cache[8][5][3][2];
  static bool cached[8][5][3][2];
  for (int nt = 1; nt <= 2; ++nt) {
    const int smem = smem_for(dim / 256, nt, backward);
    int& active = active_cache[dev & 7][dim / 256][nt][backward];
    if (!cached[dev & 7][dim / 256][nt][backward]) {
      cached[dev & 7][dim / 256][nt][backward] = true;
      active = 0;
      KernelPtr k = pick<TanhSiluGateT<true>>(dim / 256, nt, backward);
      cudaLaunchAttribute attr[1];
      cudaLaunchConfig_t cfg = config(plan.cluster, 1, smem, nullptr, attr);
      if (prepare(k, smem, plan.cluster) != cudaSuccess ||
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
      if (clusters > active) plan.reason = "more clusters than fit at once: they run in waves";
      return plan;
    }
  }
  plan.reason = "the GPU cannot hold one cluster of this shape (registers / shared memory)";
  return plan;
}

cudaError_t dense_persistent_forward(cudaStream_t stream, int epilogue, int steps, int batch,
                                     int dim, const void* wx, const void* z, const void* w_h,
                                     const void* b, const void* h0, void* out, void* h_all,
                                     long long* trace) {
  if (epilogue != kTanhSiluGate) return cudaErrorInvalidValue;
  const PersistentPlan plan = dense_persistent_plan(batch, dim, false);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  Args a = {};
  a.steps = steps; a.batch = batch; a.dim = dim;
  a.w = static_cast<const __nv_bfloat16*>(w_h);
  a.b = static_cast<const __nv_bfloat16*>(b);
  a.wx = static_cast<const __nv_bfloat16*>(wx);
  a.z = static_cast<const __nv_bfloat16*>(z);
  a.h0 = static_cast<const __nv_bfloat16*>(h0);
  a.out = static_cast<__nv_bfloat16*>(out);
  a.h_all = static_cast<__nv_bfloat16*>(h_all);
  a.trace = trace;
  return launch(plan, dim, false, stream, a);
}

cudaError_t dense_persistent_backward(cudaStream_t stream, int epilogue, int steps, int batch,
                                      int dim, const void* w_h, const void* h_all,
                                      const void* z, const void* d_out, const void* d_hT,
                                      void* dv, void* dz, void* dh0) {
  if (epilogue != kTanhSiluGate) return cudaErrorInvalidValue;
  const PersistentPlan plan = dense_persistent_plan(batch, dim, true);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  Args a = {};
  a.steps = steps; a.batch = batch; a.dim = dim;
  a.w = static_cast<const __nv_bfloat16*>(w_h);
  a.z = static_cast<const __nv_bfloat16*>(z);
  a.h_all = static_cast<__nv_bfloat16*>(const_cast<void*>(h_all));
  a.d_out = static_cast<const __nv_bfloat16*>(d_out);
  a.d_hT = static_cast<const __nv_bfloat16*>(d_hT);
  a.dv = static_cast<__nv_bfloat16*>(dv);
  a.dz = static_cast<__nv_bfloat16*>(dz);
  a.dh0 = static_cast<__nv_bfloat16*>(dh0);
  return launch(plan, dim, true, stream, a);
}

}  // namespace elman
