// The per-step loops of the nonlinear-delta op (E63, delta.h), host code: per step one cuBLAS
// GEMM with the stacked recurrent matrix W_rec (fp32 accumulate and result) and one fused
// elementwise kernel (delta.cu). The backward carries dh in fp32: each step's kernel leaves
// dh * dh_t/dh_{t-1} (its elementwise part) in the carry and the GEMM adds W_rec^T times the
// step's recurrent pre-activation gradients to it (beta = 1), so E63c's three blocks cost one
// GEMM in each direction. Plain C++ with cuBLAS, no torch headers.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "dense/delta.h"

namespace elman {
namespace {

template <typename T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

cudaError_t status(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

}  // namespace

template <typename T>
cudaError_t delta_steps_forward(cublasHandle_t handle, const DeltaForward& a) {
  const int G = delta_channels(a.mode), R = delta_recurrent(a.mode), D = a.dim, B = a.batch;
  if (G < 0 || R < 0) return cudaErrorInvalidValue;
  const size_t n = size_t(B) * D, np = n * G;
  const T* pre = static_cast<const T*>(a.pre);
  const T* w = static_cast<const T*>(a.w_rec);
  T* h_all = static_cast<T*>(a.h_all);
  T* out = static_cast<T*>(a.out);
  T* act = static_cast<T*>(a.act);
  const float one = 1.f, zero = 0.f;
  cudaError_t err = cudaMemcpyAsync(h_all, a.h0, n * sizeof(T), cudaMemcpyDeviceToDevice, a.stream);
  if (err == cudaSuccess) err = delta_convert<T>(a.stream, int(n), static_cast<const T*>(a.h0), a.state);
  for (int t = 0; t < a.steps && err == cudaSuccess; ++t) {
    // q [B][R D] = h_{t-1} W_rec^T: column-major, q^T = op_T(W_rec as D x R D) h^T.
    err = status(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, R * D, B, D, &one, w, cuda_type<T>(),
                              D, h_all + t * n, cuda_type<T>(), D, &zero, a.q, CUDA_R_32F, R * D,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (err == cudaSuccess)
      err = delta_step_forward<T>(a.stream, a.mode, B, D, a.q, pre + t * np, a.state,
                                  h_all + (t + 1) * n, out + t * n, act + t * np);
  }
  return err;
}

template <typename T>
cudaError_t delta_steps_backward(cublasHandle_t handle, const DeltaBackward& a) {
  const int G = delta_channels(a.mode), R = delta_recurrent(a.mode), D = a.dim, B = a.batch;
  if (G < 0 || R < 0) return cudaErrorInvalidValue;
  const size_t n = size_t(B) * D, np = n * G;
  const T* w = static_cast<const T*>(a.w_rec);
  const T* h_all = static_cast<const T*>(a.h_all);
  const T* act = static_cast<const T*>(a.act);
  const T* d_out = static_cast<const T*>(a.d_out);
  T* d_pre = static_cast<T*>(a.d_pre);
  const float one = 1.f;
  cudaError_t err = delta_convert<T>(a.stream, int(n), static_cast<const T*>(a.d_hT), a.carry);
  for (int t = a.steps - 1; t >= 0 && err == cudaSuccess; --t) {
    err = delta_step_backward<T>(a.stream, a.mode, B, D, a.carry, d_out + t * n, h_all + t * n,
                                 h_all + (t + 1) * n, act + t * np, d_pre + t * np);
    // carry^T [D x B] += W_rec^T (column-major D x R D, op N) d_pre_t[:, :R D]^T (ld G D).
    if (err == cudaSuccess)
      err = status(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, D, B, R * D, &one, w,
                                cuda_type<T>(), D, d_pre + t * np, cuda_type<T>(), G * D, &one,
                                a.carry, CUDA_R_32F, D, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return err == cudaSuccess ? delta_store<T>(a.stream, int(n), a.carry, static_cast<T*>(a.dh0)) : err;
}

template cudaError_t delta_steps_forward<float>(cublasHandle_t, const DeltaForward&);
template cudaError_t delta_steps_forward<__nv_bfloat16>(cublasHandle_t, const DeltaForward&);
template cudaError_t delta_steps_backward<float>(cublasHandle_t, const DeltaBackward&);
template cudaError_t delta_steps_backward<__nv_bfloat16>(cublasHandle_t, const DeltaBackward&);

}  // namespace elman
