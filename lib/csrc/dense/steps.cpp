// The per-step path of the dense family (host code): for each step one cuBLAS GEMM on the
// hidden state (bf16 or fp32 operands, fp32 accumulate, fp32 result in a workspace) and
// one fused elementwise kernel (steps.cu). From D = 2048 the GEMM is split along its
// inner dimension into D / 512 batched GEMMs whose partial products the elementwise kernel
// sums: a B x D by D x D product is too small to fill the GPU, and cuBLAS alone runs it on
// few SMs, each streaming a large part of W_h. It takes any size and both dtypes; it
// is the documented baseline of the persistent kernels ("cuBLAS per step", also captured
// in a CUDA graph) and the path for sizes they do not take. Plain C++ with cuBLAS, no
// torch headers; kept out of the .cu files so that nvcc alone compiles those.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "dense/dense.h"

namespace elman {
namespace {

template <typename T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// C [D x B column-major = row-major B x D] = op(W) X, with W row-major [D][D]:
// forward W_h h needs op = T, backward W_h^T dv needs op = N.
template <typename T, typename TC>
cudaError_t gemm(cublasHandle_t h, bool transpose_w, int dim, int batch, const T* w,
                 const T* x, TC* c) {
  const float one = 1.f, zero = 0.f;
  const cublasStatus_t s = cublasGemmEx(
      h, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, dim, batch, dim, &one, w,
      cuda_type<T>(), dim, x, cuda_type<T>(), dim, &zero, c, cuda_type<TC>(), dim,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

// C_s = op(W)[:, K_s] X[K_s, :] for the `splits` column blocks K_s of op(W), into
// c + s * dim * batch (splits = 1: one plain GEMM).
template <typename T>
cudaError_t gemm_split(cublasHandle_t h, bool transpose_w, int dim, int batch, int splits,
                       const T* w, const T* x, float* c) {
  if (splits == 1) return gemm(h, transpose_w, dim, batch, w, x, c);
  const int k = dim / splits;
  const float one = 1.f, zero = 0.f;
  const cublasStatus_t s = cublasGemmStridedBatchedEx(
      h, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, dim, batch, k, &one, w,
      cuda_type<T>(), dim, transpose_w ? k : (long long)k * dim, x, cuda_type<T>(), dim, k,
      &zero, c, CUDA_R_32F, dim, (long long)dim * batch, splits, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

}  // namespace

// Measured (cuBLAS per step in a CUDA graph, B = 4 and 64, D = 2048): 2 to 8 splits take
// 10-17 % off a forward step, 4 is within 2 % of the best at both.
int dense_steps_splits(int dim) { return dim >= 2048 && dim % 512 == 0 ? dim / 512 : 1; }

template <typename T>
cudaError_t dense_steps_forward(cublasHandle_t handle, int epilogue, const DenseForward& a,
                                float* ws) {
  const size_t n = size_t(a.batch) * a.dim;
  const int dim = a.dim, splits = dense_steps_splits(dim);
  const T* wx = static_cast<const T*>(a.wx);
  const T* w_h = static_cast<const T*>(a.w_h);
  const T* b = static_cast<const T*>(a.b);
  T* out = static_cast<T*>(a.out);
  T* h_all = static_cast<T*>(a.h_all);
  cudaError_t err = cudaMemcpyAsync(h_all, a.h0, n * sizeof(T), cudaMemcpyDeviceToDevice, a.stream);
  for (int t = 0; t < a.steps && err == cudaSuccess; ++t) {
    err = gemm_split(handle, true, dim, a.batch, splits, w_h, h_all + t * n, ws);
    StepGates<T> g = {};
    for (int i = 0; i < kMaxGates; ++i)
      g.p[i] = a.gates[i] ? static_cast<const T*>(a.gates[i]) + t * n : nullptr;
    if (err == cudaSuccess)
      err = dense_step_forward<T>(a.stream, epilogue, int(n), dim, splits, ws, wx + t * n, g, b,
                                  h_all + (t + 1) * n, out + t * n);
  }
  return err;
}

template <typename T>
cudaError_t dense_steps_backward(cublasHandle_t handle, int epilogue, const DenseBackward& a,
                                 float* ws) {
  const size_t n = size_t(a.batch) * a.dim;
  const int dim = a.dim, splits = dense_steps_splits(dim);
  const T* w_h = static_cast<const T*>(a.w_h);
  const T* h_all = static_cast<const T*>(a.h_all);
  const T* d_out = static_cast<const T*>(a.d_out);
  T* dv = static_cast<T*>(a.dv);
  cudaError_t err = cudaSuccess;
  for (int t = a.steps - 1; t >= 0 && err == cudaSuccess; --t) {
    const bool last = t == a.steps - 1;
    if (!last) err = gemm_split(handle, false, dim, a.batch, splits, w_h, dv + (t + 1) * n, ws);
    StepGates<T> g = {};
    StepGateGrads<T> dg = {};
    for (int i = 0; i < kMaxGates; ++i) {
      g.p[i] = a.gates[i] ? static_cast<const T*>(a.gates[i]) + t * n : nullptr;
      dg.p[i] = a.d_gates[i] ? static_cast<T*>(a.d_gates[i]) + t * n : nullptr;
    }
    if (err == cudaSuccess)
      err = dense_step_backward<T>(a.stream, epilogue, int(n), splits, last ? nullptr : ws,
                                   last ? static_cast<const T*>(a.d_hT) : nullptr, d_out + t * n,
                                   h_all + (t + 1) * n, g, dv + t * n, dg);
  }
  return err == cudaSuccess ? gemm(handle, false, dim, a.batch, w_h, dv, static_cast<T*>(a.dh0))
                            : err;
}

template cudaError_t dense_steps_forward<float>(cublasHandle_t, int, const DenseForward&, float*);
template cudaError_t dense_steps_forward<__nv_bfloat16>(cublasHandle_t, int, const DenseForward&,
                                                        float*);
template cudaError_t dense_steps_backward<float>(cublasHandle_t, int, const DenseBackward&, float*);
template cudaError_t dense_steps_backward<__nv_bfloat16>(cublasHandle_t, int,
                                                         const DenseBackward&, float*);

}  // namespace elman
