// The dense family's per-step elementwise math (the "epilogue"), shared by the per-step
// kernels (dense_steps.cu) and the persistent kernels (dense_persistent.cu).
//
// A dense cell computes, per element of a [B, D] step:
//   forward : v = acc + wx + b;  h = act(v);  out = gate(h, z)
//   backward: dh = acc + d_out * dgate/dh;  dv = dh * act'(v);  dz = d_out * dgate/dz
// where acc is W_h h_{t-1} (forward) or W_h^T dv_{t+1} (backward). Each epilogue is a
// small struct; a new dense variant adds one struct and one id, not a new kernel. Besides
// forward and backward a struct gives their split forms, which the persistent kernels use to
// compute everything that does not depend on acc before acc arrives:
//   forward : pre = gate input (from z);            h = act(acc + wx + b), out = h * pre
//   backward: (c, f, dz) from d_out, h, z;           dv = (acc + c) * f
#pragma once

#include <cuda_bf16.h>

#include "dense.h"

namespace elman {

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// E0 and E1: h = tanh(v), out = h * silu(z). kApprox uses the hardware tanh for tanh and
// for the sigmoid (sigma(z) = (1 + tanh(z / 2)) / 2; relative error about 2^-11, below
// bf16's rounding); only the bf16 persistent kernels take it.
template <bool kApprox>
struct TanhSiluGateT {
  __device__ __forceinline__ static float sigmoid(float z) {
    return kApprox ? fmaf(0.5f, tanh_approx(0.5f * z), 0.5f) : sigmoidf(z);
  }
  __device__ __forceinline__ static float gate(float z) { return z * sigmoid(z); }
  __device__ __forceinline__ static float act(float v) { return kApprox ? tanh_approx(v) : tanhf(v); }
  __device__ __forceinline__ static void forward(float v, float z, float& h, float& out) {
    h = act(v);
    out = h * gate(z);
  }
  // h is the stored h_t (tanh'(v) = 1 - h^2): dv = (acc + c) * f.
  __device__ __forceinline__ static void backward_parts(float d_out, float h, float z, float& c,
                                                        float& f, float& dz) {
    const float s = sigmoid(z);
    const float dsilu = s * (1.f + z * (1.f - s));
    c = d_out * (z * s);
    f = 1.f - h * h;
    dz = d_out * h * dsilu;
  }
  __device__ __forceinline__ static void backward(float acc, float d_out, float h, float z,
                                                  float& dv, float& dz) {
    float c, f;
    backward_parts(d_out, h, z, c, f, dz);
    dv = (acc + c) * f;
  }
};
using TanhSiluGate = TanhSiluGateT<false>;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace elman
