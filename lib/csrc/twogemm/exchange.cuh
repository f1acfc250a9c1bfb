// Pieces the two-GEMM family's persistent kernels share (persistent.cu: low-rank;
// tape_persistent.cu: E23's forward): register-to-peer stores counted on the peer's
// mbarrier (st.async), bf16 halves of a packed word, and mma.sync A fragments of a weight
// slice loaded once into registers.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/mma.cuh"

namespace elman {

// 4 or 8 bytes from registers into a peer's shared memory, counted on the peer's mbarrier
// (`remote`, `remote_bar` from map_to_rank). 16 bytes: common/cluster.cuh's st_async.
__device__ __forceinline__ void st_async4(uint32_t remote, uint32_t x, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote),
      "r"(x), "r"(remote_bar)
      : "memory");
}
__device__ __forceinline__ void st_async8(uint32_t remote, uint32_t x, uint32_t y, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n" ::"r"(
          remote),
      "r"(x), "r"(y), "r"(remote_bar)
      : "memory");
}

__device__ __forceinline__ float lo_f(uint32_t v) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(v & 0xFFFFu)));
}
__device__ __forceinline__ float hi_f(uint32_t v) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(v >> 16)));
}

// A fragments: f[j][s] is 16-row tile `tile0 + j * step` by k-step s of the matrix elem(m, k)
// (elem returns zero outside the matrix). Rows g, g + 8; columns 2q, 2q + 1, + 8.
template <int M, int K, class Elem>
__device__ __forceinline__ void load_frags(uint32_t (&f)[M][K][4], int tile0, int step, int tiles,
                                           Elem elem) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < M; ++j)
#pragma unroll
    for (int s = 0; s < K; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tile = tile0 + j * step;
        const int m = tile * 16 + g + 8 * (i & 1), k = s * 16 + 2 * q + 8 * (i >> 1);
        f[j][s][i] = tile < tiles ? pack(elem(m, k), elem(m, k + 1)) : 0u;
      }
}

}  // namespace elman
