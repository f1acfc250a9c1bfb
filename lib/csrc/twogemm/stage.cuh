// The low-rank stage's elementwise math (stages.py), shared by the per-step kernels
// (lowrank.cu) and the persistent kernels (persistent.cu). pre = a + q + b.
#pragma once

#include "twogemm/twogemm.h"

namespace elman {

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float x) {
  const float s = sigmoid_f(x);
  return s * (1.f + x * (1.f - s));
}

struct StageOut {
  float h, out, aux;  // aux: v (gated_tanh) or alpha (gated_alpha)
};

__device__ __forceinline__ StageOut lowrank_stage(int mode, float pre, float c, float hp) {
  if (mode == kTanhGate) {
    const float h = tanhf(pre);
    return {h, h * silu_f(c), 0.f};
  }
  float h, aux;
  if (mode == kGatedTanh) {
    const float v = tanhf(pre), alpha = sigmoid_f(c);
    h = alpha * hp + (1.f - alpha) * v;
    aux = v;
  } else {
    const float alpha = sigmoid_f(pre);
    h = alpha * hp + (1.f - alpha) * c;
    aux = alpha;
  }
  return {h, h * silu_f(h), aux};
}

struct StageGrad {
  float d_pre, d_c, direct;  // direct: the part of dL/dh_{t-1} that bypasses U V
};

// g: dL/dh_t from later steps (without this step's output).
__device__ __forceinline__ StageGrad lowrank_stage_grad(int mode, float dout, float c, float hp,
                                                       float h, float aux, float g) {
  if (mode == kTanhGate) {
    const float dh = g + dout * silu_f(c);
    return {dh * (1.f - h * h), dout * h * silu_grad_f(c), 0.f};
  }
  const float dh = g + dout * (silu_f(h) + h * silu_grad_f(h));  // d(h silu h)/dh
  if (mode == kGatedTanh) {
    const float alpha = sigmoid_f(c);
    return {dh * (1.f - alpha) * (1.f - aux * aux), dh * (hp - aux) * alpha * (1.f - alpha),
            dh * alpha};
  }
  return {dh * (hp - c) * aux * (1.f - aux), dh * (1.f - aux), dh * aux};
}

}  // namespace elman
