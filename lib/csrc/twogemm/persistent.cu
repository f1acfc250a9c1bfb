// The low-rank persistent kernels (E4, E5, E66, E67lr): one launch runs the whole sequence.
//
// A cluster of C CTAs owns kPersistentColumns batch columns; CTA c owns the state rows
// I_c = [c S, c S + S), S = ceil(D / C), keeps its rows' state in shared memory and its
// slices of the factors there for the whole sequence: V[:, I_c] and U[I_c, :]. A forward step
//   1. multiplies its slice: part_c = V[:, I_c] h_{t-1}[I_c] (r values per batch column);
//   2. cluster barrier; every CTA sums the C partials from the peers' shared memory in rank
//      order (so every CTA holds the same p = V h_{t-1}, bitwise), rank 0 stores p for dU;
//   3. q[I_c] = U[I_c, :] p, then the fused stage (stage.cuh) gives h_t[I_c] and the outputs.
// The backward mirrors it: the stage's gradient on I_c, partials of d_pre U, the barrier and
// the r-wide sum, then g[I_c] += (d_pre U) V[:, I_c]. Only r-wide partials cross the cluster,
// never a D-wide state. The partial buffers are double: step t writes buffer t % 2, which
// the peers read before they arrive at the barrier of step t + 1, and it is written again
// only after that barrier. A last barrier keeps every CTA alive while peers may still read
// its shared memory. The state is rounded to the storage dtype every step, as the per-step
// path stores it.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "common/cluster.cuh"
#include "common/math.cuh"
#include "twogemm/launch.cuh"
#include "twogemm/stage.cuh"
#include "twogemm/twogemm.h"

namespace elman {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = kLaunchThreads;
constexpr int kBC = kPersistentColumns;

int rows_per_cta(int dim, int cluster) { return (dim + cluster - 1) / cluster; }

// Bytes of shared memory: fp32 partials (2 buffers), the summed vector, one or two state
// slices, then the two factor slices in the storage dtype.
int smem_bytes(int dim, int rank, int cluster, int elem, bool backward) {
  const int s = rows_per_cta(dim, cluster);
  const int floats = 3 * kBC * rank + (backward ? 2 : 1) * kBC * s;
  return floats * 4 + 2 * s * rank * elem;
}

struct Slice {
  int S, row0, rows, col0, nb, rank_c, C;
};

__device__ __forceinline__ Slice slice_of(const cg::cluster_group& cluster, int dim, int batch) {
  Slice s;
  s.C = int(cluster.num_blocks());
  s.rank_c = int(cluster.block_rank());
  s.S = (dim + s.C - 1) / s.C;
  s.row0 = s.rank_c * s.S;
  s.rows = max(0, min(s.S, dim - s.row0));
  s.col0 = int(blockIdx.x) / s.C * kBC;
  s.nb = max(0, min(kBC, batch - s.col0));
  return s;
}

// p[o] = sum over ranks of part[o] (o < nb r), in rank order; rank 0 stores it to dst.
template <typename T>
__device__ __forceinline__ void reduce_partials(const cg::cluster_group& cluster, const Slice& s,
                                                float* part, float* p, int r, T* dst) {
  for (int o = threadIdx.x; o < s.nb * r; o += kThreads) {
    float sum = 0.f;
    for (int cc = 0; cc < s.C; ++cc) sum += cluster.map_shared_rank(part, cc)[o];
    p[o] = sum;
    if (s.rank_c == 0) dst[size_t(s.col0) * r + o] = from_float<T>(sum);
  }
}

// This CTA's slices of the factors: ik[i][k] and ki[k][i] (i < S a row of I_c, k < r), U in
// ik and V in ki when `u_in_ik`, the other way round otherwise; rows beyond D are zeros.
template <typename T>
__device__ __forceinline__ void load_slices(T* ik, T* ki, const LowRankPersistent& a,
                                            const Slice& s, bool u_in_ik) {
  const T* u = static_cast<const T*>(a.u);
  const T* v = static_cast<const T*>(a.v);
  const int r = a.rank;
  for (int o = threadIdx.x; o < s.S * r; o += kThreads) {
    const int i = o / r, k = o % r;
    const bool in = i < s.rows;
    const T uu = in ? u[size_t(s.row0 + i) * r + k] : from_float<T>(0.f);
    const T vv = in ? v[size_t(k) * a.dim + s.row0 + i] : from_float<T>(0.f);
    ik[o] = u_in_ik ? uu : vv;
    ki[k * s.S + i] = u_in_ik ? vv : uu;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) lowrank_persistent_forward_kernel(LowRankPersistent a) {
  cg::cluster_group cluster = cg::this_cluster();
  const int D = a.dim, B = a.batch, r = a.rank;
  const Slice s = slice_of(cluster, D, B);
  extern __shared__ __align__(16) unsigned char smem[];
  float* part = reinterpret_cast<float*>(smem);  // [2][kBC][r]
  float* p = part + 2 * kBC * r;                  // [kBC][r]
  float* hs = p + kBC * r;                        // [kBC][S]
  T* vt = reinterpret_cast<T*>(hs + kBC * s.S);   // V[:, I_c] transposed: [S][r]
  T* ut = vt + s.S * r;                           // U[I_c, :] transposed: [r][S]
  load_slices<T>(vt, ut, a, s, false);
  const T* h0 = static_cast<const T*>(a.h0);
  T* h_all = static_cast<T*>(a.h_all);
  for (int o = threadIdx.x; o < kBC * s.S; o += kThreads) {
    const int j = o / s.S, i = o % s.S;
    float h = 0.f;
    if (j < s.nb && i < s.rows) {
      const size_t idx = size_t(s.col0 + j) * D + s.row0 + i;
      h = to_float(h0[idx]);
      h_all[idx] = h0[idx];
    }
    hs[o] = h;
  }
  __syncthreads();
  const T* av = static_cast<const T*>(a.a);
  const T* cv = static_cast<const T*>(a.c);
  const T* bv = static_cast<const T*>(a.b);
  T* out = static_cast<T*>(a.out);
  T* aux = static_cast<T*>(a.aux);
  T* p_all = static_cast<T*>(a.p_all);
  for (int t = 0; t < a.steps; ++t) {
    float* buf = part + (t & 1) * kBC * r;
    for (int o = threadIdx.x; o < s.nb * r; o += kThreads) {
      const int j = o / r, k = o % r;
      float acc = 0.f;
      for (int i = 0; i < s.rows; ++i) acc += to_float(vt[i * r + k]) * hs[j * s.S + i];
      buf[o] = acc;
    }
    cluster.sync();
    reduce_partials<T>(cluster, s, buf, p, r, p_all + size_t(t) * B * r);
    __syncthreads();
    for (int o = threadIdx.x; o < s.nb * s.rows; o += kThreads) {
      const int j = o / s.rows, i = o % s.rows;
      float q = 0.f;
      for (int k = 0; k < r; ++k) q += to_float(ut[k * s.S + i]) * p[j * r + k];
      const size_t idx = (size_t(t) * B + s.col0 + j) * D + s.row0 + i;
      const float pre = to_float(av[idx]) + q + to_float(bv[s.row0 + i]);
      const StageOut st = lowrank_stage(a.mode, pre, to_float(cv[idx]), hs[j * s.S + i]);
      const T h = from_float<T>(st.h);
      h_all[idx + size_t(B) * D] = h;
      out[idx] = from_float<T>(st.out);
      if (a.mode != kTanhGate) aux[idx] = from_float<T>(st.aux);
      hs[j * s.S + i] = to_float(h);
    }
    __syncthreads();
  }
  cluster.sync();  // no CTA leaves while a peer may still read its partials
}

template <typename T>
__global__ void __launch_bounds__(kThreads) lowrank_persistent_backward_kernel(LowRankPersistent a) {
  cg::cluster_group cluster = cg::this_cluster();
  const int D = a.dim, B = a.batch, r = a.rank;
  const Slice s = slice_of(cluster, D, B);
  extern __shared__ __align__(16) unsigned char smem[];
  float* part = reinterpret_cast<float*>(smem);  // [2][kBC][r]
  float* dp = part + 2 * kBC * r;                 // [kBC][r]
  float* gs = dp + kBC * r;                       // [kBC][S]: dL/dh on I_c
  float* dps = gs + kBC * s.S;                    // [kBC][S]: d_pre on I_c
  T* us = reinterpret_cast<T*>(dps + kBC * s.S);  // U[I_c, :]: [S][r]
  T* vs = us + s.S * r;                           // V[:, I_c]: [r][S]
  load_slices<T>(us, vs, a, s, true);
  const T* d_hT = static_cast<const T*>(a.d_hT);
  for (int o = threadIdx.x; o < kBC * s.S; o += kThreads) {
    const int j = o / s.S, i = o % s.S;
    gs[o] = j < s.nb && i < s.rows ? to_float(d_hT[size_t(s.col0 + j) * D + s.row0 + i]) : 0.f;
    dps[o] = 0.f;
  }
  __syncthreads();
  const T* d_out = static_cast<const T*>(a.d_out);
  const T* cv = static_cast<const T*>(a.c);
  const T* h_all = static_cast<const T*>(a.h_all);
  const T* aux = static_cast<const T*>(a.aux);
  T* d_pre = static_cast<T*>(a.d_pre);
  T* d_c = static_cast<T*>(a.d_c);
  T* dp_all = static_cast<T*>(a.dp_all);
  const bool gated = a.mode != kTanhGate;
  for (int t = a.steps - 1; t >= 0; --t) {
    float* buf = part + (t & 1) * kBC * r;
    for (int o = threadIdx.x; o < s.nb * s.rows; o += kThreads) {
      const int j = o / s.rows, i = o % s.rows;
      const size_t idx = (size_t(t) * B + s.col0 + j) * D + s.row0 + i;
      const StageGrad st = lowrank_stage_grad(
          a.mode, to_float(d_out[idx]), to_float(cv[idx]), gated ? to_float(h_all[idx]) : 0.f,
          to_float(h_all[idx + size_t(B) * D]), gated ? to_float(aux[idx]) : 0.f, gs[j * s.S + i]);
      const T dpre = from_float<T>(st.d_pre);
      d_pre[idx] = dpre;
      d_c[idx] = from_float<T>(st.d_c);
      dps[j * s.S + i] = to_float(dpre);
      gs[j * s.S + i] = st.direct;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < s.nb * r; o += kThreads) {
      const int j = o / r, k = o % r;
      float acc = 0.f;
      for (int i = 0; i < s.rows; ++i) acc += dps[j * s.S + i] * to_float(us[i * r + k]);
      buf[o] = acc;
    }
    cluster.sync();
    reduce_partials<T>(cluster, s, buf, dp, r, dp_all + size_t(t) * B * r);
    __syncthreads();
    for (int o = threadIdx.x; o < s.nb * s.rows; o += kThreads) {
      const int j = o / s.rows, i = o % s.rows;
      float acc = 0.f;
      for (int k = 0; k < r; ++k) acc += dp[j * r + k] * to_float(vs[k * s.S + i]);
      gs[j * s.S + i] += acc;
    }
    __syncthreads();
  }
  T* dh0 = static_cast<T*>(a.dh0);
  for (int o = threadIdx.x; o < s.nb * s.rows; o += kThreads) {
    const int j = o / s.rows, i = o % s.rows;
    dh0[size_t(s.col0 + j) * D + s.row0 + i] = from_float<T>(gs[j * s.S + i]);
  }
  cluster.sync();  // no CTA leaves while a peer may still read its partials
}

}  // namespace

LowRankPlan lowrank_persistent_plan(int batch, int dim, int rank, bool bf16) {
  LowRankPlan plan;
  if (batch < 1 || dim < 1 || rank < 1) {
    plan.reason = "B, D and r must be at least 1";
    return plan;
  }
  if (!bf16) {  // fp32 runs the per-step paths (as the dense family's persistent kernels do)
    plan.reason = "the persistent kernels are bf16 only";
    return plan;
  }
  return plan_clusters<void(LowRankPersistent)>(
      {lowrank_persistent_forward_kernel<__nv_bfloat16>, lowrank_persistent_backward_kernel<__nv_bfloat16>},
      {8, 16}, batch, dim, kBC,
      [&](int cluster) {
        return max(smem_bytes(dim, rank, cluster, 2, false), smem_bytes(dim, rank, cluster, 2, true));
      },
      dim < 8 ? "D is below 8 (one state row per CTA of an 8-CTA cluster at least)"
              : "the factor slices do not fit one cluster's shared memory at this D and r");
}

template <typename T>
cudaError_t lowrank_persistent_forward(const LowRankPlan& plan, const LowRankPersistent& a) {
  return launch_clusters(lowrank_persistent_forward_kernel<T>, plan, a);
}

template <typename T>
cudaError_t lowrank_persistent_backward(const LowRankPlan& plan, const LowRankPersistent& a) {
  return launch_clusters(lowrank_persistent_backward_kernel<T>, plan, a);
}

template cudaError_t lowrank_persistent_forward<__nv_bfloat16>(const LowRankPlan&, const LowRankPersistent&);
template cudaError_t lowrank_persistent_backward<__nv_bfloat16>(const LowRankPlan&, const LowRankPersistent&);

}  // namespace elman
