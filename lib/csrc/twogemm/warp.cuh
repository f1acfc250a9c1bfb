// Warp reductions and the in-warp softmax over a slot vector in shared memory, shared by the
// tape kernels (tape.cu: per step; tape_persistent.cu: the persistent forward).
#pragma once

#include <cmath>

namespace elman {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// By one whole warp: p[0..n) <- softmax(p[0..n)); lane l touches only p[l], p[l + 32], ...
__device__ __forceinline__ void softmax_warp(float* p, int n, int lane) {
  float mx = -INFINITY;
  for (int k = lane; k < n; k += 32) mx = fmaxf(mx, p[k]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int k = lane; k < n; k += 32) {
    const float e = expf(p[k] - mx);
    p[k] = e;
    sum += e;
  }
  const float inv = 1.f / warp_sum(sum);
  for (int k = lane; k < n; k += 32) p[k] *= inv;
}

}  // namespace elman
