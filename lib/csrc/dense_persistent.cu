// Persistent kernels of the dense family (bf16, sm_90): one launch runs the whole sequence.
//
// A thread-block cluster of C = D / 64 CTAs holds W_h (forward) or W_h^T (backward) in
// registers for the whole sequence: CTA r owns rows [64 r, 64 r + 64) and its 16 warps each
// hold those rows for one sixteenth of the columns as mma.sync A fragments. Each cluster
// owns `bc` (8 or 16) batch columns; clusters never talk to each other. Per step a CTA
//   1. multiplies its rows by the previous state h_{t-1} (all D, bf16, in its shared memory)
//      with mma.m16n8k16 (fp32 accumulate), one partial sum per warp;
//   2. sums the 16 partials in shared memory and applies the epilogue (bias, tanh, gate;
//      or in backward the gate and tanh gradients), writing outputs to global memory;
//   3. writes its 64-row slice of the new state into the shared memory of every CTA of the
//      cluster (distributed shared memory), into the other half of a double buffer;
//   4. waits at one cluster barrier.
// The double buffer makes one barrier per step enough: a CTA writes buffer (t+1)&1 only
// after the barrier of step t, which every CTA reaches after its last read of that buffer.
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
constexpr int kRedStride = kRows + 4;     // floats per (warp, batch) row of partial sums

struct Args {
  int steps, batch, dim, bc;
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
};

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

// The per-CTA machinery shared by forward and backward. KS = D / 256 k-steps of 16 per
// warp; NT = bc / 8 mma n-tiles.
template <int KS, int NT>
struct Tile {
  static constexpr int kBc = NT * 8;
  static constexpr int kDim = KS * 256;
  static constexpr int kRowElems = kDim + kPad;
  // Outputs (row, batch) each thread finishes per step.
  static constexpr int kPerThread = kRows * kBc / kThreads;

  uint32_t a[4][KS][4];  // A fragments: [m-tile][k-step][reg]

  // Load this warp's fragments of rows [row0, row0 + 64) of W (transposed: of W^T).
  __device__ void load_weights(const __nv_bfloat16* w, int row0, int warp, int lane,
                               bool transposed) {
    const int g = lane >> 2, q = lane & 3;
    const int k0 = warp * (kDim / kWarps);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int s = 0; s < KS; ++s)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = row0 + mt * 16 + g + ((r & 1) ? 8 : 0);
          const int col = k0 + s * 16 + 2 * q + ((r & 2) ? 8 : 0);
          const __nv_bfloat16 lo = transposed ? w[size_t(col) * kDim + row] : w[size_t(row) * kDim + col];
          const __nv_bfloat16 hi =
              transposed ? w[size_t(col + 1) * kDim + row] : w[size_t(row) * kDim + col + 1];
          a[mt][s][r] = pack(lo, hi);
        }
  }

  // Partial products of this warp's columns with the state in `state` ([bc][kRowElems]),
  // written to red[warp][batch][row].
  __device__ void multiply(const __nv_bfloat16* state, float* red, int warp, int lane) const {
    const int g = lane >> 2, q = lane & 3;
    const int k0 = warp * (kDim / kWarps);
    float acc[4][NT][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.f;
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __nv_bfloat16* row = state + (nt * 8 + g) * kRowElems + k0 + s * 16 + 2 * q;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + 8);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) mma(acc[mt][nt], a[mt][s], b0, b1);
      }
    float* mine = red + warp * kBc * kRedStride;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int row = mt * 16 + g, col = nt * 8 + 2 * q;
        mine[col * kRedStride + row] = acc[mt][nt][0];
        mine[(col + 1) * kRedStride + row] = acc[mt][nt][1];
        mine[col * kRedStride + row + 8] = acc[mt][nt][2];
        mine[(col + 1) * kRedStride + row + 8] = acc[mt][nt][3];
      }
  }

  __device__ static float reduce(const float* red, int n, int r) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * kBc + n) * kRedStride + r];
    return s;
  }

  // Write a value of the new state (batch n, local row r) into every CTA of the cluster.
  __device__ static void broadcast(cg::cluster_group& cluster, __nv_bfloat16* state, int n,
                                   int global_row, __nv_bfloat16 v) {
    __nv_bfloat16* local = state + n * kRowElems + global_row;
    const int ranks = int(cluster.num_blocks());
    for (int p = 0; p < ranks; ++p) *cluster.map_shared_rank(local, p) = v;
  }
};

// Per-step inputs are staged in shared memory with cp.async one step ahead (double
// buffer), so that their global-memory latency hides behind the step before and they take
// no registers: [2][kInputs][bc][64] bf16.
template <int NT>
struct Stage {
  static constexpr int kBc = NT * 8;
  static constexpr int kPerTensor = kBc * kRows;
  static constexpr int kChunks = kBc * kRows / 8;  // 16-byte chunks per tensor

  // Copy step `t` of `count` [T][B][D] tensors into buffer `dst` (rows of live batches only).
  template <int kInputs>
  __device__ static void copy(__nv_bfloat16* dst, const __nv_bfloat16* const (&src)[kInputs],
                              int t, int batch, int dim, int n0, int row0) {
    for (int c = threadIdx.x; c < kInputs * kChunks; c += kThreads) {
      const int tensor = c / kChunks, chunk = c % kChunks;
      const int n = chunk / (kRows / 8), r = (chunk % (kRows / 8)) * 8;
      if (n0 + n >= batch) continue;
      const __nv_bfloat16* base = src[0];
#pragma unroll
      for (int k = 1; k < kInputs; ++k) base = tensor == k ? src[k] : base;  // no local memory
      const __nv_bfloat16* g = base + (size_t(t) * batch + n0 + n) * dim + row0 + r;
      const uint32_t s = uint32_t(__cvta_generic_to_shared(dst + tensor * kPerTensor + n * kRows + r));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  __device__ static void wait_previous() { asm volatile("cp.async.wait_group 1;\n" ::); }
};

template <int KS, int NT, class Epi>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(Args p) {
  using Tl = Tile<KS, NT>;
  using St = Stage<NT>;
  constexpr int kIn = 2;  // wx, z
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* state = reinterpret_cast<__nv_bfloat16*>(smem);  // [2][bc][kRowElems]
  float* red = reinterpret_cast<float*>(smem + 2 * Tl::kBc * Tl::kRowElems * 2);
  __nv_bfloat16* stage = reinterpret_cast<__nv_bfloat16*>(red + kWarps * Tl::kBc * kRedStride);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = int(cluster.block_rank()) * kRows;
  const int n0 = int(blockIdx.x / cluster.num_blocks()) * Tl::kBc;
  const size_t BD = size_t(p.batch) * Tl::kDim;
  const __nv_bfloat16* const inputs[kIn] = {p.wx, p.z};

  St::template copy<kIn>(stage, inputs, 0, p.batch, Tl::kDim, n0, row0);
  Tl tile;
  tile.load_weights(p.w, row0, warp, lane, false);
  for (int i = threadIdx.x; i < Tl::kBc * Tl::kDim; i += kThreads) {
    const int n = i / Tl::kDim, k = i % Tl::kDim;
    state[n * Tl::kRowElems + k] =
        n0 + n < p.batch ? p.h0[size_t(n0 + n) * Tl::kDim + k] : __float2bfloat16_rn(0.f);
  }
  // This thread finishes outputs (n, r) = (j / 64, j % 64) for j = tid + 512 i.
  float bias[Tl::kPerThread];
#pragma unroll
  for (int i = 0; i < Tl::kPerThread; ++i) {
    const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
    bias[i] = to_float(p.b[row0 + r]);
    if (n0 + n < p.batch) p.h_all[size_t(n0 + n) * Tl::kDim + row0 + r] = p.h0[size_t(n0 + n) * Tl::kDim + row0 + r];
  }
  cluster.sync();  // every CTA of the cluster is running and has its h0

  for (int t = 0; t < p.steps; ++t) {
    const __nv_bfloat16* cur = state + (t & 1) * Tl::kBc * Tl::kRowElems;
    __nv_bfloat16* nxt = state + ((t + 1) & 1) * Tl::kBc * Tl::kRowElems;
    const __nv_bfloat16* in = stage + (t & 1) * kIn * St::kPerTensor;
    St::template copy<kIn>(stage + ((t + 1) & 1) * kIn * St::kPerTensor, inputs,
                           t + 1 < p.steps ? t + 1 : t, t + 1 < p.steps ? p.batch : 0,
                           Tl::kDim, n0, row0);
    tile.multiply(cur, red, warp, lane);
    St::wait_previous();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Tl::kPerThread; ++i) {
      const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
      const float wx = to_float(in[n * kRows + r]);
      const float z = to_float(in[St::kPerTensor + n * kRows + r]);
      float h, o;
      Epi::forward(Tl::reduce(red, n, r) + wx + bias[i], z, h, o);
      const __nv_bfloat16 hb = __float2bfloat16_rn(h);
      if (n0 + n < p.batch) {
        const size_t off = size_t(n0 + n) * Tl::kDim + row0 + r;
        p.out[t * BD + off] = __float2bfloat16_rn(o);
        p.h_all[(t + 1) * BD + off] = hb;
      }
      Tl::broadcast(cluster, nxt, n, row0 + r, hb);
    }
    cluster.sync();
  }
}

template <int KS, int NT, class Epi>
__global__ void __launch_bounds__(kThreads, 1) backward_kernel(Args p) {
  using Tl = Tile<KS, NT>;
  using St = Stage<NT>;
  constexpr int kIn = 3;  // d_out_t, h_t (= h_all[t + 1]), z_t
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* state = reinterpret_cast<__nv_bfloat16*>(smem);  // dv_{t+1}, double buffer
  float* red = reinterpret_cast<float*>(smem + 2 * Tl::kBc * Tl::kRowElems * 2);
  __nv_bfloat16* stage = reinterpret_cast<__nv_bfloat16*>(red + kWarps * Tl::kBc * kRedStride);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = int(cluster.block_rank()) * kRows;
  const int n0 = int(blockIdx.x / cluster.num_blocks()) * Tl::kBc;
  const size_t BD = size_t(p.batch) * Tl::kDim;
  const int T = p.steps;
  // h_all shifted by one step, so that index t reads h_t = h_all[t + 1].
  const __nv_bfloat16* const inputs[kIn] = {p.d_out, p.h_all + BD, p.z};

  St::template copy<kIn>(stage, inputs, T - 1, p.batch, Tl::kDim, n0, row0);
  Tl tile;
  tile.load_weights(p.w, row0, warp, lane, true);
  cluster.sync();

  for (int u = 0; u < T; ++u) {  // u-th step from the end: t = T - 1 - u
    const int t = T - 1 - u;
    const __nv_bfloat16* cur = state + (u & 1) * Tl::kBc * Tl::kRowElems;
    __nv_bfloat16* nxt = state + ((u + 1) & 1) * Tl::kBc * Tl::kRowElems;
    const __nv_bfloat16* in = stage + (u & 1) * kIn * St::kPerTensor;
    St::template copy<kIn>(stage + ((u + 1) & 1) * kIn * St::kPerTensor, inputs,
                           t > 0 ? t - 1 : t, t > 0 ? p.batch : 0, Tl::kDim, n0, row0);
    if (u > 0) tile.multiply(cur, red, warp, lane);
    St::wait_previous();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Tl::kPerThread; ++i) {
      const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
      const bool live = n0 + n < p.batch;
      const size_t off = size_t(n0 + n) * Tl::kDim + row0 + r;
      const float acc = u > 0 ? Tl::reduce(red, n, r) : (live ? to_float(p.d_hT[off]) : 0.f);
      float dv, dz;
      Epi::backward(acc, to_float(in[n * kRows + r]), to_float(in[St::kPerTensor + n * kRows + r]),
                    to_float(in[2 * St::kPerTensor + n * kRows + r]), dv, dz);
      const __nv_bfloat16 dvb = __float2bfloat16_rn(dv);
      if (live) {
        p.dv[t * BD + off] = dvb;
        p.dz[t * BD + off] = __float2bfloat16_rn(dz);
      }
      Tl::broadcast(cluster, nxt, n, row0 + r, dvb);
    }
    cluster.sync();
  }
  // dh0 = W_h^T dv_0, which now sits in buffer T & 1.
  tile.multiply(state + (T & 1) * Tl::kBc * Tl::kRowElems, red, warp, lane);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < Tl::kPerThread; ++i) {
    const int j = threadIdx.x + i * kThreads, n = j / kRows, r = j % kRows;
    const float acc = Tl::reduce(red, n, r);
    if (n0 + n < p.batch) p.dh0[size_t(n0 + n) * Tl::kDim + row0 + r] = __float2bfloat16_rn(acc);
  }
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

int smem_for(int ks, int nt, bool backward) {
  const int bc = nt * 8;
  return 2 * bc * (ks * 256 + kPad) * 2 + kWarps * bc * kRedStride * 4 +
         2 * (backward ? 3 : 2) * bc * kRows * 2;
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
  KernelPtr k = pick<TanhSiluGate>(dim / 256, plan.bc / 8, backward);
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
  // Clusters of each shape the GPU holds at once, asked once per process (and device).
  static int active_cache[8][5][3][2];
  static bool cached[8][5][3][2];
  for (int nt = 1; nt <= 2; ++nt) {
    const int smem = smem_for(dim / 256, nt, backward);
    int& active = active_cache[dev & 7][dim / 256][nt][backward];
    if (!cached[dev & 7][dim / 256][nt][backward]) {
      cached[dev & 7][dim / 256][nt][backward] = true;
      active = 0;
      KernelPtr k = pick<TanhSiluGate>(dim / 256, nt, backward);
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
                                     const void* b, const void* h0, void* out, void* h_all) {
  if (epilogue != kTanhSiluGate) return cudaErrorInvalidValue;
  const PersistentPlan plan = dense_persistent_plan(batch, dim, false);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  Args a = {};
  a.steps = steps; a.batch = batch; a.dim = dim; a.bc = plan.bc;
  a.w = static_cast<const __nv_bfloat16*>(w_h);
  a.b = static_cast<const __nv_bfloat16*>(b);
  a.wx = static_cast<const __nv_bfloat16*>(wx);
  a.z = static_cast<const __nv_bfloat16*>(z);
  a.h0 = static_cast<const __nv_bfloat16*>(h0);
  a.out = static_cast<__nv_bfloat16*>(out);
  a.h_all = static_cast<__nv_bfloat16*>(h_all);
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
  a.steps = steps; a.batch = batch; a.dim = dim; a.bc = plan.bc;
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
