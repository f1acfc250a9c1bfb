// The low-rank stage of E4, E5, E66 and E67lr: one elementwise kernel per step and direction
// (the products V h and U p around it are the caller's GEMMs). Math: stages.py.
#include <cuda_bf16.h>

#include "common/math.cuh"
#include "twogemm/stage.cuh"
#include "twogemm/twogemm.h"

namespace elman {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void lowrank_forward_kernel(int mode, int n, int dim, const T* __restrict__ a,
                                       const T* __restrict__ c, const T* __restrict__ q,
                                       const T* __restrict__ b, const T* __restrict__ h_prev,
                                       T* __restrict__ h_next, T* __restrict__ out, T* __restrict__ aux) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float pre = to_float(a[i]) + to_float(q[i]) + to_float(b[i % dim]);
  const float hp = mode == kTanhGate ? 0.f : to_float(h_prev[i]);
  const StageOut s = lowrank_stage(mode, pre, to_float(c[i]), hp);
  h_next[i] = from_float<T>(s.h);
  out[i] = from_float<T>(s.out);
  if (mode != kTanhGate) aux[i] = from_float<T>(s.aux);
}

template <typename T>
__global__ void lowrank_backward_kernel(int mode, int n, const T* __restrict__ d_out,
                                        const T* __restrict__ c, const T* __restrict__ h_prev,
                                        const T* __restrict__ h, const T* __restrict__ aux,
                                        const T* g, T* __restrict__ d_pre, T* __restrict__ d_c,
                                        T* g_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const bool gated = mode != kTanhGate;
  const StageGrad s = lowrank_stage_grad(mode, to_float(d_out[i]), to_float(c[i]),
                                         gated ? to_float(h_prev[i]) : 0.f, to_float(h[i]),
                                         gated ? to_float(aux[i]) : 0.f, to_float(g[i]));
  d_pre[i] = from_float<T>(s.d_pre);
  d_c[i] = from_float<T>(s.d_c);
  g_out[i] = from_float<T>(s.direct);
}

int blocks(int n) { return (n + kThreads - 1) / kThreads; }

}  // namespace

template <typename T>
cudaError_t lowrank_forward(int mode, int batch, int dim, const T* a, const T* c, const T* q,
                            const T* b, const T* h_prev, T* h_next, T* out, T* aux,
                            cudaStream_t stream) {
  const int n = batch * dim;
  lowrank_forward_kernel<T><<<blocks(n), kThreads, 0, stream>>>(mode, n, dim, a, c, q, b, h_prev,
                                                                h_next, out, aux);
  return cudaGetLastError();
}

template <typename T>
cudaError_t lowrank_backward(int mode, int batch, int dim, const T* d_out, const T* c,
                             const T* h_prev, const T* h, const T* aux, const T* g, T* d_pre,
                             T* d_c, T* g_out, cudaStream_t stream) {
  const int n = batch * dim;
  lowrank_backward_kernel<T><<<blocks(n), kThreads, 0, stream>>>(mode, n, d_out, c, h_prev, h,
                                                                 aux, g, d_pre, d_c, g_out);
  return cudaGetLastError();
}

#define ELMAN_LOWRANK(T)                                                                          \
  template cudaError_t lowrank_forward<T>(int, int, int, const T*, const T*, const T*, const T*, \
                                          const T*, T*, T*, T*, cudaStream_t);                   \
  template cudaError_t lowrank_backward<T>(int, int, int, const T*, const T*, const T*,          \
                                           const T*, const T*, const T*, T*, T*, T*, cudaStream_t);
ELMAN_LOWRANK(float)
ELMAN_LOWRANK(__nv_bfloat16)
#undef ELMAN_LOWRANK

}  // namespace elman
