// The diagonal family's scan kernels, forward and backward, and their launchers.
//
// One launch walks the whole sequence. A thread owns kVec consecutive elements of the
// flattened [B * D] step (kVec divides D, so they belong to one sequence) and keeps their
// state in registers (fp32) for all T steps. Per step it reads each input once and writes
// out_t and h_t once; a warp's accesses are consecutive, so every load and store is coalesced.
// The loads do not depend on the state, so each thread keeps kDepth steps of inputs in flight
// in a register ring (loads for step t + kDepth are issued before step t is computed): the
// bytes in flight, about threads * kDepth * (bytes per step and thread), are what saturates
// HBM when B * D is too small to do it with one step's loads alone.
//
// The backward walks t = T - 1 .. 0 with the same layout. It reads h_{t-1} (h_all[t]) once;
// h_t is the previous iteration's h_{t-1}, kept in a register. d_params are summed over T in
// registers and written once per element as per-sequence partial sums (no atomics); Python
// sums them over B.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "diagonal/diagonal.h"
#include "diagonal/steps.cuh"

namespace elman {
namespace {

constexpr int kMaxThreads = 128;
// At most 128 registers per thread, so that 4 blocks of 128 fit on an SM: a scan's blocks
// must all be resident at once (a second wave would walk the whole sequence again).
constexpr int kMinBlocks = 4;

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T x[V];
};

template <class T, int V>
__device__ __forceinline__ Pack<T, V> load(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}
template <class T, int V>
__device__ __forceinline__ void store(T* p, int64_t i, const float (&v)[V]) {
  Pack<T, V> pk;
#pragma unroll
  for (int e = 0; e < V; ++e) pk.x[e] = from_float<T>(v[e]);
  *reinterpret_cast<Pack<T, V>*>(p + i) = pk;
}

// Steps of inputs in flight per thread: about 24 registers of ring, 2 to 8 steps (more made
// ptxas spill under the 128-register bound of the backward steps with parameters).
template <class T, int V, int kPacks>
constexpr int depth() {
  constexpr int regs = kPacks * ((int(sizeof(T)) * V + 3) / 4);
  constexpr int d = 24 / regs;
  return d < 2 ? 2 : (d > 8 ? 8 : d);
}

// c = h * silu(h) and its derivative.
__device__ __forceinline__ float out_of(float h, float s) { return h * h * s; }
__device__ __forceinline__ float dout_dh(float h, float s) { return h * s * (2.f + h * (1.f - s)); }

template <class S, class T, int V>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) scan_forward(DiagonalForward a) {
  constexpr int K = S::kInputs, P = S::kParams, kDepth = depth<T, V, K>();
  constexpr bool kApprox = std::is_same<T, __nv_bfloat16>::value;
  const int64_t n = int64_t(a.batch) * a.dim;
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  const int d = int(i % a.dim);
  const int steps = a.steps;
  const T* in[K];
#pragma unroll
  for (int k = 0; k < K; ++k) in[k] = static_cast<const T*>(a.inputs[k]);
  T* out = static_cast<T*>(a.out);
  T* h_all = static_cast<T*>(a.h_all);

  float q[V][P > 0 ? P : 1];
#pragma unroll
  for (int e = 0; e < V; ++e)
#pragma unroll
    for (int j = 0; j < P; ++j) q[e][j] = a.params[j][d + e];
  float h[V];
  {
    const auto pk = load<T, V>(static_cast<const T*>(a.h0), i);
#pragma unroll
    for (int e = 0; e < V; ++e) h[e] = to_float(pk.x[e]);
    store<T, V>(h_all, i, h);
  }

  // ring[p] holds step t0 + p; src[k] points at input k of step t0 + kDepth, the next refill.
  Pack<T, V> ring[kDepth][K];
  const T* src[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const T* base = in[k] + i;
#pragma unroll
    for (int p = 0; p < kDepth; ++p) {
      if (p < steps) ring[p][k] = load<T, V>(base, int64_t(p) * n);
    }
    src[k] = base + int64_t(kDepth) * n;
  }
  T* dst_out = out + i;
  T* dst_h = h_all + n + i;

  for (int t0 = 0; t0 < steps; t0 += kDepth) {
#pragma unroll
    for (int p = 0; p < kDepth; ++p) {
      const int t = t0 + p;
      if (t < steps) {
        Pack<T, V> cur[K];
#pragma unroll
        for (int k = 0; k < K; ++k) cur[k] = ring[p][k];
        if (t + kDepth < steps) {
#pragma unroll
          for (int k = 0; k < K; ++k) ring[p][k] = load<T, V>(src[k], 0);
        }
#pragma unroll
        for (int k = 0; k < K; ++k) src[k] += n;
        float o[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          Arr<K> u;
#pragma unroll
          for (int k = 0; k < K; ++k) u[k] = to_float(cur[k].x[e]);
          h[e] = S::forward(h[e], u, q[e]);
          o[e] = out_of(h[e], Act<kApprox>::sig(h[e]));
        }
        store<T, V>(dst_out, 0, o);
        store<T, V>(dst_h, 0, h);
        dst_out += n;
        dst_h += n;
      }
    }
  }
}

template <class S, class T, int V>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) scan_backward(DiagonalBackward a) {
  constexpr int K = S::kInputs, P = S::kParams, kDepth = depth<T, V, K + 2>();
  constexpr bool kApprox = std::is_same<T, __nv_bfloat16>::value;
  const int64_t n = int64_t(a.batch) * a.dim;
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  const int d = int(i % a.dim);
  const int steps = a.steps;
  const T* in[K];
  T* d_in[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    in[k] = static_cast<const T*>(a.inputs[k]);
    d_in[k] = static_cast<T*>(a.d_inputs[k]);
  }
  const T* h_all = static_cast<const T*>(a.h_all);
  const T* d_out = static_cast<const T*>(a.d_out);

  float q[V][P > 0 ? P : 1], dq[V][P > 0 ? P : 1];
#pragma unroll
  for (int e = 0; e < V; ++e)
#pragma unroll
    for (int j = 0; j < (P > 0 ? P : 1); ++j) {
      q[e][j] = j < P ? a.params[j][d + e] : 0.f;
      dq[e][j] = 0.f;
    }
  float h[V], dh[V];
  {
    const auto ph = load<T, V>(h_all, int64_t(steps) * n + i);
    const auto pd = load<T, V>(static_cast<const T*>(a.d_hT), i);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      h[e] = to_float(ph.x[e]);
      dh[e] = to_float(pd.x[e]);
    }
  }

  // ring[p] holds step t = T - 1 - (s0 + p): inputs 0..K-1, then d_out_t (K), then
  // h_{t-1} = h_all[t] (K + 1). src[] point at the step of the next refill, t - kDepth;
  // dst[] at step t's input gradients.
  Pack<T, V> ring[kDepth][K + 2];
  const T* src[K + 2];
  T* dst[K];
#pragma unroll
  for (int k = 0; k < K + 2; ++k) {
    const T* base = (k < K ? in[k] : (k == K ? d_out : h_all)) + i + int64_t(steps - 1) * n;
#pragma unroll
    for (int p = 0; p < kDepth; ++p) {
      if (p < steps) ring[p][k] = load<T, V>(base, -int64_t(p) * n);
    }
    src[k] = base - int64_t(kDepth) * n;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) dst[k] = d_in[k] + i + int64_t(steps - 1) * n;

  for (int s0 = 0; s0 < steps; s0 += kDepth) {
#pragma unroll
    for (int p = 0; p < kDepth; ++p) {
      const int s = s0 + p;
      if (s < steps) {
        Pack<T, V> cur[K + 2];
#pragma unroll
        for (int k = 0; k < K + 2; ++k) cur[k] = ring[p][k];
        if (s + kDepth < steps) {
#pragma unroll
          for (int k = 0; k < K + 2; ++k) ring[p][k] = load<T, V>(src[k], 0);
        }
#pragma unroll
        for (int k = 0; k < K + 2; ++k) src[k] -= n;
        float du[K][V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          Arr<K> u, g;
#pragma unroll
          for (int k = 0; k < K; ++k) u[k] = to_float(cur[k].x[e]);
          const float hp = to_float(cur[K + 1].x[e]);
          const float total = fmaf(to_float(cur[K].x[e]), dout_dh(h[e], Act<kApprox>::sig(h[e])), dh[e]);
          dh[e] = S::backward(hp, h[e], u, q[e], total, g, dq[e]);
#pragma unroll
          for (int k = 0; k < K; ++k) du[k][e] = g[k];
          h[e] = hp;
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
          store<T, V>(dst[k], 0, du[k]);
          dst[k] -= n;
        }
      }
    }
  }
  store<T, V>(static_cast<T*>(a.dh0), i, dh);
#pragma unroll
  for (int j = 0; j < P; ++j)
#pragma unroll
    for (int e = 0; e < V; ++e) a.d_params[int64_t(j) * n + i + e] = dq[e][j];
}

// ---- launch choice -------------------------------------------------------------------------
bool aligned(const void* p, int bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int sm_count() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Threads per block for `needed` threads: 128, fewer while that would leave SMs without a block.
ScanPlan shape_of(int64_t n, int vec, int sms) {
  const int64_t needed = (n + vec - 1) / vec;
  int threads = kMaxThreads;
  while (threads > 32 && (needed + threads - 1) / threads < sms) threads /= 2;
  return {vec, threads, int((needed + threads - 1) / threads)};
}

template <class K>
int resident(K kernel, int threads) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess) return 1;
  return blocks;
}

// The elements per thread: the narrowest width (1, 2 or 4: most threads, the most warps to
// hide a step's latency) whose blocks are all resident at once on the GPU (a second wave
// would walk the whole sequence again), among the widths that D and every pointer allow;
// the widest allowed when none fits in one wave. `kernel(v)` is the kernel of width v.
template <int N, class Kernel>
ScanPlan choose(int size, int64_t n, int dim, const void* const (&ptrs)[N], Kernel&& kernel) {
  const int sms = sm_count();
  ScanPlan widest = shape_of(n, 1, sms);
  for (const int v : {1, 2, 4}) {
    bool ok = dim % v == 0;
    for (const void* p : ptrs) ok = ok && aligned(p, v * size);
    if (!ok) continue;
    const ScanPlan plan = shape_of(n, v, sms);
    widest = plan;
    if (plan.blocks <= int64_t(sms) * kernel(v, plan.threads)) return plan;
  }
  return widest;
}

template <bool kBf16, class S>
ScanPlan plan_for(const DiagonalForward& a) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, float>;
  const void* const ptrs[] = {a.inputs[0], a.inputs[1], a.inputs[2], a.h0, a.out, a.h_all};
  return choose(int(sizeof(T)), int64_t(a.batch) * a.dim, a.dim, ptrs, [](int v, int threads) {
    return v == 4 ? resident(scan_forward<S, T, 4>, threads)
                  : v == 2 ? resident(scan_forward<S, T, 2>, threads) : resident(scan_forward<S, T, 1>, threads);
  });
}

template <bool kBf16, class S>
ScanPlan plan_for(const DiagonalBackward& a) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, float>;
  const void* const ptrs[] = {a.inputs[0], a.inputs[1], a.inputs[2], a.h_all, a.d_out,
                              a.d_hT,      a.d_inputs[0], a.d_inputs[1], a.d_inputs[2], a.dh0};
  return choose(int(sizeof(T)), int64_t(a.batch) * a.dim, a.dim, ptrs, [](int v, int threads) {
    return v == 4 ? resident(scan_backward<S, T, 4>, threads)
                  : v == 2 ? resident(scan_backward<S, T, 2>, threads) : resident(scan_backward<S, T, 1>, threads);
  });
}

template <class S, class T, int V>
void launch(const DiagonalForward& a, const ScanPlan& p) {
  scan_forward<S, T, V><<<p.blocks, p.threads, 0, a.stream>>>(a);
}
template <class S, class T, int V>
void launch(const DiagonalBackward& a, const ScanPlan& p) {
  scan_backward<S, T, V><<<p.blocks, p.threads, 0, a.stream>>>(a);
}

// Calls f(std::bool_constant<bf16>, S{}) with the step of `id`; false for an unknown id.
template <class A, class F>
bool with_types(int id, const A& a, F&& f) {
  if (a.bf16) return with_step<true>(id, [&](auto s) { f(std::true_type{}, s); });
  return with_step<false>(id, [&](auto s) { f(std::false_type{}, s); });
}

template <class A>
ScanPlan plan_of(int step, const A& a) {
  ScanPlan p{0, 0, 0};
  with_types(step, a, [&](auto bf16, auto s) { p = plan_for<decltype(bf16)::value, decltype(s)>(a); });
  return p;
}

template <class A>
cudaError_t run(int step, const A& a) {
  if (a.steps < 1 || a.batch < 1 || a.dim < 1) return cudaErrorInvalidValue;
  const bool found = with_types(step, a, [&](auto bf16, auto s) {
    constexpr bool kBf16 = decltype(bf16)::value;
    using S = decltype(s);
    using T = std::conditional_t<kBf16, __nv_bfloat16, float>;
    const ScanPlan p = plan_for<kBf16, S>(a);
    if (p.vec == 4) launch<S, T, 4>(a, p);
    else if (p.vec == 2) launch<S, T, 2>(a, p);
    else launch<S, T, 1>(a, p);
  });
  if (!found) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

template <class List>
struct Infos;
template <template <bool> class... S>
struct Infos<StepList<S...>> {
  static constexpr int count = sizeof...(S);
  static StepInfo at(int index) {
    const StepInfo all[] = {{S<false>::kId, S<false>::kName, S<false>::kInputs, S<false>::kParams}...};
    return all[index];
  }
};

}  // namespace

// ---- the table and the launchers, as the binding sees them -------------------------------
int diagonal_step_count() { return Infos<DiagonalSteps>::count; }
StepInfo diagonal_step_info(int index) { return Infos<DiagonalSteps>::at(index); }
StepInfo diagonal_step_of(int id) {
  for (int i = 0; i < diagonal_step_count(); ++i)
    if (diagonal_step_info(i).id == id) return diagonal_step_info(i);
  return {-1, "", 0, 0};
}

ScanPlan diagonal_plan(int step, const DiagonalForward& a) { return plan_of(step, a); }
ScanPlan diagonal_plan(int step, const DiagonalBackward& a) { return plan_of(step, a); }
cudaError_t diagonal_forward(int step, const DiagonalForward& a) { return run(step, a); }
cudaError_t diagonal_backward(int step, const DiagonalBackward& a) { return run(step, a); }

}  // namespace elman
