// Planning and launching the two-GEMM family's persistent kernels: a 1-D grid of clusters of
// 8 or 16 CTAs of kLaunchThreads threads, one cluster per group of batch columns.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <map>
#include <tuple>

#include "common/cluster.cuh"
#include "twogemm/twogemm.h"

namespace elman {

constexpr int kLaunchThreads = 256;
constexpr int kSmemBudget = 200 * 1024;

// Whether the current GPU holds one cluster of `cluster` CTAs of kernel k with `smem` bytes
// each (the kernel's attributes for that launch are set on the way). Answers are cached per
// device, kernel, cluster and size: the ops plan every call.
template <class Kernel>
bool cluster_fits(Kernel* k, int cluster, int smem) {
  if (smem > kSmemBudget) return false;
  int dev = 0;
  cudaGetDevice(&dev);
  static std::map<std::tuple<int, const void*, int, int>, bool> cache;
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(k), cluster, smem);
  const auto hit = cache.find(key);
  if (hit != cache.end()) return hit->second;
  int active = 0;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_launch_config(cluster, 1, kLaunchThreads, smem, nullptr, attr);
  bool ok = allow_cluster_launch(k, smem, cluster) == cudaSuccess &&
            cudaOccupancyMaxActiveClusters(&active, k, &cfg) == cudaSuccess && active >= 1;
  if (!ok) cudaGetLastError();
  cache[key] = ok;
  return ok;
}

// The first cluster size of `sizes` (8 or 16, at most dim) whose shared memory smem_of(cluster)
// every kernel of `kernels` fits; `columns` batch columns per cluster.
template <class Kernel, class Smem>
LowRankPlan plan_clusters(std::initializer_list<Kernel*> kernels, std::initializer_list<int> sizes,
                          int batch, int dim, int columns, Smem smem_of, const char* reason) {
  LowRankPlan plan;
  for (const int cluster : sizes) {
    if (dim < cluster) continue;
    const int smem = smem_of(cluster);
    bool fits = true;
    for (Kernel* k : kernels) fits = fits && cluster_fits(k, cluster, smem);
    if (!fits) continue;
    plan.ok = true;
    plan.cluster = cluster;
    plan.clusters = (batch + columns - 1) / columns;
    plan.smem = smem;
    return plan;
  }
  plan.reason = reason;
  return plan;
}

template <class Kernel, class Args>
cudaError_t launch_clusters(Kernel* k, const LowRankPlan& plan, const Args& a) {
  cudaError_t e = allow_cluster_launch(k, plan.smem, plan.cluster);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg =
      cluster_launch_config(plan.cluster, plan.clusters, kLaunchThreads, plan.smem, a.stream, attr);
  return cudaLaunchKernelEx(&cfg, k, a);
}

}  // namespace elman
