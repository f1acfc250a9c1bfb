// How many clusters of each size the GPU holds at once (1 CTA per SM by shared memory).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
__global__ void k(int* p) { extern __shared__ int s[]; if (p) p[0] = s[threadIdx.x]; }
int main() {
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("sms %d\n", sms);
  for (int threads : {256, 512})
    for (int smem : {120 * 1024, 200 * 1024})
      for (int c : {1, 2, 4, 8, 16}) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute a[1];
        cfg.gridDim = dim3(c); cfg.blockDim = dim3(threads); cfg.dynamicSmemBytes = smem;
        a[0].id = cudaLaunchAttributeClusterDimension; a[0].val.clusterDim.x = c;
        a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
        cfg.attrs = a; cfg.numAttrs = 1;
        int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k, &cfg);
        printf("threads %d smem %dK cluster %2d: %d clusters (%d CTAs) %s\n", threads, smem / 1024, c, n, n * c, cudaGetErrorString(e));
      }
  int main2(); return main2();
}
// L2 read rate of the D = 2048 state exchange: CTA i reads quarter i % 4 of a [4][bytes]
// buffer (ld.global.cg, 16 B per load) `iters` times, a block barrier between reads.
__global__ void l2read(const uint4* buf, int bytes, int iters, unsigned* sink) {
  const uint4* src = buf + size_t(blockIdx.x % 4) * (bytes / 16);
  uint32_t x = 0;
  for (int it = 0; it < iters; ++it) {
    for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      uint4 v;
      asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src + i));
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();
  }
  if (x == 0x12345678) sink[0] = x;
}
int main2() {
  uint4* buf; unsigned* sink;
  cudaMalloc(&buf, 4 << 20); cudaMalloc(&sink, 4); cudaMemset(buf, 1, 4 << 20);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int ctas : {32, 64, 128, 132})
    for (int bytes : {16384, 32768, 65536}) {
      const int iters = 500;
      l2read<<<ctas, 512>>>(buf, bytes, 10, sink);
      cudaEventRecord(a);
      l2read<<<ctas, 512>>>(buf, bytes, iters, sink);
      cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b);
      const double us = ms * 1e3 / iters;
      printf("l2read ctas %3d bytes/CTA %6d: %.3f us per read, %.2f TB/s\n", ctas, bytes, us, double(ctas) * bytes / us / 1e6);
    }
  return 0;
}
