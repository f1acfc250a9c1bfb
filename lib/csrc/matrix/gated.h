// The gated recurrence of the matrix family (E70-E73, E73cp, E74 simple/ema/ntm, E14): plain C++
// interface (no torch headers). Per head a key-first state S [n, v]; per step
//   r = S^T k,  (a, w) = rule(c, v, r, e, f),  P = (m a^T - k x^T) * S + k w^T,  S = act(P),
//   o = S^T q
// (lib/elman/families/matrix/gated.py is the definition). Tensors are dense, time-major:
//   q, k [T, B, H, n], v, o, d_o [T, B, H, v] of the compute dtype (float or bf16);
//   c, e, f, x [T, B, H, v] and m [T, B, H, n] float32 (m, e, f, x may be null); h0, S_T, dh0, d_ST
//   [B, H, n, v], ckpt [ceil(T / K), B, H, n, v], scratch [B * H, min(K, T) + 1, n, v] float32.
#pragma once

#include <cuda_runtime.h>

namespace elman {

// Rule ids: the index in lib/elman/families/matrix/gated.py RULES.
enum GatedRule : int { kDecay = 0, kEma = 1, kRetain = 2, kValueGate = 3, kValueGateAbs = 4, kWriteGate = 5 };
constexpr int kGatedRules = 6;

struct GatedArgs {
  int T = 0, B = 0, H = 0, n = 0, v = 0, K = 16;
  int rule = 0;
  int step = 0;  // 0 tanh, 1 linear (reference.STEPS order)
  bool bf16 = false;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v_in = nullptr;
  const float* c = nullptr;
  const float* m = nullptr;
  const float* e = nullptr;
  const float* f = nullptr;
  const float* x = nullptr;  // the erase (E74 ntm)
  const float* h0 = nullptr;
  void* o = nullptr;
  float* S_T = nullptr;
  float* ckpt = nullptr;
  const void* d_o = nullptr;
  const float* d_ST = nullptr;
  float* scratch = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dc = nullptr;
  float* dm = nullptr;
  float* de = nullptr;
  float* df = nullptr;
  float* dx = nullptr;
  float* dh0 = nullptr;
  cudaStream_t stream = nullptr;
};

// Whether the gated kernels take this (n, v); `why` says what is wrong otherwise.
bool gated_supported(int n, int v, const char** why);
cudaError_t gated_forward(const GatedArgs& a);
cudaError_t gated_backward(const GatedArgs& a);

}  // namespace elman
