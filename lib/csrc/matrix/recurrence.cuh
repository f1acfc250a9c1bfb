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
#include <type_traits>

#include "common/math.cuh"
#include "matrix/matrix.h"
#include "matrix/steps.cuh"

namespace elman {
namespace matrix {

// bf16 compute takes the step's fast activation (steps.cuh).
template <typename T>
constexpr bool kApprox = std::is_same_v<T, __nv_bfloat16>;

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

// One step's inputs as a thread uses them: its rows of k (and q), its column's v (and d_o), the
// decay and the write gate. With kArrays the rows are loaded into registers, and the kernels
// load them one step ahead, so a step waits for no global load; without (where the arrays do not
// fit beside the state) they are read where used.
template <int R, int G, typename T, bool kArrays, bool kGrad = false>
struct StepInputs {
  float k_[kArrays ? R : 1];
  float q_[kArrays ? R : 1];
  const T* kt;
  const T* qt;
  float v, decay, beta, d_o;

  __device__ __forceinline__ void load(const MatrixArgs& a, int64_t row, int g, int j) {
    constexpr int N = R * G;
    kt = static_cast<const T*>(a.k) + row * N + g;
    qt = static_cast<const T*>(a.q) + row * N + g;
    if constexpr (kArrays) {
#pragma unroll
      for (int m = 0; m < R; ++m) {
        k_[m] = to_float(kt[G * m]);
        q_[m] = to_float(qt[G * m]);
      }
    }
    v = to_float(static_cast<const T*>(a.v_in)[row * a.v + j]);
    decay = a.column ? a.decay[row * a.v + j] : a.decay[row];
    beta = a.beta ? a.beta[row] : 1.f;
    if constexpr (kGrad) d_o = to_float(static_cast<const T*>(a.d_o)[row * a.v + j]);
  }
  __device__ __forceinline__ float k(int m) const {
    if constexpr (kArrays) return k_[m];
    else return to_float(kt[G * m]);
  }
  __device__ __forceinline__ float q(int m) const {
    if constexpr (kArrays) return q_[m];
    else return to_float(qt[G * m]);
  }
};

// Register budget (128 a thread at 512 threads): the forward prefetches up to R = 16, the
// backward keeps dS, the replayed state and the prefetched inputs in registers up to R = 8.
template <int R>
constexpr bool kForwardPrefetch = R <= 16;

template <int R, int G, typename T, class Step>
__global__ void __launch_bounds__(kMatrixThreads, 1) forward_kernel(const MatrixArgs a) {
  constexpr int N = R * G;
  const int V = a.v;
  const int bh = blockIdx.x, j = threadIdx.x / G, g = threadIdx.x % G;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V;
  T* o = static_cast<T*>(a.o);

  float s[R];
  const float* h0 = a.h0 + bh * NV;
#pragma unroll
  for (int m = 0; m < R; ++m) s[m] = h0[(g + G * m) * V + j];

  constexpr bool kAhead = kForwardPrefetch<R>;
  StepInputs<R, G, T, kAhead> in, next;
  if constexpr (kAhead) next.load(a, bh, g, j);
  for (int t = 0; t < a.T; ++t) {
    const int64_t row = int64_t(t) * BH + bh;
    if constexpr (kAhead) {
      in = next;
      if (t + 1 < a.T) next.load(a, row + BH, g, j);
    } else {
      in.load(a, row, g, j);
    }
    if (t % a.K == 0) {
      float* c = a.ckpt + (int64_t(t / a.K) * BH + bh) * NV;
#pragma unroll
      for (int m = 0; m < R; ++m) c[(g + G * m) * V + j] = s[m];
    }
    float r = 0.f;
#pragma unroll
    for (int m = 0; m < R; ++m) r = fmaf(s[m], in.k(m), r);
    r = group_sum<G>(r);
    const float w = in.beta * (in.v - r);
    float out = 0.f;
#pragma unroll
    for (int m = 0; m < R; ++m) {
      s[m] = Step::template act<kApprox<T>>(fmaf(in.decay, s[m], in.k(m) * w));
      out = fmaf(s[m], in.q(m), out);
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
template <int R>
constexpr bool kPrefetch = !kSharedDS<R>;

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
      StepInputs<R, G, T, kPrefetch<R>> in, next;
      if constexpr (kPrefetch<R>) next.load(a, int64_t(start) * BH + bh, g, j);
      for (int t = start; t < end; ++t) {
        const int64_t row = int64_t(t) * BH + bh;
        if constexpr (kPrefetch<R>) {
          in = next;
          if (t + 1 < end) next.load(a, row + BH, g, j);
        } else {
          in.load(a, row, g, j);
        }
        float r = 0.f;
#pragma unroll kUnroll
        for (int m = 0; m < R; ++m) r = fmaf(s(m), in.k(m), r);
        r = group_sum<G>(r);
        const float w = in.beta * (in.v - r);
        float* out = scratch + int64_t(t - start + 1) * NV;
#pragma unroll kUnroll
        for (int m = 0; m < R; ++m) {
          s(m) = Step::template act<kApprox<T>>(fmaf(in.decay, s(m), in.k(m) * w));
          out[(g + G * m) * V + j] = s(m);
        }
      }
    }
    StepInputs<R, G, T, kPrefetch<R>, true> in, next;
    // With kPrefetch the step's states S_t, S_{t-1} sit in registers: S_{t-1} becomes the next
    // step's S_t, and S_{t-2} is loaded from the scratch one step ahead.
    float sn_regs[kPrefetch<R> ? R : 1], so_regs[kPrefetch<R> ? R : 1], so_next[kPrefetch<R> ? R : 1];
    const int64_t elem0 = g * V + j, elem_stride = int64_t(G) * V;  // row g + G m, column j
    if constexpr (kPrefetch<R>) {
      next.load(a, int64_t(end - 1) * BH + bh, g, j);
#pragma unroll
      for (int m = 0; m < R; ++m) {
        sn_regs[m] = scratch[(end - start) * NV + elem0 + m * elem_stride];
        so_regs[m] = scratch[(end - 1 - start) * NV + elem0 + m * elem_stride];
      }
    }
    for (int t = end - 1; t >= start; --t) {
      const int64_t row = int64_t(t) * BH + bh;
      const float* s_new = scratch + int64_t(t - start + 1) * NV + elem0;
      const float* s_old = scratch + int64_t(t - start) * NV + elem0;
      if constexpr (kPrefetch<R>) {
        in = next;
        if (t > start) {
          next.load(a, row - BH, g, j);
#pragma unroll
          for (int m = 0; m < R; ++m) so_next[m] = s_old[m * elem_stride - NV];
        }
      } else {
        in.load(a, row, g, j);
      }
      auto S_new = [&](int m) -> float {
        if constexpr (kPrefetch<R>) return sn_regs[m];
        else return s_new[m * elem_stride];
      };
      auto S_old = [&](int m) -> float {
        if constexpr (kPrefetch<R>) return so_regs[m];
        else return s_old[m * elem_stride];
      };
      float* sh = acc[buf];
      float r = 0.f;
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) r = fmaf(S_old(m), in.k(m), r);
      const float delta = in.v - group_sum<G>(r);
      // read-out: dS += q do^T, dq = S_t do; then dP = dS * act'(S_t) kept in dS
      float dd = 0.f, sk = 0.f;
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) {
        const int i = g + G * m;
        const float sn = S_new(m);
        dS(m) = fmaf(in.q(m), in.d_o, dS(m));
        const float part = columns_sum<G>(sn * in.d_o);
        if (lane < G) atomicAdd(&sh[i], part);
        dS(m) *= Step::grad(sn);
        dd = fmaf(dS(m), S_old(m), dd);
        sk = fmaf(dS(m), in.k(m), sk);
      }
      sk = group_sum<G>(sk);                         // (dP^T k)_j
      const float ddelta = in.beta * sk;
      if (g == 0) dv[row * V + j] = from_float<T>(ddelta);
#pragma unroll kUnroll
      for (int m = 0; m < R; ++m) {
        const int i = g + G * m;
        const float part = columns_sum<G>(in.beta * dS(m) * delta - S_old(m) * ddelta);
        if (lane < G) atomicAdd(&sh[N + i], part);
        dS(m) = fmaf(in.decay, dS(m), -in.k(m) * ddelta);
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
      if constexpr (kPrefetch<R>) {
#pragma unroll
        for (int m = 0; m < R; ++m) {
          sn_regs[m] = so_regs[m];
          so_regs[m] = so_next[m];
        }
      }
    }
  }
  float* dh0 = a.dh0 + bh * NV;
#pragma unroll kUnroll
  for (int m = 0; m < R; ++m) dh0[(g + G * m) * V + j] = dS(m);
}

}  // namespace matrix
}  // namespace elman
