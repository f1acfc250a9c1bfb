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

// The same forward stage in three pieces, for a kernel that computes the new state first and
// the outputs later (persistent.cu's forward); the arithmetic is lowrank_stage's.
// The gate: the part that reads only c (tanh_gate silu(c), gated_tanh sigmoid(c)).
template <int kMode>
__device__ __forceinline__ float lowrank_gate(float c) {
  if (kMode == kTanhGate) return silu_f(c);
  if (kMode == kGatedTanh) return sigmoid_f(c);
  return 0.f;
}
struct StageState {
  float h, aux;
};
// h = alpha hp + (1 - alpha) x with the one fused multiply-add nvcc forms in lowrank_stage.
__device__ __forceinline__ float lowrank_mix(float alpha, float hp, float x) {
  return __fmaf_rn(hp, alpha, __fmul_rn(1.f - alpha, x));
}
template <int kMode>
__device__ __forceinline__ StageState lowrank_state(float pre, float gate, float c, float hp) {
  if (kMode == kTanhGate) return {tanhf(pre), 0.f};
  if (kMode == kGatedTanh) {
    const float v = tanhf(pre);
    return {lowrank_mix(gate, hp, v), v};
  }
  const float alpha = sigmoid_f(pre);
  return {lowrank_mix(alpha, hp, c), alpha};
}
template <int kMode>
__device__ __forceinline__ float lowrank_output(float h, float gate) {
  return kMode == kTanhGate ? h * gate : h * silu_f(h);
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
