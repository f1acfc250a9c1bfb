// The tensor-core pieces both persistent designs share (dense_persistent.cu: one cluster;
// dense_grid.cu: a grid of 128 CTAs): bf16 mma.sync m16n8k16 with fp32 accumulation, a warp's
// W_h (or W_h^T) tile as A fragments in registers, and its accumulators stored as partial
// sums [column][row] in shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace elman {

__device__ __forceinline__ uint32_t pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// This lane's A fragments of kMT row tiles (rows row0 + 16 mt ...) by kKS k-steps (columns
// k0 + 16 s ...) of the [dim][dim] matrix w, or of its transpose.
template <int kMT, int kKS>
__device__ __forceinline__ void load_a(uint32_t (&a)[kMT][kKS][4], const __nv_bfloat16* w,
                                       int dim, int row0, int k0, bool transposed) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int s = 0; s < kKS; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = row0 + mt * 16 + g + ((i & 1) ? 8 : 0);
        const int col = k0 + s * 16 + 2 * q + ((i & 2) ? 8 : 0);
        const size_t lo = transposed ? size_t(col) * dim + row : size_t(row) * dim + col;
        const size_t hi = transposed ? size_t(col + 1) * dim + row : size_t(row) * dim + col + 1;
        a[mt][s][i] = pack(w[lo], w[hi]);
      }
}

// Adds the kC independent accumulator chains of a warp into the first and stores its kMT x
// kNT tiles (rows row0 + 16 mt ..., batch columns col0 + 8 nt ...) into red[column][row],
// `stride` floats per column.
template <int kC, int kMT, int kNT>
__device__ __forceinline__ void store_acc(float (&acc)[kC][kMT][kNT][4], float* red, int stride,
                                          int row0, int col0) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int c = 1; c < kC; ++c)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][mt][nt][i] += acc[c][mt][nt][i];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int row = row0 + mt * 16 + g, col = col0 + nt * 8 + 2 * q;
      red[col * stride + row] = acc[0][mt][nt][0];
      red[(col + 1) * stride + row] = acc[0][mt][nt][1];
      red[col * stride + row + 8] = acc[0][mt][nt][2];
      red[(col + 1) * stride + row + 8] = acc[0][mt][nt][3];
    }
}

}  // namespace elman
