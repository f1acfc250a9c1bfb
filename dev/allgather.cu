// The all-gather of one step of the persistent cluster kernel (lib/csrc: the dense family's
// cluster design), alone and then made step by step more like the kernel's step, to see where
// the exchange's time goes. Two clusters of 16 CTAs (512 threads each), D = 1024, 8 batch
// columns: each CTA writes its 1152-byte slice of the new state to a global slot, fences, and
// one thread multicasts the slot from L2 into every CTA of its cluster (cp.async.bulk
// .multicast::cluster), completing bytes on the receivers' mbarriers; the state is
// double-buffered. Variant bits:
//   1: per-source mbarriers (16) instead of one per buffer; warps wait per source
//   2: slice written as 2-byte stores by all 512 threads into the padded layout
//   4: receivers read the state (B-fragment loads as the multiply does) + mma.sync work
//   8: output stores (2 x 2 bytes per thread per round, streaming) after the issue
//  16: cp.async staging of 2 x 1 KiB of streaming inputs per round
// Check: after the last round every CTA holds every source's slice of the last step (variants
// with 16-byte stores, whose slices carry step, source and chunk). Time: SM cycles per round
// and from the multicast's issue to the arrival of the CTA's own slice (CTA 0, thread 0).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o allgather dev/allgather.cu && ./allgather
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
namespace cg = cooperative_groups;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)));
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(const uint64_t* bar, uint32_t parity) {
  asm volatile("{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               " @!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_multicast(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint16_t mask) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
               "[%0], [%1], %2, [%3], %4;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(mask) : "memory");
}
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%5,%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(b0), "r"(b1));
}

constexpr int C = 16, kRow = 72, kBlock = 8 * kRow, kBytes = kBlock * 2;  // bc = 8, D = 1024

template <int V>
__global__ void __launch_bounds__(512, 1) probe(int iters, __nv_bfloat16* xchg, __nv_bfloat16* outs,
                                               const __nv_bfloat16* ins, long long* res, float* sink,
                                               int* bad) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ __align__(128) __nv_bfloat16 state[2][C * kBlock];
  __shared__ __align__(16) __nv_bfloat16 stage[4][2 * 512];
  __shared__ uint64_t bar[2][C];
  const int rank = int(cluster.block_rank()), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int i = 0; i < 2 * C; ++i) mbar_init(&bar[0][0] + i);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int i = tid; i < C * kBlock; i += 512) state[0][i] = __float2bfloat16(0.f);
  cluster.sync();
  constexpr bool kPerSource = V & 1;
  long long t_issue = 0, lat = 0, t0 = 0;
  float acc[4] = {0, 0, 0, 0};
  int nlat = 0;
  for (int t = 0; t < iters; ++t) {
    if (t == 16) t0 = clock64();
    const int nb = (t + 1) & 1;
    if (kPerSource) { if (tid < C) mbar_expect(&bar[nb][tid], kBytes); }
    else if (tid == 0) mbar_expect(&bar[nb][0], C * kBytes);
    if (V & 16) {  // stage step t + 3's inputs
      const __nv_bfloat16* g = ins + (size_t(t + 3) % 4096) * 2 * 512 * C + size_t(blockIdx.x) * 1024;
      if (tid < 128)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(&stage[(t + 3) & 3][tid * 8])), "l"(g + tid * 8));
      asm volatile("cp.async.commit_group;\n" ::);
    }
    // wait for the previous exchange (state buffer t & 1)
    if (t > 0) {
      const int pb = t & 1;
      const uint32_t par = ((t - 1) >> 1) & 1;
      if (kPerSource) {
        const int kg = warp % 8;
        for (int s = 0; s < 8; ++s) {
          const int col = kg * 128 + s * 16, src = col / 64;
          if (s == 0 || col % 64 == 0) {
            mbar_wait(&bar[pb][src], par);
            if (s == 0 && tid == 0 && t_issue) { lat += clock64() - t_issue; ++nlat; }
          }
          if (V & 4) {
            const __nv_bfloat16* row = &state[pb][src * kBlock + (lane >> 2) * kRow + col % 64 + 2 * (lane & 3)];
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row), b1 = *reinterpret_cast<const uint32_t*>(row + 8);
            mma(acc, 0x3c003c00u + s, b0, b1);
            mma(acc, 0x3c003c01u + s, b0, b1);
          }
        }
      } else {
        mbar_wait(&bar[pb][0], par);
        if (tid == 0 && t_issue) { lat += clock64() - t_issue; ++nlat; }
        if (V & 4) {
          for (int s = 0; s < 8; ++s) {
            const int col = (warp % 8) * 128 + s * 16, src = col / 64;
            const __nv_bfloat16* row = &state[pb][src * kBlock + (lane >> 2) * kRow + col % 64 + 2 * (lane & 3)];
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row), b1 = *reinterpret_cast<const uint32_t*>(row + 8);
            mma(acc, 0x3c003c00u + s, b0, b1);
            mma(acc, 0x3c003c01u + s, b0, b1);
          }
        }
      }
    }
    if (V & 4) __syncthreads();  // the partial-sum barrier
    float in_v = 0.f;
    if (V & 16) {
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
      in_v = __bfloat162float(stage[t & 3][tid]);
    }
    // write the slice to the global slot
    __nv_bfloat16* slot = xchg + (size_t(blockIdx.x) * 2 + nb) * kBlock;
    const __nv_bfloat16 v = __float2bfloat16(float(t) + acc[0] * 1e-30f + in_v * 1e-30f);
    if (V & 2) {
      slot[(tid / 64) * kRow + tid % 64] = v;
    } else if (tid < kBytes / 16) {
      uint4 w = make_uint4(t, rank, tid, 0);
      reinterpret_cast<uint4*>(slot)[tid] = w;
    }
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    __syncthreads();
    if (t + 1 < iters && tid == 0) {
      bulk_multicast(&state[nb][rank * kBlock], slot, kBytes, kPerSource ? &bar[nb][rank] : &bar[nb][0], uint16_t((1u << C) - 1));
      t_issue = clock64();
    }
    if (V & 8) {
      const size_t off = (size_t(t) % 4096) * 1024 * C + size_t(blockIdx.x) * 512 + tid;
      outs[off] = v;
      outs[off + 512 * 4096 * C] = v;
    }
  }
  if (tid == 0) {
    res[blockIdx.x * 2] = (clock64() - t0) / (iters - 16);
    res[blockIdx.x * 2 + 1] = nlat ? lat / nlat : 0;
  }
  if (acc[0] == 12345.f) sink[tid] = acc[1];
  __syncthreads();
  if (!(V & 2)) {  // the last exchange (step iters - 2) holds chunk j of source s as (step, s, j, 0)
    const uint4* got = reinterpret_cast<const uint4*>(state[(iters - 1) & 1]);
    for (int i = tid; i < C * (kBytes / 16); i += 512) {
      const uint4 w = got[i];
      const int s = i / (kBytes / 16), j = i % (kBytes / 16);
      if (w.x != unsigned(iters - 2) || w.y != unsigned(s) || w.z != unsigned(j) || w.w != 0u) atomicAdd(bad, 1);
    }
  }
  cluster.sync();
}

template <int V>
int run(__nv_bfloat16* xchg, __nv_bfloat16* outs, const __nv_bfloat16* ins, long long* res, float* sink,
        int* bad) {
  auto k = probe<V>;
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(2 * C); cfg.blockDim = dim3(512); cfg.attrs = attr; cfg.numAttrs = 1;
  cudaMemset(bad, 0, sizeof(int));
  for (int rep = 0; rep < 2; ++rep) {
    cudaLaunchKernelEx(&cfg, k, 2000, xchg, outs, ins, res, sink, bad);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("V=%d: %s\n", V, cudaGetErrorString(e)); return 1; }
  }
  long long r[4];
  int wrong = 0;
  cudaMemcpy(r, res, sizeof(r), cudaMemcpyDeviceToHost);
  cudaMemcpy(&wrong, bad, sizeof(int), cudaMemcpyDeviceToHost);
  printf("| %2d | %-11s | %-10s | %-9s | %-10s | %-7s | %6lld | %6lld | %s |\n", V,
         V & 1 ? "per-source" : "one", V & 2 ? "2-byte" : "16-byte", V & 4 ? "yes" : "", V & 8 ? "yes" : "",
         V & 16 ? "yes" : "", r[0], r[1], V & 2 ? "not checked" : (wrong ? "WRONG" : "OK"));
  return wrong != 0;
}

int main() {
  __nv_bfloat16 *xchg, *outs, *ins;
  long long* res;
  float* sink;
  cudaMalloc(&xchg, 64 * 2 * kBytes);
  cudaMalloc(&outs, size_t(2) * 4096 * 1024 * C * 2);
  cudaMalloc(&ins, size_t(4100) * 2 * 512 * C * 2 + 4096);
  cudaMemset(ins, 0, size_t(4100) * 2 * 512 * C * 2 + 4096);
  cudaMalloc(&res, 64 * 8 * 2);
  cudaMalloc(&sink, 4096);
  int* bad;
  cudaMalloc(&bad, sizeof(int));
  printf("| V | mbarriers | stores | +multiply | +outputs | +inputs | cycles/round | issue->own slice | check |\n"
         "|---|---|---|---|---|---|---|---|---|\n");
  int failed = 0;
  failed += run<0>(xchg, outs, ins, res, sink, bad);
  failed += run<1>(xchg, outs, ins, res, sink, bad);
  failed += run<2>(xchg, outs, ins, res, sink, bad);
  failed += run<3>(xchg, outs, ins, res, sink, bad);
  failed += run<4>(xchg, outs, ins, res, sink, bad);
  failed += run<5>(xchg, outs, ins, res, sink, bad);
  failed += run<7>(xchg, outs, ins, res, sink, bad);
  failed += run<15>(xchg, outs, ins, res, sink, bad);
  failed += run<23>(xchg, outs, ins, res, sink, bad);
  failed += run<31>(xchg, outs, ins, res, sink, bad);
  failed += run<0>(xchg, outs, ins, res, sink, bad);
  failed += run<7>(xchg, outs, ins, res, sink, bad);
  return failed ? 1 : 0;
}
