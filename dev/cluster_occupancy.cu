// How many thread-block clusters of each size an H100 holds at once, for a kernel that takes a
// whole SM (256 or 512 threads, 120 or 200 KiB of dynamic shared memory): the question behind
// the dense family's two designs. The cluster design needs a cluster of D / 64 CTAs per group of
// batch columns; the grid design at D = 2048 needs 128 CTAs resident at once, so it can use
// clusters only if 128 / C clusters of C CTAs fit. Then the L2 read rate that the grid design's
// state crossing pays: CTA i reads quarter i % 4 of a buffer with 16-byte ld.global.cg loads,
// a block barrier between reads.
// Check: every cluster count is positive and holds no more CTAs than the GPU has SMs, and the
// occupancy does not depend on the threads or shared memory (one CTA per SM either way).
// Time: CUDA events around 500 reads.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o cluster_occupancy dev/cluster_occupancy.cu && ./cluster_occupancy
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

__global__ void whole_sm(int* p) {
  extern __shared__ int s[];
  if (p) p[0] = s[threadIdx.x];
}

__global__ void l2_read(const uint4* buf, int bytes, int iters, unsigned* sink) {
  const uint4* src = buf + size_t(blockIdx.x % 4) * (bytes / 16);
  uint32_t x = 0;
  for (int it = 0; it < iters; ++it) {
    for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      uint4 v;
      asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src + i));
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();
  }
  if (x == 0x12345678) sink[0] = x;
}

static int max_clusters(int threads, int smem, int c) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute a[1];
  cfg.gridDim = dim3(c);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  a[0].id = cudaLaunchAttributeClusterDimension;
  a[0].val.clusterDim.x = c;
  a[0].val.clusterDim.y = 1;
  a[0].val.clusterDim.z = 1;
  cfg.attrs = a;
  cfg.numAttrs = 1;
  int n = -1;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, whole_sm, &cfg);
  if (e != cudaSuccess) std::printf("cluster %d: %s\n", c, cudaGetErrorString(e));
  return e == cudaSuccess ? n : -1;
}

int main() {
  int sms = 0, failed = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(whole_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(whole_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("%d SMs\n\n| cluster size | clusters at once | CTAs | check |\n|---|---|---|---|\n", sms);
  for (int c : {1, 2, 4, 8, 16}) {
    const int n = max_clusters(512, 200 * 1024, c);
    bool ok = n > 0 && n * c <= sms;
    for (int threads : {256, 512})
      for (int smem : {120 * 1024, 200 * 1024}) ok = ok && max_clusters(threads, smem, c) == n;
    failed += !ok;
    std::printf("| %d | %d | %d | %s |\n", c, n, n * c, ok ? "OK" : "WRONG");
  }

  uint4* buf;
  unsigned* sink;
  cudaMalloc(&buf, 4 << 20);
  cudaMalloc(&sink, 4);
  cudaMemset(buf, 1, 4 << 20);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::printf("\n| CTAs | bytes per CTA | us per read | TB/s |\n|---|---|---|---|\n");
  for (int ctas : {32, 64, 128, 132})
    for (int bytes : {16384, 32768, 65536}) {
      const int iters = 500;
      l2_read<<<ctas, 512>>>(buf, bytes, 10, sink);
      cudaEventRecord(a);
      l2_read<<<ctas, 512>>>(buf, bytes, iters, sink);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0.f;
      cudaEventElapsedTime(&ms, a, b);
      const double us = ms * 1e3 / iters;
      std::printf("| %d | %d | %.3f | %.2f |\n", ctas, bytes, us, double(ctas) * bytes / us / 1e6);
    }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("%s\n", cudaGetErrorString(e));
    return 1;
  }
  return failed ? 1 : 0;
}
