// The matrix family's recurrence kernels: one CTA per (batch, head), the whole sequence in one
// launch per direction.
//
// Thread layout: G threads per value column j (blockDim = G v <= 512: G = 8 for v <= 64, else 4);
// thread g of column j owns the rows i = g + G m (m < R = n / G) of S[:, j] in registers. The
// read-out r_j = sum_i S[i, j] k_i and o_j = sum_i S[i, j] q_i are sums over the G lanes of a
// group (shuffles), so the forward needs no shared memory and no barrier. The backward's per-row
// gradients dq_i, dk_i and the per-head scalars d decay, d beta are sums over columns: each warp
// sums its 32 / G columns by shuffles, then one lane per row adds into a shared accumulator (two buffers, one barrier per
// step; the thread that writes a row out also clears it).
//
// Forward: checkpoint c = state before step c K. Backward: chunks in reverse; each chunk replays
// its steps from the checkpoint into this CTA's scratch (every thread reads back only what it
// wrote, so no barrier), then walks its steps backwards (lib/elman/families/matrix/schedule.py
// is the same schedule in PyTorch).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/math.cuh"
#include "matrix/matrix.h"
#include "matrix/steps.cuh"

namespace elman {
namespace matrix {

template <int G>
__device__ __forceinline__ float group_sum(float x) {  // over the G lanes of a column
#pragma unroll
  for (int o = 1; o < G; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <int G>
__device__ __forceinline__ float columns_sum(float x) {  // over the 32 / G columns of a warp
#pragma unroll
  for (int o = G; o < 32; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <int R, int G, typename T, class Step>
__global__ void __launch_bounds__(kMatrixThreads) forward_kernel(const MatrixArgs a) {
  constexpr int N = R * G;
  const int V = a.v;
  const int bh = blockIdx.x, j = threadIdx.x / G, g = threadIdx.x % G;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v_in);
  T* o = static_cast<T*>(a.o);

  float s[R];
  const float* h0 = a.h0 + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) s[m] = h0[(g + G * m) * V + j];

  for (int t = 0; t < a.T; ++t) {
    if (t % a.K == 0) {
      float* c = a.ckpt + (int64_t(t / a.K) * BH + bh) * NV;
#pragma unroll
      for (int m = 0; m < R; ++m) c[(g + G * m) * V + j] = s[m];
    }
    const int64_t row = int64_t(t) * BH + bh;
    float kk[R];
    float r = 0.f;
#pragma unroll
    for (int m = 0; m < R; ++m) {
      kk[m] = to_float(k[row * N + g + G * m]);
      r = fmaf(s[m], kk[m], r);
    }
    r = group_sum<G>(r);
    const float dec = a.column ? a.decay[row * V + j] : a.decay[row];
    const float be = a.beta ? a.beta[row] : 1.f;
    const float w = be * (to_float(v[row * V + j]) - r);
    float out = 0.f;
#pragma unroll
    for (int m = 0; m < R; ++m) {
      s[m] = Step::act(fmaf(dec, s[m], kk[m] * w));
      out = fmaf(s[m], to_float(q[row * N + g + G * m]), out);
    }
    out = group_sum<G>(out);
    if (g == 0) o[row * V + j] = from_float<T>(out);
  }
  float* sT = a.S_T + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) sT[(g + G * m) * V + j] = s[m];
}

template <int R>
constexpr bool kSharedDS = R > 8;

// Dynamic shared memory of the backward for a block of `threads`.
template <int R>
constexpr int backward_shared_bytes(int threads) {
  return kSharedDS<R> ? 2 * R * threads * int(sizeof(float)) : 0;
}

template <int R, int G, typename T, class Step>
__global__ void __launch_bounds__(kMatrixThreads, 1) backward_kernel(const MatrixArgs a) {
  constexpr int N = R * G;
  constexpr int kAcc = 2 * N + 2;  // dq [N], dk [N], d decay, d beta
  // Row loops unroll fully while their values sit in register arrays; over shared memory a
  // full unroll made ptxas keep every row's address in registers and spill.
  constexpr int kUnroll = kSharedDS<R> ? 4 : R;
  __shared__ float acc[2][kAcc];
  const int V = a.v;
  const int bh = blockIdx.x, tid = threadIdx.x, j = tid / G, g = tid % G, lane = tid % 32;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V;
  const int slots = (a.K < a.T ? a.K : a.T) + 1;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v_in);
  const T* d_o = static_cast<const T*>(a.d_o);
  T* dq = static_cast<T*>(a.dq);
  T* dk = static_cast<T*>(a.dk);
  T* dv = static_cast<T*>(a.dv);
  float* scratch = a.scratch + int64_t(bh) * slots * NV;

  for (int x = tid; x < 2 * kAcc; x += blockDim.x) (&acc[0][0])[x] = 0.f;
  // dS and the replayed state live in registers up to R = 8; beyond (n >= 96 at 8 threads a
  // column, n >= 48 at 4) in dynamic shared memory, thread-contiguous (no bank conflicts): held
  // in registers they spilled.
  extern __shared__ float dS_shared[];
  float dS_regs[kSharedDS<R> ? 1 : R];
  auto dS = [&](int m) -> float& {
    if constexpr (kSharedDS<R>) return dS_shared[m * blockDim.x + tid];
    else return dS_regs[m];
  };
  const float* dST = a.d_ST + bh * NV;
#pragma unroll kUnroll
  for (int m = 0; m < R; ++m) dS(m) = dST[(g + G * m) * V + j];
  __syncthreads();

  int buf = 0;
  const int chunks = (a.T + a.K - 1) / a.K;
  for (int c = chunks - 1; c >= 0; --c) {
    const int start = c * a.K, end = min(a.T, start + a.K);
    {  // replay the chunk from its checkpoint: scratch[s] = state after step start + s - 1
      float s_regs[kSharedDS<R> ? 1 : R];
      auto s = [&](int m) -> float& {
        if constexpr (kSharedDS<R>) return dS_shared[(R + m) * blockDim.x + threadIdx.x];
        else return s_regs[m];
      };
      const float* ck = a.ckpt + (int64_t(c) * BH + bh) * NV;
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) {
        s(m) = ck[(g + G * m) * V + j];
        scratch[(g + G * m) * V + j] = s(m);
      }
      for (int t = start; t < end; ++t) {
        const int64_t row = int64_t(t) * BH + bh;
        const T* kt = k + row * N + g;
        float r = 0.f;
#pragma unroll kUnroll
        for (int m = 0; m < R; ++m) r = fmaf(s(m), to_float(kt[G * m]), r);
        r = group_sum<G>(r);
        const float dec = a.column ? a.decay[row * V + j] : a.decay[row];
        const float be = a.beta ? a.beta[row] : 1.f;
        const float w = be * (to_float(v[row * V + j]) - r);
        float* out = scratch + int64_t(t - start + 1) * NV;
#pragma unroll kUnroll
        for (int m = 0; m < R; ++m) {
          s(m) = Step::act(fmaf(dec, s(m), to_float(kt[G * m]) * w));
          out[(g + G * m) * V + j] = s(m);
        }
      }
    }
    for (int t = end - 1; t >= start; --t) {
      const int64_t row = int64_t(t) * BH + bh;
      const float* s_new = scratch + int64_t(t - start + 1) * NV;
      const float* s_old = scratch + int64_t(t - start) * NV;
      const float dec = a.column ? a.decay[row * V + j] : a.decay[row];
      const float be = a.beta ? a.beta[row] : 1.f;
      const float go = to_float(d_o[row * V + j]);
      float* sh = acc[buf];
      const T* kt = k + row * N + g;  // k is re-read from L1 rather than held: registers
      float r = 0.f;
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) r = fmaf(s_old[(g + G * m) * V + j], to_float(kt[G * m]), r);
      const float delta = to_float(v[row * V + j]) - group_sum<G>(r);
      // read-out: dS += q do^T, dq = S_t do; then dP = dS * act'(S_t) kept in dS
      float dd = 0.f, sk = 0.f;
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) {
        const int i = g + G * m;
        const float sn = s_new[i * V + j];
        dS(m) = fmaf(to_float(q[row * N + i]), go, dS(m));
        const float part = columns_sum<G>(sn * go);
        if (lane < G) atomicAdd(&sh[i], part);
        dS(m) *= Step::grad(sn);
        dd = fmaf(dS(m), s_old[i * V + j], dd);
        sk = fmaf(dS(m), to_float(kt[G * m]), sk);
      }
      sk = group_sum<G>(sk);                         // (dP^T k)_j
      const float ddelta = be * sk;
      if (g == 0) dv[row * V + j] = from_float<T>(ddelta);
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) {
        const int i = g + G * m;
        const float part = columns_sum<G>(be * dS(m) * delta - s_old[i * V + j] * ddelta);
        if (lane < G) atomicAdd(&sh[N + i], part);
        dS(m) = fmaf(dec, dS(m), -to_float(kt[G * m]) * ddelta);
      }
      dd = group_sum<G>(dd);
      if (a.column) {
        if (g == 0) a.d_decay[row * V + j] = dd;
      } else {
        dd = columns_sum<G>(dd);
        if (lane == 0) atomicAdd(&sh[2 * N], dd);
      }
      if (a.beta) {
        const float db = columns_sum<G>(g == 0 ? sk * delta : 0.f);
        if (lane == 0) atomicAdd(&sh[2 * N + 1], db);
      }
      __syncthreads();
      for (int x = tid; x < kAcc; x += blockDim.x) {
        const float val = sh[x];
        sh[x] = 0.f;
        if (x < N) dq[row * N + x] = from_float<T>(val);
        else if (x < 2 * N) dk[row * N + x - N] = from_float<T>(val);
        else if (x == 2 * N && !a.column) a.d_decay[row] = val;
        else if (x == 2 * N + 1 && a.beta) a.d_beta[row] = val;
      }
      buf ^= 1;
    }
  }
  float* dh0 = a.dh0 + bh * NV;
#pragma unroll kUnroll
  for (int m = 0; m < R; ++m) dh0[(g + G * m) * V + j] = dS(m);
}

}  // namespace matrix
}  // namespace elman
