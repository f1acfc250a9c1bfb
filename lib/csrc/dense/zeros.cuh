// The bias of a call without one (b = null, as E39): the persistent kernels read a vector of
// zeros rather than test the pointer, so their code is that of a call with a bias.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace elman {

constexpr int kMaxPersistentDim = 2048;
static __device__ __nv_bfloat16 dense_zero_bias[kMaxPersistentDim];  // zero-initialised

inline const __nv_bfloat16* bias_or_zeros(const void* b) {
  if (b != nullptr) return static_cast<const __nv_bfloat16*>(b);
  void* zeros = nullptr;
  cudaGetSymbolAddress(&zeros, dense_zero_bias);
  return static_cast<const __nv_bfloat16*>(zeros);
}

}  // namespace elman
