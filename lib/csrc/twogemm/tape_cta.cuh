// The CTA machinery of E23's persistent kernels (tape_persistent.cu: forward,
// tape_persistent_backward.cu: backward). A cluster of C CTAs (4, 8 or 16) owns 8 batch
// columns; CTA c owns the state rows [32 c, 32 c + 32); warp b owns batch column b and lane l
// row 32 c + l, so each thread owns one state element and that element's tape column. Slot
// vectors (scores, softmax weights, their gradients) live one slot per lane (N <= 32).
// Per exchange each warp sends a packet to every CTA (st.async, 16 bytes a store, counted on
// the receiver's mbarrier): its 32 values of a D-wide vector (bf16), which land in the
// receiver's gathered copy [8][D_p + 8] (the mma B operand), and N fp32 per-CTA partial slot
// sums, which land in [src][8][np] and are summed in rank order (every CTA gets the same sum).
// The D x D products run on tensor cores with the 32-row weight slices in registers as mma A
// fragments, each warp its k-range of D_p = 32 C, partials summed over warps in shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/cluster.cuh"
#include "common/mma.cuh"
#include "twogemm/exchange.cuh"
#include "twogemm/launch.cuh"
#include "twogemm/twogemm.h"
#include "twogemm/warp.cuh"

namespace elman {
namespace tape_cta {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
static_assert(kThreads == kLaunchThreads, "the plan asks occupancy at kLaunchThreads");
constexpr int kRows = 32;                   // state rows per CTA: one per lane
constexpr int kCols = kTapeForwardColumns;  // batch columns per cluster: one per warp
static_assert(kCols == kWarps && kCols == 8, "one warp per batch column, one mma n-tile");
constexpr int kPacketW = kRows * 2;         // bytes of the vector in a warp's packet

// The cluster: the fewest CTAs of 32 rows (4, 8 or 16) that cover D.
__host__ __device__ constexpr int cluster_for(int dim) {
  return dim <= 4 * kRows ? 4 : dim <= 8 * kRows ? 8 : 16;
}
__host__ __device__ constexpr int padded_slots(int slots) { return (slots + 3) & ~3; }
__host__ __device__ constexpr int gathered_width(int cluster) { return cluster * kRows + 8; }
// Bytes of one exchange buffer (gathered vector and slot partials) and of the packets.
__host__ __device__ constexpr int exchange_bytes(int cluster, int slots) {
  return kCols * gathered_width(cluster) * 2 + cluster * kCols * padded_slots(slots) * 4;
}
__host__ __device__ constexpr int packet_bytes(int slots) { return kPacketW + 4 * padded_slots(slots); }
__host__ __device__ constexpr int product_bytes(int matrices) { return kWarps * matrices * 2 * 4 * 32 * 4; }

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// The replacement write of one tape element, in one fixed order (the forward and the
// backward's recompute give the same bits).
__device__ __forceinline__ float tape_update(float m, float beta, float u) {
  return round_bf16(__fmaf_rn(beta, u, __fmul_rn(1.f - beta, m)));
}

// softmax over the lanes n < N <= kWidth of v (other lanes 0), by butterflies within groups of
// kWidth lanes. Every lane runs the shuffles of the max and the sum: a full-mask shuffle under a
// lane-dependent branch is undefined. The lanes n < N get the bits of a whole-warp butterfly
// (warp_max, warp_sum): its first steps (offsets kWidth and up) add exact zeros there.
template <int kWidth>
__device__ __forceinline__ float softmax_group(float v, int slots) {
  const int lane = int(threadIdx.x) & 31;
  float mx = lane < slots ? v : -INFINITY;
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float e = lane < slots ? expf(v - mx) : 0.f;
  float sum = e;
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  return lane < slots ? e / sum : 0.f;
}
__device__ __forceinline__ float softmax_lanes(float v, int slots) {
  if (slots <= 8) return softmax_group<8>(v, slots);
  if (slots <= 16) return softmax_group<16>(v, slots);
  return softmax_group<32>(v, slots);
}

// The lane n < N gets sum over the warp's lanes of f(n); the others 0. Slots go in groups of
// 8 through a reduce-scatter over lane bits 4, 3, 2 (7 shuffles leave slot s of the group in
// lanes 4 s .. 4 s + 3, each a quarter sum), bits 1, 0 finish the sums and one shuffle moves
// slot s to lane s: 10 shuffles a group instead of 5 a slot.
template <class F>
__device__ __forceinline__ float slot_sums(int slots, F f) {
  const int lane = int(threadIdx.x) & 31;
  float mine = 0.f;
  for (int n0 = 0; n0 < slots; n0 += 8) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = n0 + i < slots ? f(n0 + i) : 0.f;
#pragma unroll
    for (int st = 0; st < 3; ++st) {
      const int o = 16 >> st, half = 4 >> st;
      const bool hi = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float send = hi ? v[i] : v[i + half];
        const float keep = hi ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
      }
    }
    float sum = v[0];
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float got = __shfl_sync(0xffffffffu, sum, 4 * (lane & 7));
    if (lane >= n0 && lane < n0 + 8) mine = got;
  }
  return mine;
}

// An exchange buffer: gathered [8][D_p + 8] bf16, then partials [C][8][np] fp32.
struct Exchange {
  unsigned char* base;
  int cluster, np;
  __device__ __nv_bfloat16* gathered() const { return reinterpret_cast<__nv_bfloat16*>(base); }
  __device__ float* partials() const {
    return reinterpret_cast<float*>(base + kCols * gathered_width(cluster) * 2);
  }
  // By the whole warp of column b: the packet (this warp's 32 bf16 `value`, lane n's slot
  // partial `slot`; staged in `packet`) into this buffer of every CTA, counted on `bar`.
  __device__ void send(unsigned char* packet, int rank, __nv_bfloat16 value, float slot,
                       uint64_t* bar) const {
    const int lane = int(threadIdx.x) & 31, b = int(threadIdx.x) >> 5;
    reinterpret_cast<__nv_bfloat16*>(packet)[lane] = value;
    if (lane < np) reinterpret_cast<float*>(packet + kPacketW)[lane] = slot;
    __syncwarp();
    const int chunks = (kPacketW + 4 * np) / 16;
    const uint32_t bar_local = smem_u32(bar);
    for (int i = lane; i < cluster * chunks; i += 32) {
      const int peer = i / chunks, ch = i % chunks;
      const uint4 val = reinterpret_cast<const uint4*>(packet)[ch];
      const void* dst =
          ch < kPacketW / 16
              ? static_cast<const void*>(gathered() + b * gathered_width(cluster) + rank * kRows + ch * 8)
              : static_cast<const void*>(partials() + (rank * kCols + b) * np + (ch - kPacketW / 16) * 4);
      st_async(map_to_rank(smem_u32(dst), uint32_t(peer)), val, map_to_rank(bar_local, uint32_t(peer)));
    }
  }
  // Lane n < N of column b's warp: the partials of slot n summed in rank order (kC = the
  // cluster size, so that the C loads issue together).
  template <int kC>
  __device__ float slot_total(int slots) const {
    const int lane = int(threadIdx.x) & 31, b = int(threadIdx.x) >> 5;
    const float* p = partials() + b * np + lane;
    float s = 0.f;
    if (lane < slots) {
#pragma unroll
      for (int src = 0; src < kC; ++src) s += p[src * kCols * np];
    }
    return s;
  }
  __device__ uint32_t bytes() const { return uint32_t(cluster * kCols * (kPacketW + 4 * np)); }
};

// The products of the gathered vector xb with M weight slices (A fragments f[m][tile][k-step],
// this warp's k-range from k0): out[m] = this thread's element (row = lane, column = warp), in
// fp32. Every thread of the CTA calls it (one block barrier); `red` holds product_bytes(M).
template <int M, int KS>
__device__ __forceinline__ void products(const uint32_t (&f)[M][2][KS][4], const __nv_bfloat16* xb,
                                         int kw, int k0, float* red, float (&out)[M]) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, q = lane & 3;
  float acc[M][2][4] = {};
  const __nv_bfloat16* xs = xb + g * kw + k0 + 2 * q;
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(xs + s * 16);
    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(xs + s * 16 + 8);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      mma(acc[m][0], f[m][0][s], b0, b1);
      mma(acc[m][1], f[m][1][s], b0, b1);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(((warp * M + m) * 2 + j) * 4 + e) * 32 + lane] = acc[m][j][e];
  __syncthreads();
  // element (row lane, column warp): tile lane / 16, accumulator e of lane src.
  const int mt = lane >> 4, rr = lane & 15;
  const int src = (rr & 7) * 4 + (warp >> 1), e = (rr >> 3) * 2 + (warp & 1);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(((w * M + m) * 2 + mt) * 4 + e) * 32 + src];
    out[m] = s;
  }
}

// The 32-row slice (rows row0..) of the D x D matrix elem(i, k) as this warp's A fragments
// over its k-range [k0, k0 + 16 KS); zeros beyond D.
template <int KS, class Elem>
__device__ __forceinline__ void load_slice(uint32_t (&f)[2][KS][4], int row0, int k0, int dim, Elem elem) {
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
  load_frags(f, 0, 1, 2, [&](int m, int k) {
    return row0 + m < dim && k0 + k < dim ? elem(row0 + m, k0 + k) : zero;
  });
}

}  // namespace tape_cta
}  // namespace elman
