// One step's fused elementwise work for the per-step path of the dense family (the loop
// with its cuBLAS GEMM per step is host code in dense_steps.cpp).
#include <cuda_bf16.h>

#include "dense.h"
#include "dense_cell.cuh"

namespace elman {
namespace {

constexpr int kBlock = 256;

template <typename T, class Epi>
__global__ void step_forward(int n, int dim, int splits, const float* __restrict__ acc,
                             const T* __restrict__ wx, const T* __restrict__ z,
                             const T* __restrict__ b, T* __restrict__ h, T* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = 0.f;  // the GEMM's partial products, one per split of its inner dimension
  for (int s = 0; s < splits; ++s) sum += acc[size_t(s) * n + i];
  const float v = sum + to_float(wx[i]) + to_float(b[i % dim]);
  float hv, o;
  Epi::forward(v, to_float(z[i]), hv, o);
  h[i] = from_float<T>(hv);
  out[i] = from_float<T>(o);
}

template <typename T, class Epi>
__global__ void step_backward(int n, int splits, const float* __restrict__ acc32,
                              const T* __restrict__ accT,
                              const T* __restrict__ d_out, const T* __restrict__ h,
                              const T* __restrict__ z, T* __restrict__ dv, T* __restrict__ dz) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = acc32 ? 0.f : to_float(accT[i]);
  for (int s = 0; acc32 && s < splits; ++s) acc += acc32[size_t(s) * n + i];
  float dvv, dzv;
  Epi::backward(acc, to_float(d_out[i]), to_float(h[i]), to_float(z[i]), dvv, dzv);
  dv[i] = from_float<T>(dvv);
  dz[i] = from_float<T>(dzv);
}

int blocks(int n) { return (n + kBlock - 1) / kBlock; }

}  // namespace

template <typename T>
cudaError_t dense_step_forward(cudaStream_t stream, int epilogue, int n, int dim, int splits,
                               const float* acc, const T* wx, const T* z, const T* b, T* h,
                               T* out) {
  if (epilogue != kTanhSiluGate) return cudaErrorInvalidValue;
  step_forward<T, TanhSiluGate><<<blocks(n), kBlock, 0, stream>>>(n, dim, splits, acc, wx, z, b,
                                                                  h, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t dense_step_backward(cudaStream_t stream, int epilogue, int n, int splits,
                                const float* acc32, const T* accT, const T* d_out, const T* h,
                                const T* z, T* dv, T* dz) {
  if (epilogue != kTanhSiluGate) return cudaErrorInvalidValue;
  step_backward<T, TanhSiluGate><<<blocks(n), kBlock, 0, stream>>>(n, splits, acc32, accT, d_out,
                                                                   h, z, dv, dz);
  return cudaGetLastError();
}

#define INSTANTIATE(T)                                                                        \
  template cudaError_t dense_step_forward<T>(cudaStream_t, int, int, int, int, const float*, \
                                             const T*, const T*, const T*, T*, T*);          \
  template cudaError_t dense_step_backward<T>(cudaStream_t, int, int, int, const float*,     \
                                              const T*, const T*, const T*, const T*, T*, T*);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

}  // namespace elman
