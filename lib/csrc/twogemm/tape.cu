// E23's tape stages: one CTA per batch row. Slot scores are dot products of length D, one
// warp per slot (lanes stride over D, a shuffle reduction); warp 0 takes the softmax over the
// N slots in shared memory; then one thread per column d sweeps the N slots. Every element of
// M is read before any is written (a barrier separates the phases), so the write stage may
// update the tape in place. Math: stages.py.
#include <cuda_bf16.h>

#include "common/math.cuh"
#include "twogemm/stage.cuh"
#include "twogemm/twogemm.h"
#include "twogemm/warp.cuh"

namespace elman {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// In warp 0: q[k] <- p[k] (q[k] - sum_j p[j] q[j]) (the softmax's backward).
__device__ void softmax_grad_warp(const float* p, float* q, int n, int lane) {
  float dot = 0.f;
  for (int k = lane; k < n; k += 32) dot += p[k] * q[k];
  dot = warp_sum(dot);
  for (int k = lane; k < n; k += 32) q[k] = p[k] * (q[k] - dot);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tape_read_kernel(
    int slots, int dim, float scale, const T* __restrict__ wx, const T* __restrict__ z,
    const T* __restrict__ hw, const T* __restrict__ b, const T* __restrict__ m,
    const T* __restrict__ w_prev, T* __restrict__ w_out, T* __restrict__ out) {
  extern __shared__ float smem[];
  float* p = smem;
  const int row = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* mr = m + size_t(row) * slots * dim;
  const T* wp = w_prev + size_t(row) * dim;
  for (int k = warp; k < slots; k += kWarps) {
    float acc = 0.f;
    for (int d = lane; d < dim; d += 32) acc += to_float(mr[size_t(k) * dim + d]) * to_float(wp[d]);
    acc = warp_sum(acc);
    if (lane == 0) p[k] = acc * scale;
  }
  __syncthreads();
  if (warp == 0) softmax_warp(p, slots, lane);
  __syncthreads();
  const size_t base = size_t(row) * dim;
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    float r = 0.f;
    for (int k = 0; k < slots; ++k) r += p[k] * to_float(mr[size_t(k) * dim + d]);
    const float w = tanhf(to_float(hw[base + d]) + to_float(wx[base + d]) + r + to_float(b[d]));
    w_out[base + d] = from_float<T>(w);
    out[base + d] = from_float<T>(w * silu_f(to_float(z[base + d])));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tape_write_kernel(
    int slots, int dim, float scale, const T* m_in, const T* __restrict__ w,
    const T* __restrict__ u, T* m_out) {
  extern __shared__ float smem[];
  float* p = smem;
  const int row = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* mr = m_in + size_t(row) * slots * dim;
  T* mo = m_out + size_t(row) * slots * dim;
  const T* wr = w + size_t(row) * dim;
  const T* ur = u + size_t(row) * dim;
  for (int k = warp; k < slots; k += kWarps) {
    float acc = 0.f;
    for (int d = lane; d < dim; d += 32) acc += to_float(mr[size_t(k) * dim + d]) * to_float(wr[d]);
    acc = warp_sum(acc);
    if (lane == 0) p[k] = acc * scale;
  }
  __syncthreads();
  if (warp == 0) softmax_warp(p, slots, lane);
  __syncthreads();
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    const float ud = to_float(ur[d]);
    for (int k = 0; k < slots; ++k) {
      const size_t i = size_t(k) * dim + d;
      mo[i] = from_float<T>((1.f - p[k]) * to_float(mr[i]) + p[k] * ud);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tape_write_backward_kernel(
    int slots, int dim, float scale, const T* __restrict__ m, float* __restrict__ dm,
    const T* __restrict__ w, const T* __restrict__ u, const T* __restrict__ d_out,
    const T* __restrict__ z, const T* __restrict__ g, T* __restrict__ gw, T* __restrict__ du,
    T* __restrict__ dz) {
  extern __shared__ float smem[];
  float* beta = smem;
  float* de = smem + slots;
  const int row = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t base = size_t(row) * dim;
  const T* mr = m + base * slots;
  float* dmr = dm + base * slots;
  for (int k = warp; k < slots; k += kWarps) {
    float e = 0.f, db = 0.f;
    for (int d = lane; d < dim; d += 32) {
      const size_t i = size_t(k) * dim + d;
      const float mv = to_float(mr[i]);
      e += mv * to_float(w[base + d]);
      db += dmr[i] * (to_float(u[base + d]) - mv);
    }
    e = warp_sum(e);
    db = warp_sum(db);
    if (lane == 0) {
      beta[k] = e * scale;
      de[k] = db;
    }
  }
  __syncthreads();
  if (warp == 0) {
    softmax_warp(beta, slots, lane);
    __syncwarp();
    softmax_grad_warp(beta, de, slots, lane);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    const float wd = to_float(w[base + d]);
    float acc_u = 0.f, acc_m = 0.f;
    for (int k = 0; k < slots; ++k) {
      const size_t i = size_t(k) * dim + d;
      const float old = dmr[i];
      acc_u += beta[k] * old;
      acc_m += de[k] * to_float(mr[i]);
      dmr[i] = (1.f - beta[k]) * old + scale * de[k] * wd;
    }
    const float zd = to_float(z[base + d]), dout = to_float(d_out[base + d]);
    gw[base + d] = from_float<T>(to_float(g[base + d]) + dout * silu_f(zd) + scale * acc_m);
    dz[base + d] = from_float<T>(dout * wd * silu_grad_f(zd));
    du[base + d] = from_float<T>(acc_u);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tape_read_backward_kernel(
    int slots, int dim, float scale, const T* __restrict__ m, float* __restrict__ dm,
    const T* __restrict__ w_prev, const T* __restrict__ w, const T* __restrict__ gw,
    T* __restrict__ d_pre, T* __restrict__ g_out) {
  extern __shared__ float smem[];
  float* alpha = smem;
  float* da = smem + slots;
  const int row = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t base = size_t(row) * dim;
  const T* mr = m + base * slots;
  float* dmr = dm + base * slots;
  for (int k = warp; k < slots; k += kWarps) {
    float a = 0.f, dal = 0.f;
    for (int d = lane; d < dim; d += 32) {
      const float mv = to_float(mr[size_t(k) * dim + d]);
      const float wn = to_float(w[base + d]);
      a += mv * to_float(w_prev[base + d]);
      dal += mv * to_float(gw[base + d]) * (1.f - wn * wn);
    }
    a = warp_sum(a);
    dal = warp_sum(dal);
    if (lane == 0) {
      alpha[k] = a * scale;
      da[k] = dal;
    }
  }
  __syncthreads();
  if (warp == 0) {
    softmax_warp(alpha, slots, lane);
    __syncwarp();
    softmax_grad_warp(alpha, da, slots, lane);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    const float wn = to_float(w[base + d]), wp = to_float(w_prev[base + d]);
    const float dp = to_float(gw[base + d]) * (1.f - wn * wn);
    float acc = 0.f;
    for (int k = 0; k < slots; ++k) {
      const size_t i = size_t(k) * dim + d;
      acc += da[k] * to_float(mr[i]);
      dmr[i] += alpha[k] * dp + scale * da[k] * wp;
    }
    d_pre[base + d] = from_float<T>(dp);
    g_out[base + d] = from_float<T>(scale * acc);
  }
}

float scale_of(int dim) { return 1.f / std::sqrt(float(dim)); }

}  // namespace

template <typename T>
cudaError_t tape_read(int batch, int slots, int dim, const T* wx, const T* z, const T* hw,
                      const T* b, const T* m, const T* w_prev, T* w_out, T* out,
                      cudaStream_t stream) {
  tape_read_kernel<T><<<batch, kThreads, slots * sizeof(float), stream>>>(
      slots, dim, scale_of(dim), wx, z, hw, b, m, w_prev, w_out, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t tape_write(int batch, int slots, int dim, const T* m_in, const T* w, const T* u,
                       T* m_out, cudaStream_t stream) {
  tape_write_kernel<T><<<batch, kThreads, slots * sizeof(float), stream>>>(
      slots, dim, scale_of(dim), m_in, w, u, m_out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t tape_write_backward(int batch, int slots, int dim, const T* m, float* dm, const T* w,
                                const T* u, const T* d_out, const T* z, const T* g, T* gw, T* du,
                                T* dz, cudaStream_t stream) {
  tape_write_backward_kernel<T><<<batch, kThreads, 2 * slots * sizeof(float), stream>>>(
      slots, dim, scale_of(dim), m, dm, w, u, d_out, z, g, gw, du, dz);
  return cudaGetLastError();
}

template <typename T>
cudaError_t tape_read_backward(int batch, int slots, int dim, const T* m, float* dm,
                               const T* w_prev, const T* w, const T* gw, T* d_pre, T* g_out,
                               cudaStream_t stream) {
  tape_read_backward_kernel<T><<<batch, kThreads, 2 * slots * sizeof(float), stream>>>(
      slots, dim, scale_of(dim), m, dm, w_prev, w, gw, d_pre, g_out);
  return cudaGetLastError();
}

#define ELMAN_TAPE(T)                                                                              \
  template cudaError_t tape_read<T>(int, int, int, const T*, const T*, const T*, const T*,        \
                                    const T*, const T*, T*, T*, cudaStream_t);                    \
  template cudaError_t tape_write<T>(int, int, int, const T*, const T*, const T*, T*,             \
                                     cudaStream_t);                                               \
  template cudaError_t tape_write_backward<T>(int, int, int, const T*, float*, const T*,          \
                                              const T*, const T*, const T*, const T*, T*, T*, T*, \
                                              cudaStream_t);                                      \
  template cudaError_t tape_read_backward<T>(int, int, int, const T*, float*, const T*, const T*, \
                                             const T*, T*, T*, cudaStream_t);
ELMAN_TAPE(float)
ELMAN_TAPE(__nv_bfloat16)
#undef ELMAN_TAPE

}  // namespace elman
