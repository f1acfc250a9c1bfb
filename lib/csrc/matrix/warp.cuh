// The warp kernels of the matrix recurrence: one warp per (batch, head), no CTA barrier anywhere.
//
// Lane tile (A row groups, NR rows and NC columns a lane): lane = cb * A + ra owns the rows
// ra * NR + m (m < NR) and the columns cb * NC + c (c < NC) of S [n = A NR, v = (32 / A) NC], so
// its rows of k and q and its columns of v and d_o are contiguous (one vector load each).
// Sums over rows (S^T k, S^T q, dP^T k) are butterflies over the A lanes of a column group
// (log2 A shuffles); sums over columns (dq = S_t d_o, dk) are reduce-scatters over the 32 / A
// column groups (each round halves what a lane holds: NR - NR / 32 * A shuffles), where NR
// divides by the groups, else butterflies; the scalar d decay a warp butterfly.
//
// Inputs reach a lane one of two ways (kRing, a template parameter; the same arithmetic either
// way, so both give the same bits): read from global memory one step ahead into registers, or
// copied by cp.async kRingStages - 1 steps ahead into a ring of whole input rows in this warp's
// shared memory (the lanes split each step's rows into 16-byte copies; a __syncwarp after each
// lane's cp.async.wait_group makes the rows visible to every lane, no CTA barrier). One step
// ahead leaves most of the global round trip exposed: ptxas moves the prefetched registers into
// place about a third of the way into the step after the loads (SASS of the n = 32 forward), so
// the loads have a third of a step, not a whole one, to return.
// Forward: checkpoint c = the state before step c K. Backward: chunks in reverse; per sub-chunk
// of `slots` steps from the chunk's end, the states S_{t-1} and delta_t of the sub-chunk are
// recomputed from the checkpoint into this warp's shared memory, then walked back with S_t and
// dS in registers (lib/elman/families/matrix/schedule.py is the same schedule).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/math.cuh"
#include "matrix/matrix.h"
#include "matrix/recurrence.cuh"
#include "matrix/steps.cuh"

namespace elman {
namespace matrix {
namespace warp {

template <int A, int NR, int NC>
struct Tile {
  static constexpr int Bc = 32 / A, N = A * NR, V = Bc * NC, E = NR * NC;
  // Floats of one slot: the state [E][32 lanes] and delta [NC][32 lanes].
  static constexpr int kSlot = (E + NC) * 32;
};

// N consecutive elements of T kept as raw 32-bit words (converted when read), loaded with the
// widest access the lane offset allows (N * sizeof(T) bytes apart, at most 16).
template <typename T, int N>
struct Vec {
  static constexpr int kBytes = N * int(sizeof(T));
  static constexpr int kChunk = kBytes % 16 == 0 ? 16 : kBytes % 8 == 0 ? 8 : kBytes % 4 == 0 ? 4 : 2;
  static constexpr int kWords = (kBytes + 3) / 4;
  uint32_t w[kWords];

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kChunk == 16) {
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) {
        const uint4 x = __ldg(reinterpret_cast<const uint4*>(p) + i);
        w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
      }
    } else if constexpr (kChunk == 8) {
#pragma unroll
      for (int i = 0; i < kBytes / 8; ++i) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(p) + i);
        w[2 * i] = x.x, w[2 * i + 1] = x.y;
      }
    } else if constexpr (kChunk == 4) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = __ldg(reinterpret_cast<const unsigned int*>(p) + i);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const uint32_t h = __ldg(reinterpret_cast<const unsigned short*>(p) + i);
        w[i / 2] |= (i % 2) ? h << 16 : h;
      }
    }
  }
  // The same words from shared memory (p 16-byte aligned where kChunk is 16, and so on).
  __device__ __forceinline__ void read(const T* p) {
    if constexpr (kChunk == 16) {
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) {
        const uint4 x = reinterpret_cast<const uint4*>(p)[i];
        w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
      }
    } else if constexpr (kChunk == 8) {
#pragma unroll
      for (int i = 0; i < kBytes / 8; ++i) {
        const uint2 x = reinterpret_cast<const uint2*>(p)[i];
        w[2 * i] = x.x, w[2 * i + 1] = x.y;
      }
    } else if constexpr (kChunk == 4) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = reinterpret_cast<const unsigned int*>(p)[i];
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const uint32_t h = reinterpret_cast<const unsigned short*>(p)[i];
        w[i / 2] |= (i % 2) ? h << 16 : h;
      }
    }
  }
  __device__ __forceinline__ float operator[](int i) const {
    if constexpr (sizeof(T) == 4) return __uint_as_float(w[i]);
    else return __uint_as_float((i & 1) ? (w[i >> 1] & 0xffff0000u) : (w[i >> 1] << 16));
  }
};

__device__ __forceinline__ unsigned int pack_bf16(float lo, float hi) {
  const __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned int*>(&x);
}

// Stores N floats as T at p with the widest access N * sizeof(T) allows.
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const float* x) {
  constexpr int kBytes = N * int(sizeof(T));
  if constexpr (sizeof(T) == 4 && kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      reinterpret_cast<float4*>(p)[i] = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
  } else if constexpr (sizeof(T) == 4 && kBytes % 8 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) reinterpret_cast<float2*>(p)[i] = make_float2(x[2 * i], x[2 * i + 1]);
  } else if constexpr (sizeof(T) == 2 && kBytes % 8 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      uint2 u;
      u.x = pack_bf16(x[4 * i], x[4 * i + 1]);
      u.y = pack_bf16(x[4 * i + 2], x[4 * i + 3]);
      reinterpret_cast<uint2*>(p)[i] = u;
    }
  } else if constexpr (sizeof(T) == 2 && kBytes % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) reinterpret_cast<unsigned int*>(p)[i] = pack_bf16(x[2 * i], x[2 * i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(x[i]);
  }
}

// Sum over the lanes that differ in lane bits O, O / 2, ..., LO (powers of two), scattered: each
// round halves the values a lane keeps, so the lane ends with L / (2 O / LO) sums, block number
// (lane / LO) mod (2 O / LO) of the L (the block of the lane's own bits).
template <int L, int O, int LO>
__device__ __forceinline__ void scatter_sum(float* x, int lane) {
  if constexpr (O >= LO && O > 0) {
    constexpr int H = L / 2;
    const bool up = (lane & O) != 0;
#pragma unroll
    for (int p = 0; p < H; ++p) {
      const float send = up ? x[p] : x[p + H];
      const float keep = up ? x[p + H] : x[p];
      x[p] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    scatter_sum<H, O / 2, LO>(x, lane);
  }
}

// Sum over the lanes that differ in lane bits LO .. O (every lane gets the sum).
template <int LO, int O>
__device__ __forceinline__ float butterfly(float x) {
#pragma unroll
  for (int o = LO; o <= O; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The state rows of a lane from/to a dense [n, v] float32 matrix (p at row i0, column j0).
template <int NR, int NC>
__device__ __forceinline__ void load_state(const float* p, int V, float (&s)[NR][NC]) {
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    Vec<float, NC> x;
    x.load(p + m * V);
#pragma unroll
    for (int c = 0; c < NC; ++c) s[m][c] = x[c];
  }
}
// The same as load_state, a 4-byte load an element: where the ring backward reloads its
// checkpoint, ptxas moved the 16-byte loads' registers into place through local memory.
template <int NR, int NC>
__device__ __forceinline__ void load_state_words(const float* p, int V, float (&s)[NR][NC]) {
#pragma unroll
  for (int m = 0; m < NR; ++m) {
#pragma unroll
    for (int c = 0; c < NC; ++c) s[m][c] = __ldcg(p + m * V + c);
  }
}
template <int NR, int NC>
__device__ __forceinline__ void store_state(float* p, int V, const float (&s)[NR][NC]) {
#pragma unroll
  for (int m = 0; m < NR; ++m) store_vec<float, NC>(p + m * V, s[m]);
}

// ---- the input ring ------------------------------------------------------------------------
// Byte offsets of one ring stage: k, q [n] and x [v] (v, or d_o in the backward's walk) in the
// compute dtype, then decay [v] (a column decay; a scalar one takes its first word) and beta [1]
// in float32, each 16-byte aligned (n and v times the dtype's size are multiples of 16 at every
// warp size). Compile-time offsets: runtime ones cost registers the backward does not have.
template <int N, int V, int TS>
struct Stage {
  static constexpr int k = 0, q = N * TS, x = 2 * N * TS, dec = x + V * TS, beta = dec + 4 * V,
                       bytes = beta + 16;
};
// Stages of the ring (a power of two): kRingStages - 1 steps in flight ahead of the one in use,
// several global round trips at the measured step times.
constexpr int kRingStages = 8;
template <int N, int V, int TS>
constexpr int ring_bytes() {
  return kRingStages * Stage<N, V, TS>::bytes;
}

__device__ __forceinline__ void copy16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void copy4(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}

// A warp's ring of input rows in shared memory. Entry i (the i-th step the kernel reads, in the
// order it reads them) lives in stage i mod kRingStages; every lane commits one cp.async group
// per entry (empty past the last), so `wait` before entry i leaves the kRingStages - 2 younger
// entries in flight. Protocol per entry i: wait(); read stage i; fetch entry i + kRingStages - 1
// into the stage entry i - 1 used (the __syncwarp in `wait` ordered every lane's reads of it).
template <typename T, int N, int V>
struct Ring {
  using St = Stage<N, V, int(sizeof(T))>;
  unsigned char* base;
  int lane;

  __device__ __forceinline__ unsigned char* stage(int i) const {
    return base + (i & (kRingStages - 1)) * St::bytes;
  }
  // Starts copying row `row`'s k, q (with_q), x (from x_src), decay and beta into stage i and
  // commits the group: lane u copies the u-th 16-byte piece of k | q | x | column decay (at most
  // 8 + 8 + 8 + 8 pieces), lanes 0 and 1 the scalar decay and beta.
  __device__ __forceinline__ void fetch(int i, const MatrixArgs& a, int64_t row, bool with_q,
                                        const void* x_src) const {
    constexpr int ts = int(sizeof(T)), ck = N * ts / 16, cx = V * ts / 16, cd = V * 4 / 16;
    static_assert(3 * ck + cd <= 32 && cx <= ck, "one piece a lane");
    const int cq = with_q ? ck : 0, total = ck + cq + cx + (a.column ? cd : 0);
    unsigned char* dst = stage(i);
    if (lane < total) {
      const int u = lane, e1 = ck + cq, e2 = e1 + cx;
      // piece u of the part that holds it: (source row, its first piece, its stage offset)
      const unsigned char* src = u < ck   ? static_cast<const unsigned char*>(a.k) + row * N * ts
                                 : u < e1 ? static_cast<const unsigned char*>(a.q) + row * N * ts
                                 : u < e2 ? static_cast<const unsigned char*>(x_src) + row * V * ts
                                          : reinterpret_cast<const unsigned char*>(a.decay + row * V);
      const int first = u < ck ? 0 : u < e1 ? ck : u < e2 ? e1 : e2;
      const int off = u < ck ? St::k : u < e1 ? St::q : u < e2 ? St::x : St::dec;
      copy16(dst + off + 16 * (u - first), src + 16 * (u - first));
    }
    if (lane == 0 && !a.column) copy4(dst + St::dec, a.decay + row);
    if (lane == 1 && a.beta) copy4(dst + St::beta, a.beta + row);
    commit();
  }
  __device__ __forceinline__ static void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  __device__ __forceinline__ static void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kRingStages - 2) : "memory");
    __syncwarp();
  }
  // Before the ring's space is taken for anything else (the backward's slots follow it, so only
  // at the kernel's end): nothing in flight.
  __device__ __forceinline__ static void drain() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
};

// The backward's order of input rows (what its ring fetches ahead): per chunk, the last first,
// and per sub-chunk [s0, s1) of `slots` steps from the chunk's end, the recompute steps
// start .. s1 - 1, then the walk s1 - 1 .. s0.
struct BackwardOrder {
  int ch, s1, t;  // the chunk, the end of its sub-chunk and the step of the current entry
  bool back;      // the walk (else the recompute)

  __device__ __forceinline__ int s0(const MatrixArgs& a) const { return max(ch * a.K, s1 - a.slots); }
  __device__ __forceinline__ void begin(const MatrixArgs& a) {
    ch = (a.T + a.K - 1) / a.K;
    next_chunk(a);
  }
  __device__ __forceinline__ void next_chunk(const MatrixArgs& a) {
    --ch;
    s1 = min(a.T, (ch + 1) * a.K), t = ch * a.K, back = false;
  }
  __device__ __forceinline__ bool done() const { return ch < 0; }
  __device__ __forceinline__ void advance(const MatrixArgs& a) {
    if (!back) {
      if (t + 1 < s1) ++t;
      else back = true;  // the walk starts at t = s1 - 1
    } else if (t > s0(a)) {
      --t;
    } else if (s0(a) > ch * a.K) {
      s1 = s0(a), t = ch * a.K, back = false;
    } else {
      next_chunk(a);
    }
  }
};

// One step's inputs as a lane uses them, loaded one step ahead.
template <typename T, int NR, int NC, bool kQ, bool kV, bool kDo>
struct Inputs {
  Vec<T, NR> k;
  Vec<T, kQ ? NR : 1> q;
  Vec<T, (kV || kDo) ? NC : 1> x;  // v (kV) or d_o (kDo)
  float dec[NC];
  float beta;

  // Row `row` = t * B H + bh; i0, j0 the lane's first row and column.
  __device__ __forceinline__ void load(const MatrixArgs& a, int64_t row, int N, int V, int i0, int j0) {
    k.load(static_cast<const T*>(a.k) + row * N + i0);
    if constexpr (kQ) q.load(static_cast<const T*>(a.q) + row * N + i0);
    if constexpr (kV) x.load(static_cast<const T*>(a.v_in) + row * V + j0);
    if constexpr (kDo) x.load(static_cast<const T*>(a.d_o) + row * V + j0);
    if (a.column) {
      Vec<float, NC> d;
      d.load(a.decay + row * V + j0);
#pragma unroll
      for (int c = 0; c < NC; ++c) dec[c] = d[c];
    } else {
      const float d = __ldg(a.decay + row);
#pragma unroll
      for (int c = 0; c < NC; ++c) dec[c] = d;
    }
    beta = a.beta ? __ldg(a.beta + row) : 1.f;
  }
  // The same from a ring stage p (Ring::fetch wrote it).
  template <class St>
  __device__ __forceinline__ void read(const unsigned char* p, St st, const MatrixArgs& a, int i0, int j0) {
    k.read(reinterpret_cast<const T*>(p + st.k) + i0);
    if constexpr (kQ) q.read(reinterpret_cast<const T*>(p + st.q) + i0);
    if constexpr (kV || kDo) x.read(reinterpret_cast<const T*>(p + st.x) + j0);
    const float* dp = reinterpret_cast<const float*>(p + st.dec);
    if (a.column) {
      Vec<float, NC> d;
      d.read(dp + j0);
#pragma unroll
      for (int c = 0; c < NC; ++c) dec[c] = d[c];
    } else {
      const float d = *dp;
#pragma unroll
      for (int c = 0; c < NC; ++c) dec[c] = d;
    }
    beta = a.beta ? *reinterpret_cast<const float*>(p + st.beta) : 1.f;
  }
};

// delta = v - S^T k for the lane's columns (a column's sum over its A row lanes); in.x holds v.
template <int A, int NR, int NC, class In>
__device__ __forceinline__ void delta_of(const float (&s)[NR][NC], const In& in, float (&del)[NC]) {
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    float r = 0.f;
#pragma unroll
    for (int m = 0; m < NR; ++m) r = fmaf(s[m][c], in.k[m], r);
    del[c] = in.x[c] - butterfly<1, A / 2>(r);
  }
}

// Column sums of a lane's NC values over its A row lanes, stored to p (the row's column j0):
// scattered (each lane NC / A columns) where NC divides by A, else lane ra = 0 stores all.
template <typename T, int A, int NC>
__device__ __forceinline__ void store_column_sums(T* p, float (&x)[NC], int lane) {
  const int ra = lane % A;
  if constexpr (NC % A == 0) {
    scatter_sum<NC, A / 2, 1>(x, lane);
    store_vec<T, NC / A>(p + ra * (NC / A), x);
  } else {
#pragma unroll
    for (int c = 0; c < NC; ++c) x[c] = butterfly<1, A / 2>(x[c]);
    if (ra == 0) store_vec<T, NC>(p, x);
  }
}

// Row sums of a lane's NR values over the 32 / A column groups, stored to p (the row i0):
// scattered where NR divides by the groups, else lanes cb = 0 store all.
template <typename T, int A, int NR>
__device__ __forceinline__ void store_row_sums(T* p, float (&x)[NR], int lane) {
  constexpr int Bc = 32 / A;
  const int cb = lane / A;
  if constexpr (Bc == 1) {
    store_vec<T, NR>(p, x);
  } else if constexpr (NR % Bc == 0) {
    scatter_sum<NR, 16, A>(x, lane);
    store_vec<T, NR / Bc>(p + cb * (NR / Bc), x);
  } else {
#pragma unroll
    for (int m = 0; m < NR; ++m) x[m] = butterfly<A, 16>(x[m]);
    if (cb == 0) store_vec<T, NR>(p, x);
  }
}

// The ring's shared memory at the start of the dynamic shared memory (then the backward's slots).
template <typename T, int N, int V>
__device__ __forceinline__ Ring<T, N, V> ring_of(const MatrixArgs& a, unsigned char* smem) {
  return {smem, int(threadIdx.x)};
}

template <int A, int NR, int NC, typename T, class Step, bool kRing>
__global__ void __launch_bounds__(32) forward_kernel(const MatrixArgs a) {
  using L = Tile<A, NR, NC>;
  constexpr int N = L::N, V = L::V;
  extern __shared__ float4 smem4[];
  const int lane = threadIdx.x, ra = lane % A, cb = lane / A, i0 = ra * NR, j0 = cb * NC;
  const int64_t BH = int64_t(a.B) * a.H, bh = blockIdx.x, NV = int64_t(N) * V;
  T* o = static_cast<T*>(a.o);
  const Ring<T, N, V> ring = ring_of<T, N, V>(a, reinterpret_cast<unsigned char*>(smem4));

  float s[NR][NC];
  load_state<NR, NC>(a.h0 + bh * NV + i0 * V + j0, V, s);
  Inputs<T, NR, NC, true, true, false> in, next;
  if constexpr (kRing) {
    // entry i = step i
#pragma unroll 1
    for (int i = 0; i < kRingStages - 1; ++i) {
      if (i < a.T) ring.fetch(i, a, int64_t(i) * BH + bh, true, a.v_in);
      else ring.commit();
    }
  } else {
    next.load(a, bh, N, V, i0, j0);
  }
  for (int t = 0; t < a.T; ++t) {
    const int64_t row = int64_t(t) * BH + bh;
    if constexpr (kRing) {
      ring.wait();
      in.read(ring.stage(t), typename Ring<T, N, V>::St{}, a, i0, j0);
      const int ahead = t + kRingStages - 1;
      if (ahead < a.T) ring.fetch(ahead, a, int64_t(ahead) * BH + bh, true, a.v_in);
      else ring.commit();
    } else {
      in = next;
      if (t + 1 < a.T) next.load(a, row + BH, N, V, i0, j0);
    }
    if (t % a.K == 0) store_state<NR, NC>(a.ckpt + (int64_t(t / a.K) * BH + bh) * NV + i0 * V + j0, V, s);
    float w[NC], out[NC];
    delta_of<A>(s, in, w);
#pragma unroll
    for (int c = 0; c < NC; ++c) w[c] *= in.beta, out[c] = 0.f;
#pragma unroll
    for (int m = 0; m < NR; ++m) {
      const float km = in.k[m], qm = in.q[m];
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        s[m][c] = Step::template act<kApprox<T>>(fmaf(in.dec[c], s[m][c], km * w[c]));
        out[c] = fmaf(s[m][c], qm, out[c]);
      }
    }
    store_column_sums<T, A, NC>(o + row * V + j0, out, lane);
  }
  store_state<NR, NC>(a.S_T + bh * NV + i0 * V + j0, V, s);
}

// Shared memory of one warp's slots.
template <int A, int NR, int NC>
constexpr int slot_bytes() {
  return Tile<A, NR, NC>::kSlot * int(sizeof(float));
}

template <int A, int NR, int NC, typename T, class Step, bool kRing>
__global__ void __launch_bounds__(32, 11) backward_kernel(const MatrixArgs a) {
  using L = Tile<A, NR, NC>;
  constexpr int N = L::N, V = L::V, E = L::E;
  constexpr bool kVec4 = E % 4 == 0, kDel4 = NC % 4 == 0;
  // The walk loads its inputs one step ahead, except fp32 at 32 elements a lane, whose prefetched
  // rows of q and k would not fit beside S_t, S_{t-1} and dS in the register budget.
  // With the ring no input waits in registers.
  constexpr bool kAhead = !kRing && (sizeof(T) == 2 || E < 32);
  extern __shared__ float4 smem4[];
  const Ring<T, N, V> ring = ring_of<T, N, V>(a, reinterpret_cast<unsigned char*>(smem4));
  float* const slots_base =
      reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(smem4) + (kRing ? ring_bytes<N, V, int(sizeof(T))>() : 0));
  const int lane = threadIdx.x, ra = lane % A, cb = lane / A, i0 = ra * NR, j0 = cb * NC;
  const int64_t BH = int64_t(a.B) * a.H, bh = blockIdx.x, NV = int64_t(N) * V;
  const int slots = a.slots;
  // The ring's producer walks BackwardOrder kRingStages - 1 entries ahead of the loops below,
  // which read entry `taken` next.
  BackwardOrder ahead;
  int taken = 0;
  auto fetch_next = [&](int i) {
    if (ahead.done()) {
      ring.commit();
      return;
    }
    ring.fetch(i, a, int64_t(ahead.t) * BH + bh, ahead.back, ahead.back ? a.d_o : a.v_in);
    ahead.advance(a);
  };
  if constexpr (kRing) {
    ahead.begin(a);
#pragma unroll 1
    for (int i = 0; i < kRingStages - 1; ++i) fetch_next(i);
  }
  auto take = [&](auto& in) {
    ring.wait();
    in.read(ring.stage(taken), typename Ring<T, N, V>::St{}, a, i0, j0);
    fetch_next(taken + kRingStages - 1);
    ++taken;
  };
  T* dq = static_cast<T*>(a.dq);
  T* dk = static_cast<T*>(a.dk);
  T* dv = static_cast<T*>(a.dv);

  // Slot u: the state at [e][lane] (float4 groups [e / 4][lane][4] where E allows), then delta.
  auto put = [&](int u, const float (&s)[NR][NC], const float (&del)[NC]) {
    float* p = slots_base + u * L::kSlot;
    if constexpr (kVec4) {
#pragma unroll
      for (int e = 0; e < E; e += 4)
        reinterpret_cast<float4*>(p)[(e / 4) * 32 + lane] =
            make_float4(s[e / NC][e % NC], s[(e + 1) / NC][(e + 1) % NC], s[(e + 2) / NC][(e + 2) % NC],
                        s[(e + 3) / NC][(e + 3) % NC]);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) p[e * 32 + lane] = s[e / NC][e % NC];
    }
    p += E * 32;
    if constexpr (kDel4) {
#pragma unroll
      for (int c = 0; c < NC; c += 4)
        reinterpret_cast<float4*>(p)[(c / 4) * 32 + lane] = make_float4(del[c], del[c + 1], del[c + 2], del[c + 3]);
    } else {
#pragma unroll
      for (int c = 0; c < NC; ++c) p[c * 32 + lane] = del[c];
    }
  };
  auto get = [&](int u, float (&s)[NR][NC], float (&del)[NC]) {
    const float* p = slots_base + u * L::kSlot;
    if constexpr (kVec4) {
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        const float4 x = reinterpret_cast<const float4*>(p)[(e / 4) * 32 + lane];
        s[e / NC][e % NC] = x.x, s[(e + 1) / NC][(e + 1) % NC] = x.y;
        s[(e + 2) / NC][(e + 2) % NC] = x.z, s[(e + 3) / NC][(e + 3) % NC] = x.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) s[e / NC][e % NC] = p[e * 32 + lane];
    }
    p += E * 32;
    if constexpr (kDel4) {
#pragma unroll
      for (int c = 0; c < NC; c += 4) {
        const float4 x = reinterpret_cast<const float4*>(p)[(c / 4) * 32 + lane];
        del[c] = x.x, del[c + 1] = x.y, del[c + 2] = x.z, del[c + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int c = 0; c < NC; ++c) del[c] = p[c * 32 + lane];
    }
  };

  float dS[NR][NC], s[NR][NC];
  load_state<NR, NC>(a.d_ST + bh * NV + i0 * V + j0, V, dS);
  const int chunks = (a.T + a.K - 1) / a.K;
  for (int ch = chunks - 1; ch >= 0; --ch) {
    const int start = ch * a.K, end = min(a.T, start + a.K);
    const float* ck = a.ckpt + (int64_t(ch) * BH + bh) * NV + i0 * V + j0;
    for (int s1 = end, s0; s1 > start; s1 = s0) {
      s0 = max(start, s1 - slots);
      // Recompute: s = S_{t-1} for t = start .. s1 - 1 (kept with delta_t from s0), ending as S_{s1-1}.
      if constexpr (kRing) load_state_words<NR, NC>(ck, V, s);
      else load_state<NR, NC>(ck, V, s);
      {
        Inputs<T, NR, NC, false, true, false> in, next;
        if constexpr (!kRing) next.load(a, int64_t(start) * BH + bh, N, V, i0, j0);
        for (int t = start; t < s1; ++t) {
          if constexpr (kRing) {
            take(in);
          } else {
            in = next;
            if (t + 1 < s1) next.load(a, int64_t(t + 1) * BH + bh, N, V, i0, j0);
          }
          float del[NC], w[NC];
          delta_of<A>(s, in, del);
#pragma unroll
          for (int c = 0; c < NC; ++c) w[c] = in.beta * del[c];
          if (t >= s0) put(t - s0, s, del);
#pragma unroll
          for (int m = 0; m < NR; ++m) {
            const float km = in.k[m];
#pragma unroll
            for (int c = 0; c < NC; ++c)
              s[m][c] = Step::template act<kApprox<T>>(fmaf(in.dec[c], s[m][c], km * w[c]));
          }
        }
      }
      // Walk back: s = S_t, the slot holds S_{t-1} and delta_t (each lane reads back only what
      // it wrote, so no barrier).
      Inputs<T, NR, NC, true, false, true> in, next;
      if constexpr (kAhead) next.load(a, int64_t(s1 - 1) * BH + bh, N, V, i0, j0);
      for (int t = s1 - 1; t >= s0; --t) {
        const int64_t row = int64_t(t) * BH + bh;
        if constexpr (kRing) {
          take(in);
        } else if constexpr (kAhead) {
          in = next;
          if (t > s0) next.load(a, row - BH, N, V, i0, j0);
        } else {
          in.load(a, row, N, V, i0, j0);
        }
        float so[NR][NC], del[NC];
        get(t - s0, so, del);
        // read-out: dS += q do^T, dq = S_t do; dP = dS * act'(S_t) kept in dS
        float pq[NR], sk[NC], ddc[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) sk[c] = 0.f, ddc[c] = 0.f;
#pragma unroll
        for (int m = 0; m < NR; ++m) {
          const float qm = in.q[m], km = in.k[m];
          pq[m] = 0.f;
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const float sn = s[m][c], dov = in.x[c];
            pq[m] = fmaf(sn, dov, pq[m]);
            const float dp = fmaf(qm, dov, dS[m][c]) * Step::grad(sn);
            dS[m][c] = dp;
            ddc[c] = fmaf(dp, so[m][c], ddc[c]);
            sk[c] = fmaf(dp, km, sk[c]);
          }
        }
        // d delta = beta dP^T k (= dv), d beta = sum_j (dP^T k)_j delta_j
        float ddel[NC], bd[NC], dbeta = 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          sk[c] = butterfly<1, A / 2>(sk[c]);
          ddel[c] = in.beta * sk[c];
          bd[c] = in.beta * del[c];
          dbeta = fmaf(sk[c], del[c], dbeta);
        }
        // dk = beta dP delta - S_{t-1} d delta; dS_{t-1} = decay * dP - k d delta^T
        float pk[NR];
#pragma unroll
        for (int m = 0; m < NR; ++m) {
          const float km = in.k[m];
          pk[m] = 0.f;
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            pk[m] = fmaf(dS[m][c], bd[c], pk[m]);
            pk[m] = fmaf(-so[m][c], ddel[c], pk[m]);
            dS[m][c] = fmaf(in.dec[c], dS[m][c], -km * ddel[c]);
            s[m][c] = so[m][c];
          }
        }
        {
          float dvv[NC];
#pragma unroll
          for (int c = 0; c < NC; ++c) dvv[c] = ddel[c];
          if (ra == 0) store_vec<T, NC>(dv + row * V + j0, dvv);
        }
        store_row_sums<T, A, NR>(dq + row * N + i0, pq, lane);
        store_row_sums<T, A, NR>(dk + row * N + i0, pk, lane);
        if (a.column) {
          store_column_sums<float, A, NC>(a.d_decay + row * V + j0, ddc, lane);
        } else {
          float dd = 0.f;
#pragma unroll
          for (int c = 0; c < NC; ++c) dd += ddc[c];
          dd = butterfly<1, 16>(dd);
          if (lane == 0) a.d_decay[row] = dd;
        }
        if (a.beta) {
          dbeta = butterfly<A, 16>(dbeta);
          if (lane == 0) a.d_beta[row] = dbeta;
        }
      }
    }
  }
  store_state<NR, NC>(a.dh0 + bh * NV + i0 * V + j0, V, dS);
}

}  // namespace warp
}  // namespace matrix
}  // namespace elman
