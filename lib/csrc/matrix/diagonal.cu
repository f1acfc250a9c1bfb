// E74's diagonal-state kernels (diagonal.h): one thread per channel runs the whole sequence; the
// forward stores the state after every step (one float per channel and step, the size of the
// output, so no checkpointing), the backward walks the steps in reverse reading them back.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/math.cuh"
#include "matrix/diagonal.h"

namespace elman {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float act(int step, float p) {
  if (step == 1) return p;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return tanh_approx(p);
  else return tanhf(p);
}

// p = A s + W of one channel and step.
__device__ __forceinline__ void coefficients(int rule, float c, float v, float k, float& A, float& W) {
  if (rule == kDiagDelta) A = 1.f - k * k, W = v * k;
  else if (rule == kDiagSimple) A = c, W = v * k;
  else A = c, W = (1.f - c) * v * k;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) forward_kernel(const DiagonalArgs a) {
  const int64_t ch = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (ch >= a.channels) return;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v_in);
  T* o = static_cast<T*>(a.o);
  float s = a.h0[ch];
  for (int t = 0; t < a.T; ++t) {
    const int64_t at = int64_t(t) * a.channels + ch;
    float A, W;
    coefficients(a.rule, a.c[at], to_float(v[at]), to_float(k[at]), A, W);
    s = act<T>(a.step, fmaf(A, s, W));
    a.states[at] = s;
    o[at] = from_float<T>(s * to_float(q[at]));
  }
  a.S_T[ch] = s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) backward_kernel(const DiagonalArgs a) {
  const int64_t ch = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (ch >= a.channels) return;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v_in);
  const T* d_o = static_cast<const T*>(a.d_o);
  T* dq = static_cast<T*>(a.dq);
  T* dk = static_cast<T*>(a.dk);
  T* dv = static_cast<T*>(a.dv);
  float ds = a.d_ST[ch];
  for (int t = a.T - 1; t >= 0; --t) {
    const int64_t at = int64_t(t) * a.channels + ch;
    const float s_new = a.states[at];
    const float s_old = t > 0 ? a.states[at - a.channels] : a.h0[ch];
    const float qq = to_float(q[at]), kk = to_float(k[at]), vv = to_float(v[at]), c = a.c[at];
    const float g = to_float(d_o[at]);
    ds = fmaf(qq, g, ds);
    dq[at] = from_float<T>(s_new * g);
    const float dp = a.step == 1 ? ds : ds * (1.f - s_new * s_new);
    float A, W;
    coefficients(a.rule, c, vv, kk, A, W);
    const float dA = dp * s_old;
    if (a.rule == kDiagDelta) {
      dk[at] = from_float<T>(-2.f * kk * dA + dp * vv);
      dv[at] = from_float<T>(dp * kk);
      a.dc[at] = 0.f;
    } else if (a.rule == kDiagSimple) {
      dk[at] = from_float<T>(dp * vv);
      dv[at] = from_float<T>(dp * kk);
      a.dc[at] = dA;
    } else {
      dk[at] = from_float<T>(dp * (1.f - c) * vv);
      dv[at] = from_float<T>(dp * (1.f - c) * kk);
      a.dc[at] = dA - dp * vv * kk;
    }
    ds = dp * A;
  }
  a.dh0[ch] = ds;
}

template <typename T>
cudaError_t launch(const DiagonalArgs& a, bool backward) {
  const unsigned blocks = unsigned((a.channels + kThreads - 1) / kThreads);
  if (backward) backward_kernel<T><<<blocks, kThreads, 0, a.stream>>>(a);
  else forward_kernel<T><<<blocks, kThreads, 0, a.stream>>>(a);
  return cudaGetLastError();
}

cudaError_t run(const DiagonalArgs& a, bool backward) {
  if (a.T < 1 || a.channels < 1 || a.rule < 0 || a.rule >= kDiagonalRules || a.step < 0 || a.step > 1)
    return cudaErrorInvalidValue;
  return a.bf16 ? launch<__nv_bfloat16>(a, backward) : launch<float>(a, backward);
}

}  // namespace

cudaError_t diagonal_forward(const DiagonalArgs& a) { return run(a, false); }
cudaError_t diagonal_backward(const DiagonalArgs& a) { return run(a, true); }

}  // namespace elman
