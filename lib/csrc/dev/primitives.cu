// Synchronisation primitives timed for the "Kernel engineering" chapter: the costs a
// persistent time-step kernel pays per step. Each launcher runs `iters` repetitions inside
// one launch, so (time(iters) - time(0)) / iters is the cost of one repetition.
#include <cooperative_groups.h>

#include "common/cluster.cuh"
#include "dev/primitives.h"

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

// The state exchange of a persistent step, alone: every CTA of a cluster of C sends a
// `slice`-byte block to all C CTAs (itself included) and waits until all C blocks of the
// step arrived, `iters` times in a row, double-buffered exactly as the kernels do (a CTA
// sends exchange t + 1 only after it received exchange t). Methods:
//   0 st.async: 16-byte stores from registers by all threads (after a __syncthreads);
//   1 bulk: the slice is written to local shared memory, then one bulk copy per peer;
//   2 multicast: the slice is written to global memory, then one bulk copy from global
//     multicast to the whole cluster.
template <int kMethod>
__global__ void allgather_kernel(int iters, int slice, uint4* scratch) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int total = C * slice, chunks = slice / 16;
  uint4* mine = reinterpret_cast<uint4*>(smem + 2 * total);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 2 * total + slice);
  uint4* global_slice = scratch + (size_t(blockIdx.x) * 2) * chunks;  // [2][chunks] per CTA
  if (threadIdx.x == 0) {
    mbar_init(&bar[0]);
    mbar_init(&bar[1]);
    mbar_init_fence();
  }
  cluster.sync();
  for (int t = 0; t < iters; ++t) {
    unsigned char* dst = smem + ((t + 1) & 1) * total + rank * slice;  // this CTA's block
    uint64_t* b = &bar[(t + 1) & 1];
    if (threadIdx.x == 0) mbar_expect(b, total);
    if (t > 0) mbar_wait(&bar[t & 1], ((t - 1) >> 1) & 1);
    const uint4 v = make_uint4(t, rank, threadIdx.x, 0);  // the step's "result"
    if (kMethod == 0) {
      __syncthreads();
      for (int c = threadIdx.x; c < C * chunks; c += blockDim.x)
        st_async(map_to_rank(smem_u32(dst + (c % chunks) * 16), c / chunks), v,
                 map_to_rank(smem_u32(b), c / chunks));
    } else if (kMethod == 1) {
      for (int c = threadIdx.x; c < chunks; c += blockDim.x) mine[c] = v;
      fence_async_shared();
      __syncthreads();
      if (int(threadIdx.x) < C)
        bulk_to_peer(map_to_rank(smem_u32(dst), threadIdx.x), mine, slice,
                     map_to_rank(smem_u32(b), threadIdx.x));
    } else {
      uint4* g = global_slice + (t & 1) * chunks;
      for (int c = threadIdx.x; c < chunks; c += blockDim.x) g[c] = v;
      fence_async_global();
      __syncthreads();
      if (threadIdx.x == 0) bulk_multicast(dst, g, slice, b, uint16_t((1u << C) - 1));
    }
  }
  if (iters > 0) mbar_wait(&bar[iters & 1], ((iters - 1) >> 1) & 1);
  cluster.sync();
}

// The SM clock a kernel runs at, by the kind of work it does: each CTA (512 threads, one per
// SM) reads clock64 and %globaltimer (ns) before and after `rounds` rounds of
//   work 0: 64 dependent FMAs a thread (no tensor work);
//   work 1: 64 mma.sync m16n8k16 a warp in four independent chains, back to back;
//   work 2: the same 64 mma.sync, but each round starts when %globaltimer crosses a multiple
//           of 2 us, the warps spinning on the timer in between (short multiplies separated
//           by waits: the shape of a persistent step).
// out[2 b] = cycles and out[2 b + 1] = nanoseconds of CTA b.
__global__ void clock_probe_kernel(int work, int rounds, long long* out) {
  const long long c0 = clock64(), g0 = globaltimer();
  float x = threadIdx.x * 1e-3f;
  float c[4][4] = {};
  const uint32_t a = 0x3F803F80u;  // two bf16 ones
  for (int r = 0; r < rounds; ++r) {
    if (work == 0) {
#pragma unroll 16
      for (int i = 0; i < 64; ++i) x = fmaf(x, 1.0001f, 1e-7f);
      continue;
    }
    if (work == 2) {
      const long long now = globaltimer(), next = (now / 2000 + 1) * 2000;
      while (globaltimer() < next) {
      }
    }
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, "
            "{%4,%4}, {%0,%1,%2,%3};\n"
            : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
            : "r"(a));
  }
  const long long c1 = clock64(), g1 = globaltimer();
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = c1 - c0;
    out[2 * blockIdx.x + 1] = g1 - g0;
  }
  if (x == -1.f && c[0][0] + c[1][1] + c[2][2] + c[3][3] == -1.f) out[0] = 0;  // keep the work
}

// Issue rate of one instruction kind per SM per clock: every thread runs 8 independent chains
// of `iters` instructions (op 0 tanh.approx.f32, 1 ex2.approx.f32, 2 fma.rn.f32), so latency
// is hidden by the chains and the warps. out[3b .. 3b + 2] = CTA b's SM and its clock64 before
// and after the loop: the SM's clock is one counter, so the span from its first CTA's start to
// its last CTA's end covers every instruction the SM ran, however the CTAs overlapped.
template <int kOp>
__global__ void throughput_kernel(int iters, long long* out, float* sink) {
  float x[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = 0.1f * (threadIdx.x % 7) + 0.01f * c;
  __syncthreads();
  const long long c0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      if constexpr (kOp == 0) asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x[c]));
      else if constexpr (kOp == 1) asm volatile("ex2.approx.f32 %0, %0;" : "+f"(x[c]));
      else asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFF0, 0f33D6BF95;" : "+f"(x[c]));
    }
  }
  __syncthreads();
  const long long c1 = clock64();
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    out[3 * blockIdx.x] = sm;
    out[3 * blockIdx.x + 1] = c0;
    out[3 * blockIdx.x + 2] = c1;
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += x[c];
  if (s == -1.f) sink[0] = s;  // keep the chains
}

cudaError_t launch_cluster(void (*kernel)(int), int cluster, int iters, cudaStream_t stream) {
  if (cluster > 8) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
  }
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = cluster_launch_config(cluster, 1, 128, 0, stream, attr);
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

cudaError_t launch_clock_probe(cudaStream_t stream, int work, int blocks, int rounds,
                               long long* out) {
  if (work < 0 || work > 2 || blocks < 1 || rounds < 0) return cudaErrorInvalidValue;
  // 120 KB of (unused) shared memory a CTA: no two CTAs share an SM.
  constexpr int kSmem = 120 * 1024;
  const cudaError_t e =
      cudaFuncSetAttribute(clock_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  clock_probe_kernel<<<blocks, 512, kSmem, stream>>>(work, rounds, out);
  return cudaGetLastError();
}

cudaError_t launch_throughput(cudaStream_t stream, int op, int blocks, int threads, int iters,
                              long long* out, float* sink) {
  if (op < 0 || op > 2 || blocks < 1 || threads < 32 || threads > 1024 || threads % 32 || iters < 0)
    return cudaErrorInvalidValue;
  void (*k)(int, long long*, float*) = op == 0   ? throughput_kernel<0>
                                       : op == 1 ? throughput_kernel<1>
                                                 : throughput_kernel<2>;
  k<<<blocks, threads, 0, stream>>>(iters, out, sink);
  return cudaGetLastError();
}

cudaError_t launch_allgather(cudaStream_t stream, int method, int cluster, int slice, int iters,
                             void* scratch) {
  if (method < 0 || method > 2 || cluster < 2 || cluster > 16 || slice < 16 || slice % 16 ||
      slice > 8192)
    return cudaErrorInvalidValue;
  void (*k)(int, int, uint4*) = method == 0   ? allgather_kernel<0>
                                : method == 1 ? allgather_kernel<1>
                                              : allgather_kernel<2>;
  const int smem = (2 * cluster + 1) * slice + 16;
  cudaError_t e = allow_cluster_launch(k, smem, cluster);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = cluster_launch_config(cluster, 1, 512, smem, stream, attr);
  e = cudaLaunchKernelEx(&cfg, k, iters, slice, static_cast<uint4*>(scratch));
  return e == cudaSuccess ? cudaGetLastError() : e;
}

}  // namespace elman
