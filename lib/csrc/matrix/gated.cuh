// The gated recurrence's kernels (gated.h): one CTA per (batch, head), the whole sequence in one
// launch per direction, on the layout of recurrence.cuh: G threads per value column j, thread g
// owning rows i = g + G m (m < R = n / G) of S[:, j] in registers; column sums (r, o, and in the
// backward da, dw) over the G lanes of a column by shuffles; row sums (dq, dk, dm) over columns
// by shuffles within a warp, then shared atomics (two buffers, one barrier per step).
//
// The rule (gated.py RULES) and the step (tanh or linear) are uniform runtime branches: one
// kernel per (R, G, dtype) serves every variant, so the number of instantiations stays at the
// sizes' count. The backward replays each chunk from its checkpoint into this CTA's scratch
// (every thread reads back only what it wrote) and reads the step's two states from it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/math.cuh"
#include "matrix/gated.h"
#include "matrix/recurrence.cuh"

namespace elman {
namespace gated {

using matrix::columns_sum;
using matrix::group_sum;

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// (a, w) of one column.
__device__ __forceinline__ void rule_forward(int rule, float c, float v, float r, float e, float f,
                                             float& a, float& w) {
  switch (rule) {
    case kDecay: a = c, w = v; break;
    case kEma: a = c, w = (1.f - c) * v; break;
    case kRetain: a = sigmoid(c + e * r), w = (1.f - a) * v; break;
    case kValueGate: a = c, w = (1.f - c) * sigmoid(e * r + f) * v; break;
    case kWriteGate: a = c, w = f * v; break;
    default: a = c, w = (1.f - c) * sigmoid(-e * fabsf(r) + f) * v; break;
  }
}

struct RuleGrad {
  float dc, dv, dr, de, df;
};

// The hand-derived gradient of rule_forward (gated.py rule_backward).
__device__ __forceinline__ RuleGrad rule_backward(int rule, float c, float v, float r, float e,
                                                  float f, float da, float dw) {
  switch (rule) {
    case kDecay: return {da, dw, 0.f, 0.f, 0.f};
    case kEma: return {da - v * dw, (1.f - c) * dw, 0.f, 0.f, 0.f};
    case kWriteGate: return {da, f * dw, 0.f, 0.f, v * dw};
    case kRetain: {
      const float alpha = sigmoid(c + e * r);
      const float ds = (da - v * dw) * alpha * (1.f - alpha);
      return {ds, (1.f - alpha) * dw, ds * e, ds * r, 0.f};
    }
    case kValueGate: {
      const float g = sigmoid(e * r + f);
      const float ds = (1.f - c) * v * dw * g * (1.f - g);
      return {da - g * v * dw, (1.f - c) * g * dw, ds * e, ds * r, ds};
    }
    default: {
      const float g = sigmoid(-e * fabsf(r) + f);
      const float ds = (1.f - c) * v * dw * g * (1.f - g);
      const float sign = float(r > 0.f) - float(r < 0.f);
      return {da - g * v * dw, (1.f - c) * g * dw, -ds * e * sign, -ds * fabsf(r), ds};
    }
  }
}

template <typename T>
__device__ __forceinline__ float act(int step, float p) {
  if (step == 1) return p;
  return matrix::kApprox<T> ? tanh_approx(p) : tanhf(p);
}

__device__ __forceinline__ float act_grad(int step, float s) { return step == 1 ? 1.f : 1.f - s * s; }

// One step's column inputs.
struct Column {
  float v, c, e, f, x;
  template <typename T>
  __device__ __forceinline__ void load(const GatedArgs& a, int64_t at) {
    v = to_float(static_cast<const T*>(a.v_in)[at]);
    c = a.c[at];
    e = a.e ? a.e[at] : 0.f;
    f = a.f ? a.f[at] : 0.f;
    x = a.x ? a.x[at] : 0.f;
  }
};

template <int R, int G, typename T>
__global__ void __launch_bounds__(kMatrixThreads, 1) forward_kernel(const GatedArgs a) {
  constexpr int N = R * G;
  const int V = a.v;
  const int bh = blockIdx.x, j = threadIdx.x / G, g = threadIdx.x % G;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V;
  const int64_t elem0 = int64_t(g) * V + j;
  T* o = static_cast<T*>(a.o);

  float s[R];
  const float* h0 = a.h0 + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) s[m] = h0[elem0 + int64_t(G) * m * V];

  for (int t = 0; t < a.T; ++t) {
    const int64_t row = int64_t(t) * BH + bh;
    const T* kt = static_cast<const T*>(a.k) + row * N + g;
    const T* qt = static_cast<const T*>(a.q) + row * N + g;
    const float* mt = a.m ? a.m + row * N + g : nullptr;
    Column col;
    col.load<T>(a, row * V + j);
    if (t % a.K == 0) {
      float* ck = a.ckpt + (int64_t(t / a.K) * BH + bh) * NV;
#pragma unroll
      for (int m = 0; m < R; ++m) ck[elem0 + int64_t(G) * m * V] = s[m];
    }
    float r = 0.f;
#pragma unroll
    for (int m = 0; m < R; ++m) r = fmaf(s[m], to_float(kt[G * m]), r);
    r = group_sum<G>(r);
    float aj, wj;
    rule_forward(a.rule, col.c, col.v, r, col.e, col.f, aj, wj);
    float out = 0.f;
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const float kk = to_float(kt[G * m]);
      const float scale = (mt ? mt[G * m] * aj : aj) - kk * col.x;
      s[m] = act<T>(a.step, fmaf(scale, s[m], kk * wj));
      out = fmaf(s[m], to_float(qt[G * m]), out);
    }
    out = group_sum<G>(out);
    if (g == 0) o[row * V + j] = from_float<T>(out);
  }
  float* sT = a.S_T + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) sT[elem0 + int64_t(G) * m * V] = s[m];
}

template <int R>
constexpr bool kSharedGrad = R > 24;

// Dynamic shared memory of the backward for a block of `threads`.
template <int R>
constexpr int backward_shared_bytes(int threads) {
  return kSharedGrad<R> ? R * threads * int(sizeof(float)) : 0;
}

template <int R, int G, typename T>
__global__ void __launch_bounds__(kMatrixThreads, 1) backward_kernel(const GatedArgs a) {
  constexpr int N = R * G;
  constexpr int kAcc = 3 * N;  // dq [N], dk [N], dm [N]
  __shared__ float acc[2][kAcc];
  const int V = a.v;
  const int bh = blockIdx.x, tid = threadIdx.x, j = tid / G, g = tid % G, lane = tid % 32;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V;
  const int64_t elem0 = int64_t(g) * V + j, stride = int64_t(G) * V;
  const int slots = (a.K < a.T ? a.K : a.T) + 1;
  T* dq = static_cast<T*>(a.dq);
  T* dk = static_cast<T*>(a.dk);
  T* dv = static_cast<T*>(a.dv);
  float* scratch = a.scratch + int64_t(bh) * slots * NV;

  for (int x = tid; x < 2 * kAcc; x += blockDim.x) (&acc[0][0])[x] = 0.f;
  // dS in registers up to R = 24; at R = 32 (n = 128 over 4 threads a column) in dynamic shared
  // memory, thread-contiguous (no bank conflicts): in registers it spilled.
  extern __shared__ float dS_shared[];
  float dS_regs[kSharedGrad<R> ? 1 : R];
  auto dS = [&](int m) -> float& {
    if constexpr (kSharedGrad<R>) return dS_shared[m * blockDim.x + tid];
    else return dS_regs[m];
  };
  const float* dST = a.d_ST + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) dS(m) = dST[elem0 + m * stride];
  __syncthreads();

  int buf = 0;
  const int chunks = (a.T + a.K - 1) / a.K;
  for (int ch = chunks - 1; ch >= 0; --ch) {
    const int start = ch * a.K, end = min(a.T, start + a.K);
    {  // replay: scratch[s] = state after step start + s - 1
      float s[R];
      const float* ck = a.ckpt + (int64_t(ch) * BH + bh) * NV;
#pragma unroll
      for (int m = 0; m < R; ++m) {
        s[m] = ck[elem0 + m * stride];
        scratch[elem0 + m * stride] = s[m];
      }
      for (int t = start; t < end; ++t) {
        const int64_t row = int64_t(t) * BH + bh;
        const T* kt = static_cast<const T*>(a.k) + row * N + g;
        const float* mt = a.m ? a.m + row * N + g : nullptr;
        Column col;
        col.load<T>(a, row * V + j);
        float r = 0.f;
#pragma unroll
        for (int m = 0; m < R; ++m) r = fmaf(s[m], to_float(kt[G * m]), r);
        r = group_sum<G>(r);
        float aj, wj;
        rule_forward(a.rule, col.c, col.v, r, col.e, col.f, aj, wj);
        float* out = scratch + int64_t(t - start + 1) * NV;
#pragma unroll
        for (int m = 0; m < R; ++m) {
          const float kk = to_float(kt[G * m]);
          const float scale = (mt ? mt[G * m] * aj : aj) - kk * col.x;
          s[m] = act<T>(a.step, fmaf(scale, s[m], kk * wj));
          out[elem0 + m * stride] = s[m];
        }
      }
    }
    for (int t = end - 1; t >= start; --t) {
      const int64_t row = int64_t(t) * BH + bh;
      const T* kt = static_cast<const T*>(a.k) + row * N + g;
      const T* qt = static_cast<const T*>(a.q) + row * N + g;
      const float* mt = a.m ? a.m + row * N + g : nullptr;
      const float* s_new = scratch + int64_t(t - start + 1) * NV + elem0;
      const float* s_old = scratch + int64_t(t - start) * NV + elem0;
      Column col;
      col.load<T>(a, row * V + j);
      const float d_o = to_float(static_cast<const T*>(a.d_o)[row * V + j]);
      float* sh = acc[buf];

      float r = 0.f;
#pragma unroll
      for (int m = 0; m < R; ++m) r = fmaf(s_old[m * stride], to_float(kt[G * m]), r);
      r = group_sum<G>(r);
      float aj, wj;
      rule_forward(a.rule, col.c, col.v, r, col.e, col.f, aj, wj);
      // read-out: dS += q do^T, dq = S_t do; dP = dS * act'(S_t) kept in dS
      float da = 0.f, dw = 0.f, dkS = 0.f;  // dkS: sum_i dP k S_{t-1}, the erase's gradient
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const float sn = s_new[m * stride];
        dS(m) = fmaf(to_float(qt[G * m]), d_o, dS(m));
        const float part = columns_sum<G>(sn * d_o);
        if (lane < G) atomicAdd(&sh[g + G * m], part);
        dS(m) *= act_grad(a.step, sn);
        const float mm = mt ? mt[G * m] : 1.f;
        const float kk = to_float(kt[G * m]);
        da = fmaf(dS(m) * mm, s_old[m * stride], da);
        dw = fmaf(dS(m), kk, dw);
        dkS = fmaf(dS(m) * kk, s_old[m * stride], dkS);
      }
      da = group_sum<G>(da);
      dw = group_sum<G>(dw);
      dkS = group_sum<G>(dkS);
      const RuleGrad rg = rule_backward(a.rule, col.c, col.v, r, col.e, col.f, da, dw);
      if (g == 0) {
        const int64_t at = row * V + j;
        dv[at] = from_float<T>(rg.dv);
        a.dc[at] = rg.dc;
        if (a.de) a.de[at] = rg.de;
        if (a.df) a.df[at] = rg.df;
        if (a.dx) a.dx[at] = -dkS;
      }
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const int i = g + G * m;
        const float so = s_old[m * stride];
        const float kk = to_float(kt[G * m]);
        const float part = columns_sum<G>(fmaf(dS(m), wj - col.x * so, so * rg.dr));
        if (lane < G) atomicAdd(&sh[N + i], part);
        if (mt) {
          const float pm = columns_sum<G>(dS(m) * aj * so);
          if (lane < G) atomicAdd(&sh[2 * N + i], pm);
        }
        const float mm = mt ? mt[G * m] : 1.f;
        dS(m) = fmaf(dS(m), mm * aj - kk * col.x, kk * rg.dr);
      }
      __syncthreads();
      for (int x = tid; x < kAcc; x += blockDim.x) {
        const float val = sh[x];
        sh[x] = 0.f;
        if (x < N) dq[row * N + x] = from_float<T>(val);
        else if (x < 2 * N) dk[row * N + x - N] = from_float<T>(val);
        else if (a.dm) a.dm[row * N + x - 2 * N] = val;
      }
      buf ^= 1;
    }
  }
  float* dh0 = a.dh0 + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) dh0[elem0 + m * stride] = dS(m);
}

}  // namespace gated
}  // namespace elman
