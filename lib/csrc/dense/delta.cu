// The nonlinear-delta step kernels (E63 a/b/c/d, delta.h): one thread per element of the
// [B, D] state, templated on the mode so each kernel reads only the channels its mode has.
// Activations use the accurate tanhf/expf: the fp32 parity tolerance is 1e-5. The forward
// keeps the state's elementwise chain in an fp32 copy and stores the pre-activations, from
// which the backward recomputes the activations: in bf16, 1 - v^2 of a stored saturated
// tanh loses most of its digits, and E63d's state, which no gate contracts, would add one
// bf16 rounding per step.
#include <cuda_bf16.h>

#include "common/math.cuh"
#include "dense/delta.h"

namespace elman {
namespace {

constexpr int kBlock = 256;

template <int Mode> struct DeltaMode {
  static constexpr int G = Mode == 0 || Mode == 3 ? 2 : 3;  // input-side channels
  static constexpr int R = Mode == 2 ? 3 : 1;               // recurrent row blocks
};

__device__ __forceinline__ float sigmoid_exact(float x) { return 1.f / (1.f + expf(-x)); }

template <typename T, int Mode>
__global__ void step_forward(int n, int dim, const float* __restrict__ q, const T* __restrict__ pre,
                             float* __restrict__ state, T* __restrict__ h, T* __restrict__ out,
                             T* __restrict__ act) {
  using M = DeltaMode<Mode>;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int row = i / dim, j = i - row * dim;
  const size_t p = size_t(row) * M::G * dim + j, r = size_t(row) * M::R * dim + j;
  const float zv = to_float(pre[p]) + q[r];
  const float za = to_float(pre[p + dim]) + (M::R == 3 ? q[r + dim] : 0.f);
  const float v = tanhf(zv), alpha = sigmoid_exact(za);
  const float hp = state[i];
  float hv;
  if (Mode == 0) {
    hv = alpha * hp + (1.f - alpha) * v;
  } else if (Mode == 3) {
    hv = hp + alpha * v;
  } else {
    const float zb = to_float(pre[p + 2 * dim]) + (M::R == 3 ? q[r + 2 * dim] : 0.f);
    hv = alpha * hp + sigmoid_exact(zb) * v;
    act[p + 2 * dim] = from_float<T>(zb);
  }
  act[p] = from_float<T>(zv);
  act[p + dim] = from_float<T>(za);
  state[i] = hv;
  h[i] = from_float<T>(hv);
  out[i] = from_float<T>(hv * hv * sigmoid_exact(hv));
}

// dh = carry + d_out * d(h^2 sigmoid(h))/dh; writes the pre-activation gradients of step t
// and leaves dh * dh/dh_{t-1} (the elementwise part of the carry) in `carry`.
template <typename T, int Mode>
__global__ void step_backward(int n, int dim, float* __restrict__ carry, const T* __restrict__ d_out,
                              const T* __restrict__ h_prev, const T* __restrict__ h,
                              const T* __restrict__ act, T* __restrict__ d_pre) {
  using M = DeltaMode<Mode>;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int row = i / dim, j = i - row * dim;
  const size_t p = size_t(row) * M::G * dim + j;
  const float hv = to_float(h[i]), hp = to_float(h_prev[i]);
  const float s = sigmoid_exact(hv);
  const float dh = carry[i] + to_float(d_out[i]) * s * (2.f * hv + hv * hv * (1.f - s));
  const float v = tanhf(to_float(act[p])), alpha = sigmoid_exact(to_float(act[p + dim]));
  float dv, d_alpha, direct = dh * alpha;
  if (Mode == 0) {
    dv = dh * (1.f - alpha);
    d_alpha = dh * (hp - v);
  } else if (Mode == 3) {
    dv = dh * alpha;
    d_alpha = dh * v;
    direct = dh;
  } else {
    const float beta = sigmoid_exact(to_float(act[p + 2 * dim]));
    dv = dh * beta;
    d_alpha = dh * hp;
    d_pre[p + 2 * dim] = from_float<T>(dh * v * beta * (1.f - beta));
  }
  d_pre[p] = from_float<T>(dv * (1.f - v * v));
  d_pre[p + dim] = from_float<T>(d_alpha * alpha * (1.f - alpha));
  carry[i] = direct;
}

template <typename T>
__global__ void convert(int n, const T* __restrict__ src, float* __restrict__ dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = to_float(src[i]);
}

template <typename T>
__global__ void store(int n, const float* __restrict__ src, T* __restrict__ dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = from_float<T>(src[i]);
}

inline int blocks(int n) { return (n + kBlock - 1) / kBlock; }

}  // namespace

int delta_channels(int mode) { return mode == 0 || mode == 3 ? 2 : mode == 1 || mode == 2 ? 3 : -1; }
int delta_recurrent(int mode) { return mode == 2 ? 3 : mode >= 0 && mode < kDeltaModes ? 1 : -1; }

template <typename T>
cudaError_t delta_step_forward(cudaStream_t s, int mode, int batch, int dim, const float* q,
                               const T* pre, float* state, T* h, T* out, T* act) {
  const int n = batch * dim;
  switch (mode) {
    case 0: step_forward<T, 0><<<blocks(n), kBlock, 0, s>>>(n, dim, q, pre, state, h, out, act); break;
    case 1: step_forward<T, 1><<<blocks(n), kBlock, 0, s>>>(n, dim, q, pre, state, h, out, act); break;
    case 2: step_forward<T, 2><<<blocks(n), kBlock, 0, s>>>(n, dim, q, pre, state, h, out, act); break;
    case 3: step_forward<T, 3><<<blocks(n), kBlock, 0, s>>>(n, dim, q, pre, state, h, out, act); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t delta_step_backward(cudaStream_t s, int mode, int batch, int dim, float* carry,
                                const T* d_out, const T* h_prev, const T* h, const T* act,
                                T* d_pre) {
  const int n = batch * dim;
  switch (mode) {
    case 0:
      step_backward<T, 0><<<blocks(n), kBlock, 0, s>>>(n, dim, carry, d_out, h_prev, h, act, d_pre);
      break;
    case 1:
      step_backward<T, 1><<<blocks(n), kBlock, 0, s>>>(n, dim, carry, d_out, h_prev, h, act, d_pre);
      break;
    case 2:
      step_backward<T, 2><<<blocks(n), kBlock, 0, s>>>(n, dim, carry, d_out, h_prev, h, act, d_pre);
      break;
    case 3:
      step_backward<T, 3><<<blocks(n), kBlock, 0, s>>>(n, dim, carry, d_out, h_prev, h, act, d_pre);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t delta_convert(cudaStream_t s, int n, const T* src, float* dst) {
  convert<T><<<blocks(n), kBlock, 0, s>>>(n, src, dst);
  return cudaGetLastError();
}

template <typename T>
cudaError_t delta_store(cudaStream_t s, int n, const float* src, T* dst) {
  store<T><<<blocks(n), kBlock, 0, s>>>(n, src, dst);
  return cudaGetLastError();
}

#define INSTANTIATE(T)                                                                          \
  template cudaError_t delta_step_forward<T>(cudaStream_t, int, int, int, const float*, const T*, \
                                             float*, T*, T*, T*);                               \
  template cudaError_t delta_step_backward<T>(cudaStream_t, int, int, int, float*, const T*,     \
                                              const T*, const T*, const T*, T*);                \
  template cudaError_t delta_convert<T>(cudaStream_t, int, const T*, float*);                   \
  template cudaError_t delta_store<T>(cudaStream_t, int, const float*, T*);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

}  // namespace elman
