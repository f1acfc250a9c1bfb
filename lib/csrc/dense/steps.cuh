// One step's fused elementwise work on the per-step path of the dense family, as kernel
// templates over the epilogue (steps.cu instantiates them for the table; the loop with its
// cuBLAS GEMM per step is host code in steps.cpp).
#pragma once

#include <cuda_bf16.h>

#include "common/math.cuh"
#include "dense/dense.h"
#include "dense/epilogues.cuh"

namespace elman {
namespace steps_design {

constexpr int kBlock = 256;

template <typename T, class Epi>
__global__ void step_forward(int n, int dim, int splits, const float* __restrict__ acc,
                             const T* __restrict__ wx, StepGates<T> gates,
                             const T* __restrict__ b, T* __restrict__ h, T* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = 0.f;  // the GEMM's partial products, one per split of its inner dimension
  for (int s = 0; s < splits; ++s) sum += acc[size_t(s) * n + i];
  const float v = sum + to_float(wx[i]) + (b != nullptr ? to_float(b[i % dim]) : 0.f);
  Gates<Epi> g;
#pragma unroll
  for (int k = 0; k < Epi::kGates; ++k) g[k] = to_float(gates.p[k][i]);
  const float hv = Epi::act(v);
  h[i] = from_float<T>(hv);
  out[i] = from_float<T>(Epi::output(hv, Epi::prepare(g)));
}

template <typename T, class Epi>
__global__ void step_backward(int n, int splits, const float* __restrict__ acc32,
                              const T* __restrict__ accT, const T* __restrict__ d_out,
                              const T* __restrict__ h, StepGates<T> gates, T* __restrict__ dv,
                              StepGateGrads<T> d_gates) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = acc32 ? 0.f : to_float(accT[i]);
  for (int s = 0; acc32 && s < splits; ++s) acc += acc32[size_t(s) * n + i];
  const float d_out_i = to_float(d_out[i]), h_i = to_float(h[i]);
  Gates<Epi> g, dg;
#pragma unroll
  for (int k = 0; k < Epi::kGates; ++k) g[k] = to_float(gates.p[k][i]);
  float c, f;
  Epi::backward_parts(d_out_i, h_i, g, c, f, dg);
  dv[i] = from_float<T>((acc + c) * f);
#pragma unroll
  for (int k = 0; k < Epi::kGates; ++k) d_gates.p[k][i] = from_float<T>(dg[k]);
}

inline int blocks(int n) { return (n + kBlock - 1) / kBlock; }

template <typename T, class Epi>
cudaError_t forward(cudaStream_t stream, int n, int dim, int splits, const float* acc,
                    const T* wx, StepGates<T> gates, const T* b, T* h, T* out) {
  step_forward<T, Epi><<<blocks(n), kBlock, 0, stream>>>(n, dim, splits, acc, wx, gates, b, h, out);
  return cudaGetLastError();
}

template <typename T, class Epi>
cudaError_t backward(cudaStream_t stream, int n, int splits, const float* acc32, const T* accT,
                     const T* d_out, const T* h, StepGates<T> gates, T* dv,
                     StepGateGrads<T> d_gates) {
  step_backward<T, Epi><<<blocks(n), kBlock, 0, stream>>>(n, splits, acc32, accT, d_out, h, gates,
                                                          dv, d_gates);
  return cudaGetLastError();
}

}  // namespace steps_design
}  // namespace elman
