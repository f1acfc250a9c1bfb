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

// ---- Tiled kernels (n, v <= 64): one warp holds a block of whole state columns -------------
//
// Lane layout: A row groups x Bc = 32 / A column groups; lane ra + A cb owns rows i = ra + A m
// (m < NR, n = A NR) and columns j = w VW + cb + Bc c (c < NC, VW = Bc NC) of warp w; a head is
// one CTA of W = v / VW warps. Sums over rows (S^T k, S^T q, dP^T k) are A-lane butterflies
// (every lane ends with the same bits); sums over columns (dq, dk, d decay, d beta) go through
// a shared buffer summed once per step. Each chunk's inputs are staged in shared memory by
// cp.async one chunk ahead, so no step waits on a global load.
//
// Backward: per chunk (reverse) and per sub-chunk of `slots` steps (from the chunk's end), the
// states S_{t-1} of the sub-chunk are recomputed from the checkpoint into shared memory (each
// thread its own elements, no barrier) with delta_t = v_t - S_{t-1}^T k_t, then walked backwards
// with S_t and dS in registers. With slots >= K every step is recomputed once.
namespace tiled {

template <int A, int NR, int NC>
struct Layout {
  static constexpr int Bc = 32 / A, VW = Bc * NC, N = A * NR, E = NR * NC;
};

template <int A>
__device__ __forceinline__ float rows_sum(float x) {  // over the A lanes of a column group
#pragma unroll
  for (int o = 1; o < A; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ void copy4(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// rows x words 4-byte words from src (row r at src + r * stride words) into dst, by the CTA.
__device__ __forceinline__ void stage_rows(void* dst, const void* src, int words, int64_t stride,
                                           int rows) {
  const uint32_t* s = static_cast<const uint32_t*>(src);
  uint32_t* d = static_cast<uint32_t*>(dst);
  for (int u = threadIdx.x; u < rows * words; u += blockDim.x) {
    const int r = u / words, x = u - r * words;
    copy4(d + u, s + r * stride + x);
  }
}

// Byte offsets of one staged chunk: k, q [K][n], v, d_o [K][v] in the compute dtype; decay
// [K][1 or v], beta [K] float32.
struct Stage {
  int k, q, v, d_o, decay, beta, bytes;
};
__host__ __device__ inline int align16(int x) { return (x + 15) & ~15; }
__host__ __device__ inline Stage stage_layout(int K, int n, int v, bool column, int tsize, bool grad) {
  Stage s;
  int o = 0;
  s.k = o, o = align16(o + K * n * tsize);
  s.q = o, o = align16(o + K * n * tsize);
  s.v = o, o = align16(o + K * v * tsize);
  s.d_o = o, o = grad ? align16(o + K * v * tsize) : o;
  s.decay = o, o = align16(o + K * (column ? v : 1) * 4);
  s.beta = o, o = align16(o + K * 4);
  s.bytes = o;
  return s;
}

// Issue the copies of steps [t0, t0 + rows) into buf (one commit group per call).
template <typename T>
__device__ __forceinline__ void stage_chunk(const MatrixArgs& a, const Stage& st, unsigned char* buf,
                                            int t0, int rows, bool grad) {
  const int64_t BH = int64_t(a.B) * a.H, bh = blockIdx.x, row0 = int64_t(t0) * BH + bh;
  const int nw = a.n * int(sizeof(T)) / 4, vw = a.v * int(sizeof(T)) / 4;  // 4-byte words a row
  stage_rows(buf + st.k, static_cast<const T*>(a.k) + row0 * a.n, nw, BH * nw, rows);
  stage_rows(buf + st.q, static_cast<const T*>(a.q) + row0 * a.n, nw, BH * nw, rows);
  stage_rows(buf + st.v, static_cast<const T*>(a.v_in) + row0 * a.v, vw, BH * vw, rows);
  if (grad) stage_rows(buf + st.d_o, static_cast<const T*>(a.d_o) + row0 * a.v, vw, BH * vw, rows);
  const int dc = a.column ? a.v : 1;
  stage_rows(buf + st.decay, a.decay + row0 * dc, dc, BH * dc, rows);
  if (a.beta) stage_rows(buf + st.beta, a.beta + row0, 1, BH, rows);
  commit();
}

// The row stride of the backward's column-sum buffer: >= 2n + 2 and = A (mod 32), so that the
// 32 lanes' writes of one row index fall in distinct banks.
__host__ __device__ inline int reduce_pitch(int n, int A) {
  int p = 2 * n + 2;
  return p + ((A - p % 32) % 32 + 32) % 32;
}

template <int A, int NR, int NC, typename T, class Step>
__global__ void __launch_bounds__(256) forward_kernel(const MatrixArgs a) {
  using L = Layout<A, NR, NC>;
  constexpr int N = L::N, Bc = L::Bc;
  extern __shared__ __align__(16) unsigned char smem[];
  const int V = a.v, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int ra = lane % A, jb = warp * L::VW + lane / A;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V, bh = blockIdx.x;
  const Stage st = stage_layout(a.K, N, V, a.column, int(sizeof(T)), false);
  T* o = static_cast<T*>(a.o);

  float s[NR][NC];
  const float* h0 = a.h0 + bh * NV;
#pragma unroll
  for (int m = 0; m < NR; ++m)
#pragma unroll
    for (int c = 0; c < NC; ++c) s[m][c] = h0[(ra + A * m) * V + jb + Bc * c];

  const int chunks = (a.T + a.K - 1) / a.K;
  stage_chunk<T>(a, st, smem, 0, min(a.K, a.T), false);
  for (int ch = 0; ch < chunks; ++ch) {
    const int start = ch * a.K, end = min(a.T, start + a.K);
    unsigned char* buf = smem + (ch & 1) * st.bytes;
    if (ch + 1 < chunks) {
      stage_chunk<T>(a, st, smem + ((ch + 1) & 1) * st.bytes, end, min(a.K, a.T - end), false);
      wait<1>();
    } else {
      wait<0>();
    }
    __syncthreads();
    float* ck = a.ckpt + (int64_t(ch) * BH + bh) * NV;
#pragma unroll
    for (int m = 0; m < NR; ++m)
#pragma unroll
      for (int c = 0; c < NC; ++c) ck[(ra + A * m) * V + jb + Bc * c] = s[m][c];
    const T* kb = reinterpret_cast<const T*>(buf + st.k);
    const T* qb = reinterpret_cast<const T*>(buf + st.q);
    const T* vb = reinterpret_cast<const T*>(buf + st.v);
    const float* db = reinterpret_cast<const float*>(buf + st.decay);
    const float* bb = reinterpret_cast<const float*>(buf + st.beta);
    for (int t = start; t < end; ++t) {
      const int tl = t - start;
      float kk[NR], w[NC], dec[NC];
#pragma unroll
      for (int m = 0; m < NR; ++m) kk[m] = to_float(kb[tl * N + ra + A * m]);
      const float bet = a.beta ? bb[tl] : 1.f;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float r = 0.f;
#pragma unroll
        for (int m = 0; m < NR; ++m) r = fmaf(s[m][c], kk[m], r);
        r = rows_sum<A>(r);
        const int j = jb + Bc * c;
        w[c] = bet * (to_float(vb[tl * V + j]) - r);
        dec[c] = a.column ? db[tl * V + j] : db[tl];
      }
      float out[NC] = {};
#pragma unroll
      for (int m = 0; m < NR; ++m) {
        const float qm = to_float(qb[tl * N + ra + A * m]);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          s[m][c] = Step::template act<kApprox<T>>(fmaf(dec[c], s[m][c], kk[m] * w[c]));
          out[c] = fmaf(s[m][c], qm, out[c]);
        }
      }
      const int64_t row = int64_t(t) * BH + bh;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const float x = rows_sum<A>(out[c]);
        if (ra == 0) o[row * V + jb + Bc * c] = from_float<T>(x);
      }
    }
    __syncthreads();  // every thread is done with buf before the next chunk's copies reuse it
  }
  float* sT = a.S_T + bh * NV;
#pragma unroll
  for (int m = 0; m < NR; ++m)
#pragma unroll
    for (int c = 0; c < NC; ++c) sT[(ra + A * m) * V + jb + Bc * c] = s[m][c];
}

// Dynamic shared memory of the backward: two staged chunks, `slots` states and deltas, two
// column-sum buffers.
__host__ __device__ inline int backward_bytes(int K, int n, int v, bool column, int tsize, int slots,
                                              int A, int warps_x_bc) {
  const Stage st = stage_layout(K, n, v, column, tsize, true);
  return 2 * st.bytes + slots * (n * v + A * v) * 4 + 2 * warps_x_bc * reduce_pitch(n, A) * 4;
}

template <int A, int NR, int NC, typename T, class Step>
__global__ void __launch_bounds__(256, 1) backward_kernel(const MatrixArgs a) {
  using L = Layout<A, NR, NC>;
  constexpr int N = L::N, Bc = L::Bc, E = L::E;
  extern __shared__ __align__(16) unsigned char smem[];
  const int V = a.v, tid = threadIdx.x, threads = blockDim.x, warp = tid / 32, lane = tid % 32;
  const int ra = lane % A, jb = warp * L::VW + lane / A;
  const int64_t BH = int64_t(a.B) * a.H, NV = int64_t(N) * V, bh = blockIdx.x;
  const Stage st = stage_layout(a.K, N, V, a.column, int(sizeof(T)), true);
  const int slots = a.slots, groups = (threads / 32) * Bc, pitch = reduce_pitch(N, A);
  float* states = reinterpret_cast<float*>(smem + 2 * st.bytes);  // [slots][E][threads]
  float* deltas = states + slots * E * threads;                    // [slots][NC][threads]
  float* red = deltas + slots * NC * threads;                      // [2][groups][pitch]
  float* my_red = red + (warp * Bc + lane / A) * pitch;
  T* dq = static_cast<T*>(a.dq);
  T* dk = static_cast<T*>(a.dk);
  T* dv = static_cast<T*>(a.dv);

  float dS[NR][NC], s[NR][NC];
  const float* dST = a.d_ST + bh * NV;
#pragma unroll
  for (int m = 0; m < NR; ++m)
#pragma unroll
    for (int c = 0; c < NC; ++c) dS[m][c] = dST[(ra + A * m) * V + jb + Bc * c];

  int rb = 0;
  const int chunks = (a.T + a.K - 1) / a.K;
  {
    const int last = (chunks - 1) * a.K;
    stage_chunk<T>(a, st, smem, last, a.T - last, true);
  }
  for (int ci = 0; ci < chunks; ++ci) {
    const int ch = chunks - 1 - ci, start = ch * a.K, end = min(a.T, start + a.K);
    unsigned char* buf = smem + (ci & 1) * st.bytes;
    if (ch > 0) {
      stage_chunk<T>(a, st, smem + ((ci + 1) & 1) * st.bytes, start - a.K, a.K, true);
      wait<1>();
    } else {
      wait<0>();
    }
    __syncthreads();
    const T* kb = reinterpret_cast<const T*>(buf + st.k);
    const T* qb = reinterpret_cast<const T*>(buf + st.q);
    const T* vb = reinterpret_cast<const T*>(buf + st.v);
    const T* ob = reinterpret_cast<const T*>(buf + st.d_o);
    const float* db = reinterpret_cast<const float*>(buf + st.decay);
    const float* bb = reinterpret_cast<const float*>(buf + st.beta);
    const float* ck = a.ckpt + (int64_t(ch) * BH + bh) * NV;
    for (int s1 = end, s0; s1 > start; s1 = s0) {
      s0 = max(start, s1 - slots);
      // Recompute S_{t-1} for t in [s0, s1) (and delta_t) from the checkpoint; s ends as S_{s1-1}'s successor.
#pragma unroll
      for (int m = 0; m < NR; ++m)
#pragma unroll
        for (int c = 0; c < NC; ++c) s[m][c] = ck[(ra + A * m) * V + jb + Bc * c];
      for (int t = start; t < s1; ++t) {
        const int tl = t - start;
        const bool keep = t >= s0;
        float* slot = states + (keep ? t - s0 : 0) * E * threads + tid;
        float* dslot = deltas + (keep ? t - s0 : 0) * NC * threads + tid;
        float kk[NR], w[NC], dec[NC];
#pragma unroll
        for (int m = 0; m < NR; ++m) kk[m] = to_float(kb[tl * N + ra + A * m]);
        const float bet = a.beta ? bb[tl] : 1.f;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          float r = 0.f;
#pragma unroll
          for (int m = 0; m < NR; ++m) {
            if (keep) slot[(m * NC + c) * threads] = s[m][c];
            r = fmaf(s[m][c], kk[m], r);
          }
          r = rows_sum<A>(r);
          const int j = jb + Bc * c;
          const float delta = to_float(vb[tl * V + j]) - r;
          if (keep) dslot[c * threads] = delta;
          w[c] = bet * delta;
          dec[c] = a.column ? db[tl * V + j] : db[tl];
        }
#pragma unroll
        for (int m = 0; m < NR; ++m)
#pragma unroll
          for (int c = 0; c < NC; ++c)
            s[m][c] = Step::template act<kApprox<T>>(fmaf(dec[c], s[m][c], kk[m] * w[c]));
      }
      // Walk back: s = S_t, the slot holds S_{t-1}.
      for (int t = s1 - 1; t >= s0; --t) {
        const int tl = t - start;
        const int64_t row = int64_t(t) * BH + bh;
        const float* slot = states + (t - s0) * E * threads + tid;
        const float* dslot = deltas + (t - s0) * NC * threads + tid;
        float* sums = my_red + rb * groups * pitch;
        const float bet = a.beta ? bb[tl] : 1.f;
        float dov[NC], del[NC], dec[NC], sk[NC], ddc[NC], ddel[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int j = jb + Bc * c;
          dov[c] = to_float(ob[tl * V + j]);
          del[c] = dslot[c * threads];
          dec[c] = a.column ? db[tl * V + j] : db[tl];
          sk[c] = 0.f, ddc[c] = 0.f;
        }
        // read-out: dS += q do^T, dq = S_t do; dP = dS * act'(S_t) kept in dS
#pragma unroll
        for (int m = 0; m < NR; ++m) {
          const float qm = to_float(qb[tl * N + ra + A * m]);
          const float km = to_float(kb[tl * N + ra + A * m]);
          float pq = 0.f;
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const float sn = s[m][c];
            pq = fmaf(sn, dov[c], pq);
            const float dp = fmaf(qm, dov[c], dS[m][c]) * Step::grad(sn);
            dS[m][c] = dp;
            ddc[c] = fmaf(dp, slot[(m * NC + c) * threads], ddc[c]);
            sk[c] = fmaf(dp, km, sk[c]);
          }
          sums[ra + A * m] = pq;
        }
        float dbeta = 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          sk[c] = rows_sum<A>(sk[c]);  // (dP^T k)_j
          ddel[c] = bet * sk[c];
          dbeta = fmaf(sk[c], del[c], dbeta);
          if (ra == 0) dv[row * V + jb + Bc * c] = from_float<T>(ddel[c]);
        }
#pragma unroll
        for (int m = 0; m < NR; ++m) {
          const float km = to_float(kb[tl * N + ra + A * m]);
          float pk = 0.f;
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const float so = slot[(m * NC + c) * threads];
            pk = fmaf(bet * dS[m][c], del[c], pk);
            pk = fmaf(-so, ddel[c], pk);
            dS[m][c] = fmaf(dec[c], dS[m][c], -km * ddel[c]);
            s[m][c] = so;
          }
          sums[N + ra + A * m] = pk;
        }
        float dd = 0.f;
        if (a.column) {
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const float x = rows_sum<A>(ddc[c]);
            if (ra == 0) a.d_decay[row * V + jb + Bc * c] = x;
          }
        } else {
#pragma unroll
          for (int c = 0; c < NC; ++c) dd += ddc[c];
          dd = rows_sum<A>(dd);
        }
        if (ra == 0) {
          sums[2 * N] = dd;
          sums[2 * N + 1] = dbeta;
        }
        __syncthreads();
        const float* all = red + rb * groups * pitch;
        for (int x = tid; x < 2 * N + 2; x += threads) {
          float sum = 0.f;
          for (int gi = 0; gi < groups; ++gi) sum += all[gi * pitch + x];
          if (x < N) dq[row * N + x] = from_float<T>(sum);
          else if (x < 2 * N) dk[row * N + x - N] = from_float<T>(sum);
          else if (x == 2 * N && !a.column) a.d_decay[row] = sum;
          else if (x == 2 * N + 1 && a.beta) a.d_beta[row] = sum;
        }
        rb ^= 1;
      }
    }
    __syncthreads();  // every thread is done with buf before the copies of chunk ch - 2 reuse it
  }
  float* dh0 = a.dh0 + bh * NV;
#pragma unroll
  for (int m = 0; m < NR; ++m)
#pragma unroll
    for (int c = 0; c < NC; ++c) dh0[(ra + A * m) * V + jb + Bc * c] = dS[m][c];
}

}  // namespace tiled

}  // namespace matrix
}  // namespace elman
