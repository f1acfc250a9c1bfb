// E23's persistent backward: one launch runs the whole backward.
//
// The cluster layout of the forward (tape_persistent.cu): CTA c owns the state rows I_c of
// kTapeColumns batch columns and keeps W_h[:, I_c] and W_wr[:, I_c] (the columns: the
// backward multiplies by the transposes) in shared memory. Segments of K steps run last to
// first. A segment first recomputes its K tapes, M[:, I_c] of each, into shared memory from
// its checkpoint by the write alone (one cluster barrier per step for the N write scores;
// u_t = W_wr w_t comes from one GEMM over the saved w before the launch). Then each step, with
// dM (fp32, on chip for the whole backward) holding dL/dM_t and g holding dL/dw_t from later
// steps:
//   1. partial write scores and dbeta over I_c; barrier; every CTA sums them in rank order:
//      beta, de; then on I_c: du, dM <- the write's part of dL/dM_{t-1}, gw = g + d_out
//      silu(z) + s sum de M (stages.tape_write_backward);
//   2. barrier; gather du (D wide); gw += W_wr^T du on I_c; d_pre = gw (1 - w_t^2);
//   3. partial read scores and dalpha over I_c; barrier; alpha, da; gather d_pre; on I_c:
//      dM += alpha d_pre + s da w_{t-1}, g = s sum da M + W_h^T d_pre
//      (stages.tape_read_backward).
// Each exchange buffer is rewritten only after a barrier that follows every peer's read of
// it; a barrier opens and closes each segment's recompute (whose two score buffers
// alternate), and a last one keeps every CTA alive while peers may still read its memory.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "common/cluster.cuh"
#include "common/math.cuh"
#include "twogemm/launch.cuh"
#include "twogemm/stage.cuh"
#include "twogemm/tape_cluster.cuh"
#include "twogemm/twogemm.h"

namespace elman {
namespace {

using namespace tape_cluster;

int segment_steps(int interval) { return interval; }

int backward_smem(int dim, int slots, int cluster, int interval) {
  const int s = (dim + cluster - 1) / cluster;
  return 4 * kBC * (6 * slots + 4 * s + dim + slots * s) +
         2 * (segment_steps(interval) * kBC * slots * s + 2 * dim * s);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) tape_backward_kernel(TapePersistentBackward a) {
  cg::cluster_group cluster = cg::this_cluster();
  const int D = a.dim, B = a.batch, N = a.slots, K = a.interval;
  const int C = int(cluster.num_blocks()), rank_c = int(cluster.block_rank());
  const int S = (D + C - 1) / C, row0 = rank_c * S, rows = max(0, min(S, D - row0));
  const int col0 = int(blockIdx.x) / C * kBC, nb = max(0, min(kBC, B - col0));
  const float scale = 1.f / sqrtf(float(D));
  const int NS = N * S;
  extern __shared__ __align__(16) unsigned char smem[];
  float* xs1 = reinterpret_cast<float*>(smem);  // [kBC][2N] partial scores | grads (exchanged)
  float* xs2 = xs1 + kBC * 2 * N;               // [kBC][2N] (exchanged)
  float* xdu = xs2 + kBC * 2 * N;               // [kBC][S] du on I_c (exchanged)
  float* xdp = xdu + kBC * S;                   // [kBC][S] d_pre on I_c (exchanged)
  float* pw = xdp + kBC * S;                    // [kBC][2N] probabilities | their gradients
  float* full = pw + kBC * 2 * N;               // [kBC][D] a gathered du or d_pre
  float* g = full + kBC * D;                    // [kBC][S] dL/dw from later steps on I_c
  float* gw = g + kBC * S;                      // [kBC][S] dL/dw_t on I_c
  float* dm = gw + kBC * S;                     // [kBC][N][S] dL/dM on I_c
  T* seg = reinterpret_cast<T*>(dm + kBC * NS);  // [K][kBC][N][S] the segment's tapes
  T* whc = seg + size_t(K) * kBC * NS;          // [D][S]: W_h[:, I_c]
  T* wwrc = whc + D * S;                        // [D][S]: W_wr[:, I_c]
  const T* w_h = static_cast<const T*>(a.w_h);
  const T* w_wr = static_cast<const T*>(a.w_wr);
  for (int o = threadIdx.x; o < D * S; o += kThreads) {
    const int k = o / S, i = o % S;
    const bool in = i < rows;
    whc[o] = in ? w_h[size_t(k) * D + row0 + i] : from_float<T>(0.f);
    wwrc[o] = in ? w_wr[size_t(k) * D + row0 + i] : from_float<T>(0.f);
  }
  const T* d_hT = static_cast<const T*>(a.d_hT);
  for (int o = threadIdx.x; o < kBC * S; o += kThreads) {
    const int j = o / S, i = o % S;
    g[o] = j < nb && i < rows ? to_float(d_hT[size_t(col0 + j) * D + row0 + i]) : 0.f;
  }
  for (int o = threadIdx.x; o < kBC * NS; o += kThreads) {
    const int j = o / NS, n = o / S % N, i = o % S;
    dm[o] = j < nb && i < rows ? a.d_tapeT[(size_t(col0 + j) * N + n) * D + row0 + i] : 0.f;
  }
  const T* w_all = static_cast<const T*>(a.w_all);
  const T* u_all = static_cast<const T*>(a.u_all);
  const T* ckpt = static_cast<const T*>(a.ckpt);
  const T* zv = static_cast<const T*>(a.z);
  const T* d_out = static_cast<const T*>(a.d_out);
  T* d_pre = static_cast<T*>(a.d_pre);
  T* d_u = static_cast<T*>(a.d_u);
  T* d_z = static_cast<T*>(a.d_z);
  const size_t BD = size_t(B) * D;
  auto at = [&](int t, int j, int i) { return size_t(t) * BD + size_t(col0 + j) * D + row0 + i; };
  for (int start = (a.steps - 1) / K * K; start >= 0; start -= K) {
    const int len = min(K, a.steps - start);
    cluster.sync();  // every peer has read the exchange buffers of the previous step
    const T* ck = ckpt + size_t(start / K) * B * N * D;
    for (int o = threadIdx.x; o < kBC * NS; o += kThreads) {
      const int j = o / NS, n = o / S % N, i = o % S;
      seg[o] = j < nb && i < rows ? ck[(size_t(col0 + j) * N + n) * D + row0 + i] : from_float<T>(0.f);
    }
    __syncthreads();
    for (int jj = 1; jj < len; ++jj) {  // M_{start+jj} = write(M_{start+jj-1}, w, u)
      float* buf = (jj & 1) ? xs2 : xs1;
      const T* prev = seg + size_t(jj - 1) * kBC * NS;
      T* next = seg + size_t(jj) * kBC * NS;
      for (int o = threadIdx.x; o < kBC * N; o += kThreads) {
        const int j = o / N, n = o % N;
        float acc = 0.f;
        if (j < nb)
          for (int i = 0; i < rows; ++i)
            acc += to_float(prev[o * S + i]) * to_float(w_all[at(start + jj, j, i)]);
        buf[j * 2 * N + n] = acc;
        buf[j * 2 * N + N + n] = 0.f;
      }
      cluster.sync();
      softmax_and_grad(cluster, C, nb, N, scale, buf, pw);
      __syncthreads();
      for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
        const int j = o / rows, i = o % rows;
        const float u = to_float(u_all[at(start + jj - 1, j, i)]);
        for (int n = 0; n < N; ++n) {
          const float beta = pw[j * 2 * N + n];
          const size_t e = size_t(j * N + n) * S + i;
          next[e] = from_float<T>((1.f - beta) * to_float(prev[e]) + beta * u);
        }
      }
      __syncthreads();
    }
    cluster.sync();  // every peer has read the recompute's score buffers
    for (int t = start + len - 1; t >= start; --t) {
      const T* m = seg + size_t(t - start) * kBC * NS;
      // 1. the write's scores and dbeta
      for (int o = threadIdx.x; o < kBC * N; o += kThreads) {
        const int j = o / N, n = o % N;
        float e = 0.f, db = 0.f;
        if (j < nb)
          for (int i = 0; i < rows; ++i) {
            const float mv = to_float(m[o * S + i]);
            e += mv * to_float(w_all[at(t + 1, j, i)]);
            db += dm[o * S + i] * (to_float(u_all[at(t, j, i)]) - mv);
          }
        xs1[j * 2 * N + n] = e;
        xs1[j * 2 * N + N + n] = db;
      }
      cluster.sync();
      softmax_and_grad(cluster, C, nb, N, scale, xs1, pw);  // beta | de
      __syncthreads();
      for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
        const int j = o / rows, i = o % rows;
        const float w = to_float(w_all[at(t + 1, j, i)]);
        float du = 0.f, acc = 0.f;
        for (int n = 0; n < N; ++n) {
          const size_t e = size_t(j * N + n) * S + i;
          const float beta = pw[j * 2 * N + n], de = pw[j * 2 * N + N + n];
          du += beta * dm[e];
          acc += de * to_float(m[e]);
          dm[e] = (1.f - beta) * dm[e] + scale * de * w;
        }
        const float zz = to_float(zv[at(t, j, i)]), dout = to_float(d_out[at(t, j, i)]);
        gw[j * S + i] = g[j * S + i] + dout * silu_f(zz) + scale * acc;
        d_z[at(t, j, i)] = from_float<T>(dout * w * silu_grad_f(zz));
        const T duq = from_float<T>(du);
        d_u[at(t, j, i)] = duq;
        xdu[j * S + i] = to_float(duq);
      }
      // 2. gw += W_wr^T du, d_pre
      cluster.sync();
      for (int o = threadIdx.x; o < nb * D; o += kThreads) {
        const int j = o / D, k = o % D;
        full[o] = cluster.map_shared_rank(xdu, k / S)[j * S + k % S];
      }
      __syncthreads();
      for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
        const int j = o / rows, i = o % rows;
        float acc = gw[j * S + i];
        for (int k = 0; k < D; ++k) acc += to_float(wwrc[k * S + i]) * full[j * D + k];
        const float w = to_float(w_all[at(t + 1, j, i)]);
        const T dp = from_float<T>(acc * (1.f - w * w));
        d_pre[at(t, j, i)] = dp;
        xdp[j * S + i] = to_float(dp);
      }
      __syncthreads();
      // 3. the read's scores and dalpha, then dM and g
      for (int o = threadIdx.x; o < kBC * N; o += kThreads) {
        const int j = o / N, n = o % N;
        float sc = 0.f, dal = 0.f;
        if (j < nb)
          for (int i = 0; i < rows; ++i) {
            const float mv = to_float(m[o * S + i]);
            sc += mv * to_float(w_all[at(t, j, i)]);
            dal += mv * xdp[j * S + i];
          }
        xs2[j * 2 * N + n] = sc;
        xs2[j * 2 * N + N + n] = dal;
      }
      cluster.sync();
      softmax_and_grad(cluster, C, nb, N, scale, xs2, pw);  // alpha | da
      for (int o = threadIdx.x; o < nb * D; o += kThreads) {
        const int j = o / D, k = o % D;
        full[o] = cluster.map_shared_rank(xdp, k / S)[j * S + k % S];
      }
      __syncthreads();
      for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
        const int j = o / rows, i = o % rows;
        const float wp = to_float(w_all[at(t, j, i)]), dp = xdp[j * S + i];
        float acc = 0.f;
        for (int n = 0; n < N; ++n) {
          const size_t e = size_t(j * N + n) * S + i;
          const float alpha = pw[j * 2 * N + n], da = pw[j * 2 * N + N + n];
          acc += da * to_float(m[e]);
          dm[e] += alpha * dp + scale * da * wp;
        }
        float back = scale * acc;
        for (int k = 0; k < D; ++k) back += to_float(whc[k * S + i]) * full[j * D + k];
        g[j * S + i] = back;
      }
      __syncthreads();
    }
  }
  T* dh0 = static_cast<T*>(a.dh0);
  for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
    const int j = o / rows, i = o % rows;
    dh0[size_t(col0 + j) * D + row0 + i] = from_float<T>(g[j * S + i]);
  }
  for (int o = threadIdx.x; o < nb * N * rows; o += kThreads) {
    const int j = o / (N * rows), n = o / rows % N, i = o % rows;
    a.d_tape0[(size_t(col0 + j) * N + n) * D + row0 + i] = dm[size_t(j * N + n) * S + i];
  }
  cluster.sync();  // no CTA leaves while a peer may still read its shared memory
}

}  // namespace

LowRankPlan tape_persistent_backward_plan(int batch, int dim, int slots, int interval, bool bf16) {
  LowRankPlan plan;
  if (!bf16) {
    plan.reason = "the persistent kernels are bf16 only";
    return plan;
  }
  if (batch < 1 || dim < 1 || slots < 1 || slots > kMaxSlots || interval < 1) {
    plan.reason = "B, D, K must be at least 1 and 1 <= N <= 256";
    return plan;
  }
  return plan_clusters<void(TapePersistentBackward)>(
      {tape_backward_kernel<__nv_bfloat16>}, {16, 8}, batch, dim, kBC,
      [&](int cluster) { return backward_smem(dim, slots, cluster, interval); },
      "W_h, W_wr and a segment of tapes do not fit one cluster's shared memory");
}

template <typename T>
cudaError_t tape_persistent_backward(const LowRankPlan& plan, const TapePersistentBackward& a) {
  return launch_clusters(tape_backward_kernel<T>, plan, a);
}

template cudaError_t tape_persistent_backward<__nv_bfloat16>(const LowRankPlan&,
                                                             const TapePersistentBackward&);

}  // namespace elman
