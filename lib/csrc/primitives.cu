// Synchronisation primitives timed for the "Kernel engineering" chapter: the costs a
// persistent time-step kernel pays per step. Each launcher runs `iters` repetitions inside
// one launch, so (time(iters) - time(0)) / iters is the cost of one repetition.
#include <cooperative_groups.h>

#include "dense.h"

namespace cg = cooperative_groups;

namespace elman {
namespace {

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void add_release_gpu(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_cluster(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.cluster.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_cluster(unsigned* p, unsigned v) {
  asm volatile("st.release.cluster.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__global__ void empty_kernel() {}

// Grid-wide barrier, either cooperative groups' grid.sync() or a monotonic counter with
// release/acquire atomics (flags[0] must start at 0).
__global__ void grid_sync_kernel(int iters, bool use_cg, unsigned* flags) {
  for (int i = 0; i < iters; ++i) {
    if (use_cg) {
      cg::this_grid().sync();
    } else {
      __syncthreads();
      if (threadIdx.x == 0) {
        const unsigned target = gridDim.x * unsigned(i + 1);
        add_release_gpu(flags, 1);
        while (ld_acquire_gpu(flags) < target) {
        }
      }
      __syncthreads();
    }
  }
}

// Two blocks bounce a counter through two global flags: one round trip = two L2 hops.
__global__ void flag_pingpong_kernel(int iters, unsigned* flags) {
  if (threadIdx.x != 0) return;
  unsigned* mine = flags + 32 * blockIdx.x;           // separate 128-byte lines
  unsigned* theirs = flags + 32 * (1 - blockIdx.x);
  for (int i = 1; i <= iters; ++i) {
    if (blockIdx.x == 0) {
      st_release_gpu(theirs, unsigned(i));
      while (ld_acquire_gpu(mine) != unsigned(i)) {
      }
    } else {
      while (ld_acquire_gpu(mine) != unsigned(i)) {
      }
      st_release_gpu(theirs, unsigned(i));
    }
  }
}

__global__ void cluster_sync_kernel(int iters) {
  cg::cluster_group cluster = cg::this_cluster();
  for (int i = 0; i < iters; ++i) cluster.sync();
}

// Two CTAs of one cluster bounce a counter through each other's shared memory.
__global__ void dsmem_pingpong_kernel(int iters) {
  __shared__ unsigned flag;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) flag = 0;
  cluster.sync();
  if (threadIdx.x == 0) {
    const unsigned rank = cluster.block_rank();
    unsigned* theirs = cluster.map_shared_rank(&flag, 1 - rank);
    for (int i = 1; i <= iters; ++i) {
      if (rank == 0) {
        st_release_cluster(theirs, unsigned(i));
        while (ld_acquire_cluster(&flag) != unsigned(i)) {
        }
      } else {
        while (ld_acquire_cluster(&flag) != unsigned(i)) {
        }
        st_release_cluster(theirs, unsigned(i));
      }
    }
  }
  cluster.sync();
}

cudaError_t launch_cluster(void (*kernel)(int), int cluster, int iters, cudaStream_t stream) {
  if (cluster > 8) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster);
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, iters);
  return e == cudaSuccess ? cudaGetLastError() : e;
}

}  // namespace

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_grid_sync(cudaStream_t stream, int iters, bool use_cg, unsigned* flags) {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  void* args[] = {&iters, &use_cg, &flags};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(grid_sync_kernel), dim3(sms),
                                     dim3(128), args, 0, stream);
}

cudaError_t launch_flag_pingpong(cudaStream_t stream, int iters, unsigned* flags) {
  void* args[] = {&iters, &flags};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(flag_pingpong_kernel), dim3(2),
                                     dim3(32), args, 0, stream);
}

cudaError_t launch_cluster_sync(cudaStream_t stream, int cluster, int iters) {
  return launch_cluster(cluster_sync_kernel, cluster, iters, stream);
}

cudaError_t launch_dsmem_pingpong(cudaStream_t stream, int iters) {
  return launch_cluster(dsmem_pingpong_kernel, 2, iters, stream);
}

}  // namespace elman
