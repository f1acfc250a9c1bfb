// Pieces of E23's persistent kernels (tape_persistent.cu, tape_persistent_backward.cu): the
// cluster shape and the reductions of per-CTA partial slot scores across the cluster.
#pragma once

#include <cooperative_groups.h>

#include "twogemm/launch.cuh"
#include "twogemm/twogemm.h"
#include "twogemm/warp.cuh"

namespace elman {
namespace tape_cluster {

namespace cg = cooperative_groups;

constexpr int kThreads = kLaunchThreads;
constexpr int kBC = kTapeColumns;

// Warp j < nb: prob[j][n] = softmax_n(scale * sum over ranks of part[j][n]) (peers' buffers).
__device__ inline void softmax_of_partials(const cg::cluster_group& cluster, int C, int nb, int slots,
                                    float scale, float* part, float* prob) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (warp >= nb) return;
  float* pr = prob + warp * slots;
  for (int n = lane; n < slots; n += 32) {
    float sum = 0.f;
    for (int cc = 0; cc < C; ++cc) sum += cluster.map_shared_rank(part, cc)[warp * slots + n];
    pr[n] = scale * sum;
  }
  softmax_warp(pr, slots, lane);
}

// dst[j][n] = sum_{i < rows} tape[j][n][i] w[j * stride + i] (zero for columns j >= nb).
__device__ __forceinline__ void partial_scores(float* dst, const float* tape, const float* w,
                                               int stride, int nb, int slots, int S, int rows) {
  for (int o = threadIdx.x; o < kBC * slots; o += kThreads) {
    const int j = o / slots;
    float acc = 0.f;
    if (j < nb)
      for (int i = 0; i < rows; ++i) acc += tape[o * S + i] * w[j * stride + i];
    dst[o] = acc;
  }
}

// Warp j < nb, on partials laid out [j][2 N] (a score, then a gradient, per slot): out[j][n] =
// softmax_n(scale * sum of the scores) and out[j][N + n] = p_n (q_n - sum_m p_m q_m) with q the
// summed gradients: the softmax and its backward, summed over ranks in rank order.
__device__ inline void softmax_and_grad(const cg::cluster_group& cluster, int C, int nb, int slots,
                                        float scale, float* part, float* out) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (warp >= nb) return;
  float* p = out + warp * 2 * slots;
  float* q = p + slots;
  for (int n = lane; n < slots; n += 32) {
    float sc = 0.f, gr = 0.f;
    for (int cc = 0; cc < C; ++cc) {
      const float* peer = cluster.map_shared_rank(part, cc) + warp * 2 * slots;
      sc += peer[n];
      gr += peer[slots + n];
    }
    p[n] = scale * sc;
    q[n] = gr;
  }
  softmax_warp(p, slots, lane);
  float dot = 0.f;
  for (int n = lane; n < slots; n += 32) dot += p[n] * q[n];
  dot = warp_sum(dot);
  for (int n = lane; n < slots; n += 32) q[n] = p[n] * (q[n] - dot);
}

}  // namespace tape_cluster
}  // namespace elman
