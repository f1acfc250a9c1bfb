// The tensor-core pieces the persistent designs share (dense/persistent.cuh: one cluster;
// dense/grid.cuh: a grid of 128 CTAs): bf16 mma.sync m16n8k16 with fp32 accumulation, a warp's
// W_h (or W_h^T) tile as A fragments in registers, its accumulators stored as partial sums
// [column][row] in shared memory, and the warpgroup-wide wgmma of the grid design.
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

// The B fragments of two consecutive k-steps of one n-tile from shared memory in one
// instruction: four 8 x 8 matrices whose rows are the 8 batch columns and whose 8 bf16 are
// consecutive k. Lane l gives the address of row l % 8 of matrix l / 8 (16-byte aligned); the
// registers come back as b0, b1 of the first k-step, then of the second (the m16n8k16 B
// layout). Volatile with a memory clobber: it stays after the mbarrier wait for its data.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&b)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr)
               : "memory");
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

// ---- wgmma (sm_90a): D (64 x N, fp32) += A (64 x 16, bf16, registers) B (16 x N, bf16 in
// shared memory). A warpgroup (4 consecutive warps from a multiple of 4) issues it together;
// warp i of the group holds rows 16 i .. 16 i + 15 of A in the m16k16 fragment layout of
// mma.sync (load_a with one m-tile) and the same rows of D as mma.sync's accumulator
// layout, n-tile by n-tile (d[4 nt + i]).

// Shared-memory matrix descriptor of a K-major operand with 128-byte swizzle: rows of 64
// bf16 (128 bytes) whose 16-byte chunks are XORed with row % 8, in 1024-byte atoms of 8
// rows (the atom must be 1024-byte aligned). `addr` is the first row's address plus 32 bytes
// per k-step of 16; the leading offset is unused for this layout (1), the stride between
// 8-row groups is 1024 bytes.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// The accumulators are written asynchronously: keep the compiler from moving their uses
// across wgmma_wait_all.
template <int N>
__device__ __forceinline__ void fence_operands(float (&c)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(c[i])::"memory");
}
// N = 8 NT batch columns; `accumulate` false overwrites D.
template <int NT>
__device__ __forceinline__ void wgmma(float (&d)[NT * 4], const uint32_t (&a)[4], uint64_t b,
                                      bool accumulate);
template <>
__device__ __forceinline__ void wgmma<4>(float (&d)[16], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, "
      "p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}
template <>
__device__ __forceinline__ void wgmma<8>(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, "
      "p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}

}  // namespace elman
