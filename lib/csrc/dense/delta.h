// Plain C++ declarations of the nonlinear-delta launchers (E63 a/b/c/d; no torch headers).
// Per step, with the G input-side pre-activations p_t = [W_x x_t + b; W_a x_t + b_a; (W_b x_t +
// b_b)] precomputed by one GEMM and the stacked recurrent matrix W_rec = [W_h; (U_a; U_b)]
// (R = 1 or 3 blocks of D rows):
//   q = W_rec h_{t-1}                                      (one cuBLAS GEMM, fp32 result)
//   v = tanh(p_v + q_v),  alpha = sigmoid(p_alpha [+ q_alpha]),  beta = sigmoid(p_beta [+ q_beta])
//   mode 0 (63a): h = alpha h_{t-1} + (1 - alpha) v    mode 1 (63b): h = alpha h_{t-1} + beta v
//   mode 2 (63c): as 63b with q_alpha, q_beta          mode 3 (63d): h = h_{t-1} + alpha v
//   out = h * silu(h)
// Tensors, time-major and contiguous:  pre, act, d_pre : [T, B, G D]  (channels v, alpha, beta)
//   out, d_out : [T, B, D]   h_all : [T + 1, B, D] (h_all[0] = h0)   w_rec : [R D, D] row-major
//   h0, d_hT, dh0 : [B, D].  `act` holds the pre-activations (z_v, z_alpha, z_beta) of
//   v = tanh(z_v), alpha = sigmoid(z_alpha), beta = sigmoid(z_beta); the backward recomputes
//   the activations from them.
// Workspaces are fp32: the forward's q [B, R D] and state [B, D] (the elementwise chain of
// h in fp32; h_all holds it in the tensors' dtype for the GEMM and the backward), the
// backward's carried dh [B, D].
#pragma once

#include <cuda_runtime.h>

struct cublasContext;
typedef struct cublasContext* cublasHandle_t;

namespace elman {

constexpr int kDeltaModes = 4;
int delta_channels(int mode);   // G: input-side pre-activation blocks of the mode (-1: unknown)
int delta_recurrent(int mode);  // R: row blocks of W_rec (-1: unknown)

struct DeltaForward {
  cudaStream_t stream = nullptr;
  int mode = 0, steps = 0, batch = 0, dim = 0;
  const void* pre = nullptr;
  const void* w_rec = nullptr;
  const void* h0 = nullptr;
  void* out = nullptr;
  void* h_all = nullptr;
  void* act = nullptr;
  float* q = nullptr;
  float* state = nullptr;
};

struct DeltaBackward {
  cudaStream_t stream = nullptr;
  int mode = 0, steps = 0, batch = 0, dim = 0;
  const void* w_rec = nullptr;
  const void* h_all = nullptr;
  const void* act = nullptr;
  const void* d_out = nullptr;
  const void* d_hT = nullptr;
  void* d_pre = nullptr;
  void* dh0 = nullptr;
  float* carry = nullptr;
};

// One step's fused elementwise kernels (delta.cu). `q` is [B, R D]; the pointers are those of
// step t (pre, act, out, d_out, d_pre: slice t; h_prev = h_all[t], h = h_all[t + 1]); the
// forward reads h_{t-1} from `state` and leaves h_t there.
template <typename T>
cudaError_t delta_step_forward(cudaStream_t s, int mode, int batch, int dim, const float* q,
                               const T* pre, float* state, T* h, T* out, T* act);
template <typename T>
cudaError_t delta_step_backward(cudaStream_t s, int mode, int batch, int dim, float* carry,
                                const T* d_out, const T* h_prev, const T* h, const T* act,
                                T* d_pre);
template <typename T>
cudaError_t delta_convert(cudaStream_t s, int n, const T* src, float* dst);
template <typename T>
cudaError_t delta_store(cudaStream_t s, int n, const float* src, T* dst);

// The per-step loops (delta.cpp): one GEMM and one fused kernel per step.
template <typename T>
cudaError_t delta_steps_forward(cublasHandle_t handle, const DeltaForward& a);
template <typename T>
cudaError_t delta_steps_backward(cublasHandle_t handle, const DeltaBackward& a);

}  // namespace elman
