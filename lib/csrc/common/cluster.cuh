// Thread-block-cluster helpers (sm_90) shared by the persistent kernels of every family and
// the primitive benchmarks (dev/primitives.cu): the timer, the jitter build's delays,
// shared-memory addresses, mbarriers, the three ways one CTA can put bytes into another CTA's
// shared memory, and the cluster launch configuration.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace elman {

// The GPU's nanosecond timer (with clock64, the SM clock a kernel ran at).
__device__ __forceinline__ long long globaltimer() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// The persistent kernels' phase traces (a traced forward is its own instantiation, kTrace; in
// the untraced one these are no code): thread 0 of CTA 0 writes clock64 at phase `phase` of
// step `step` into trace[step * phases + phase] (`trace_mark`), and after the `steps` steps
// clock64 and %globaltimer at kernel start (slot 0) and end (slot 1) (`trace_stamp`).
template <bool kTrace>
__device__ __forceinline__ bool tracing() {
  return kTrace && blockIdx.x == 0 && threadIdx.x == 0;
}
template <bool kTrace>
__device__ __forceinline__ void trace_mark(long long* trace, int phases, int step, int phase) {
  if (tracing<kTrace>()) trace[step * phases + phase] = clock64();
}
template <bool kTrace>
__device__ __forceinline__ void trace_stamp(long long* trace, int phases, int steps, int slot) {
  if (tracing<kTrace>()) {
    trace[steps * phases + 2 * slot] = clock64();
    trace[steps * phases + 2 * slot + 1] = globaltimer();
  }
}

// The jitter build (ELMAN_JITTER: the extension elman_dense_jitter, built and run only by
// tests/test_jitter_gpu.py): at each synchronisation point of a step of either persistent
// design a quarter of the warps sleep a pseudo-random 0-2 us, a different pattern per CTA,
// warp, step and point. The kernels'
// arithmetic order does not depend on timing, so a race-free protocol gives bitwise the
// results of the normal build; a race (a buffer read while it is overwritten, a slice used
// before it arrived) shows up as a difference. It complements compute-sanitizer's racecheck
// (scripts/sanitize_persistent.cu, a plain CUDA program: under Python racecheck stops with an
// internal error on these kernels).
__device__ __forceinline__ void jitter(int step, int point) {
#ifdef ELMAN_JITTER
  uint32_t h = (blockIdx.x * 0x9E3779B1u) ^ ((threadIdx.x >> 5) * 0x85EBCA77u) ^
               (uint32_t(step) * 0xC2B2AE3Du) ^ (uint32_t(point) * 0x27D4EB2Fu);
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  if ((h & 3) == 0) __nanosleep(h >> 21);  // up to 2047 ns
#else
  (void)step;
  (void)point;
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// The address `addr` of this CTA's shared memory, in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// ---- mbarriers: one arrival (the expect) plus a byte count per phase ---------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)));
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(const uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// ---- putting bytes into a peer's shared memory, counted on the peer's mbarrier ---------
// 16 bytes from registers (st.async); `remote` and `remote_bar` come from map_to_rank.
__device__ __forceinline__ void st_async(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(remote),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}
// `bytes` (a multiple of 16) from this CTA's shared memory by the bulk-copy engine. The
// source must be made visible to the async proxy first (fence_async_shared).
__device__ __forceinline__ void bulk_to_peer(uint32_t remote, const void* src, uint32_t bytes,
                                             uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(remote),
      "r"(smem_u32(src)), "r"(bytes), "r"(remote_bar)
      : "memory");
}
// `bytes` from global memory into the same offset `dst` of every CTA in `mask`, counted on
// the mbarrier at the same offset `bar` of each (the source written by this CTA must be
// made visible to the async proxy first: fence_async_global).
__device__ __forceinline__ void bulk_multicast(void* dst, const void* src, uint32_t bytes,
                                               uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void fence_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---- launch ----------------------------------------------------------------------------
// A 1-D grid of `clusters` clusters of `cluster` CTAs; `attr` must outlive the launch.
inline cudaLaunchConfig_t cluster_launch_config(int cluster, int clusters, int threads, int smem,
                                                cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster * clusters);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}
// The attributes a kernel needs before a launch with `smem` bytes and clusters of `cluster`.
template <class Kernel>
cudaError_t allow_cluster_launch(Kernel* k, int smem, int cluster) {
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess && cluster > 8)
    e = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return e;
}

}  // namespace elman
