// E74's diagonal state (a vector s [n] per head): plain C++ interface (no torch headers).
// Per step, elementwise over the n channels (lib/elman/families/matrix/diagonal_op.py is the
// definition):
//   delta   p = s (1 - k^2) + v k
//   simple  p = c s + v k
//   ema     p = c s + (1 - c) v k
//   s = act(p) (tanh or identity),  o = s q
// q, k, v, o, d_o [T, B, H, n] of the compute dtype; c [T, B, H, n], h0, S_T, dh0, d_ST
// [B, H, n] and the stored states [T, B, H, n] float32.
#pragma once

#include <cuda_runtime.h>

namespace elman {

enum DiagonalRule : int { kDiagDelta = 0, kDiagSimple = 1, kDiagEma = 2 };
constexpr int kDiagonalRules = 3;

struct DiagonalArgs {
  int T = 0;
  long long channels = 0;  // B * H * n
  int rule = 0;
  int step = 0;            // 0 tanh, 1 linear
  bool bf16 = false;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v_in = nullptr;
  const float* c = nullptr;
  const float* h0 = nullptr;
  void* o = nullptr;
  float* S_T = nullptr;
  float* states = nullptr;  // forward writes, backward reads: the state after every step
  const void* d_o = nullptr;
  const float* d_ST = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dc = nullptr;
  float* dh0 = nullptr;
  cudaStream_t stream = nullptr;
};

cudaError_t diagonal_forward(const DiagonalArgs& a);
cudaError_t diagonal_backward(const DiagonalArgs& a);

}  // namespace elman
