// E23's persistent forward: one launch runs the whole sequence.
//
// A cluster of C CTAs owns kTapeColumns batch columns; CTA c owns the state rows I_c = [c S,
// c S + S), S = ceil(D / C). In shared memory for the whole sequence: its rows of W_h and of
// W_wr (transposed, so that threads of consecutive rows read consecutive addresses), its
// columns M[:, I_c] of each tape, and the whole working memory w (D values per column). A
// step, with s = 1 / sqrt(D):
//   A. cluster barrier: the peers' partial read scores sum_{i in I_c} M[n, i] w_{t-1}[i] are
//      in place; each CTA sums them in rank order and takes the softmax (alpha_t);
//   B. for its rows: W_h w_{t-1} + W_x x_t + M^T alpha_t + b, tanh: w_t[I_c], the output;
//      then its partial write scores sum_{i in I_c} M[n, i] w_t[i] (the old tape);
//   C. cluster barrier: every CTA gathers w_t from the peers' slices and sums the write
//      scores (beta_t);
//   D. for its rows: u = W_wr w_t, M[n, i] <- (1 - beta_n) M[n, i] + beta_n u_i; then the
//      partial read scores of the next step from the new tape and w_t.
// Exchanged: N scores twice and the D-wide w once per step. Each exchange buffer is written
// only after the barrier that follows every peer's read of it (the read-score buffer is read
// in A and rewritten in D, after barrier C; the w and write-score buffer is read in C and
// rewritten in B of the next step, after barrier A), and a last barrier keeps every CTA
// alive while peers may still read its shared memory. State and tape are rounded to the
// storage dtype every step, as the per-step path stores them; the tape is written to the
// checkpoints every K steps, from which the backward recomputes the tapes it needs.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cmath>

#include "common/cluster.cuh"
#include "common/math.cuh"
#include "twogemm/launch.cuh"
#include "twogemm/stage.cuh"
#include "twogemm/tape_cluster.cuh"
#include "twogemm/twogemm.h"

namespace elman {
namespace {

using namespace tape_cluster;

int tape_smem(int dim, int slots, int cluster) {
  const int s = (dim + cluster - 1) / cluster;
  return 4 * kBC * (4 * slots + 2 * s + dim + slots * s) + 2 * dim * s * 2;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tape_persistent_kernel(TapePersistent a) {
  cg::cluster_group cluster = cg::this_cluster();
  const int D = a.dim, B = a.batch, N = a.slots;
  const int C = int(cluster.num_blocks()), rank_c = int(cluster.block_rank());
  const int S = (D + C - 1) / C, row0 = rank_c * S, rows = max(0, min(S, D - row0));
  const int col0 = int(blockIdx.x) / C * kBC, nb = max(0, min(kBC, B - col0));
  const float scale = 1.f / sqrtf(float(D));
  extern __shared__ __align__(16) unsigned char smem[];
  float* xa = reinterpret_cast<float*>(smem);  // [kBC][N] partial read scores (exchanged)
  float* xw = xa + kBC * N;                    // [kBC][S] w_t on I_c (exchanged)
  float* xb = xw + kBC * S;                    // [kBC][N] partial write scores (exchanged)
  float* alpha = xb + kBC * N;                 // [kBC][N]
  float* beta = alpha + kBC * N;               // [kBC][N]
  float* wfull = beta + kBC * N;               // [kBC][D] the whole working memory
  float* myw = wfull + kBC * D;                // [kBC][S] w_t on I_c (local)
  float* tape = myw + kBC * S;                 // [kBC][N][S] M[:, I_c]
  T* whT = reinterpret_cast<T*>(tape + kBC * N * S);  // [D][S]: W_h[I_c, :] transposed
  T* wwrT = whT + D * S;                              // [D][S]: W_wr[I_c, :] transposed
  const T* w_h = static_cast<const T*>(a.w_h);
  const T* w_wr = static_cast<const T*>(a.w_wr);
  for (int o = threadIdx.x; o < D * S; o += kThreads) {
    const int k = o / S, i = o % S;
    const bool in = i < rows;
    whT[o] = in ? w_h[size_t(row0 + i) * D + k] : from_float<T>(0.f);
    wwrT[o] = in ? w_wr[size_t(row0 + i) * D + k] : from_float<T>(0.f);
  }
  const T* h0 = static_cast<const T*>(a.h0);
  const T* tape0 = static_cast<const T*>(a.tape0);
  T* w_all = static_cast<T*>(a.w_all);
  T* ckpt = static_cast<T*>(a.ckpt);
  const size_t tape_size = size_t(B) * N * D;  // one checkpoint
  for (int o = threadIdx.x; o < kBC * D; o += kThreads) {
    const int j = o / D, k = o % D;
    wfull[o] = j < nb ? to_float(h0[size_t(col0 + j) * D + k]) : 0.f;
    if (j < nb && k >= row0 && k < row0 + rows) w_all[size_t(col0 + j) * D + k] = h0[size_t(col0 + j) * D + k];
  }
  for (int o = threadIdx.x; o < kBC * N * S; o += kThreads) {
    const int j = o / (N * S), n = o / S % N, i = o % S;
    float m = 0.f;
    if (j < nb && i < rows) {
      const size_t idx = (size_t(col0 + j) * N + n) * D + row0 + i;
      m = to_float(tape0[idx]);
      ckpt[idx] = tape0[idx];
    }
    tape[o] = m;
  }
  __syncthreads();
  partial_scores(xa, tape, wfull + row0, D, nb, N, S, rows);  // read scores of step 0
  const T* wx = static_cast<const T*>(a.wx);
  const T* zv = static_cast<const T*>(a.z);
  const T* bv = static_cast<const T*>(a.b);
  T* out = static_cast<T*>(a.out);
  for (int t = 0; t < a.steps; ++t) {
    cluster.sync();  // A
    softmax_of_partials(cluster, C, nb, N, scale, xa, alpha);
    __syncthreads();
    for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
      const int j = o / rows, i = o % rows;
      float hw = 0.f;
      for (int k = 0; k < D; ++k) hw += to_float(whT[k * S + i]) * wfull[j * D + k];
      float r = 0.f;
      for (int n = 0; n < N; ++n) r += alpha[j * N + n] * tape[(j * N + n) * S + i];
      const size_t idx = (size_t(t) * B + col0 + j) * D + row0 + i;
      const float w = tanhf(hw + to_float(wx[idx]) + r + to_float(bv[row0 + i]));
      const T wq = from_float<T>(w);
      w_all[idx + size_t(B) * D] = wq;
      out[idx] = from_float<T>(w * silu_f(to_float(zv[idx])));
      myw[j * S + i] = to_float(wq);
      xw[j * S + i] = to_float(wq);
    }
    __syncthreads();
    partial_scores(xb, tape, myw, S, nb, N, S, rows);
    cluster.sync();  // C
    for (int o = threadIdx.x; o < nb * D; o += kThreads) {
      const int j = o / D, k = o % D;
      wfull[o] = cluster.map_shared_rank(xw, k / S)[j * S + k % S];
    }
    softmax_of_partials(cluster, C, nb, N, scale, xb, beta);
    __syncthreads();
    const bool keep = (t + 1) % a.interval == 0 && t + 1 < a.steps;
    T* ck = ckpt + size_t((t + 1) / a.interval) * tape_size;
    for (int o = threadIdx.x; o < nb * rows; o += kThreads) {
      const int j = o / rows, i = o % rows;
      float u = 0.f;
      for (int k = 0; k < D; ++k) u += to_float(wwrT[k * S + i]) * wfull[j * D + k];
      for (int n = 0; n < N; ++n) {
        float& m = tape[(j * N + n) * S + i];
        const T mq = from_float<T>((1.f - beta[j * N + n]) * m + beta[j * N + n] * u);
        m = to_float(mq);
        if (keep) ck[(size_t(col0 + j) * N + n) * D + row0 + i] = mq;
      }
    }
    __syncthreads();
    partial_scores(xa, tape, myw, S, nb, N, S, rows);  // read scores of the next step
    __syncthreads();
  }
  T* tape_T = static_cast<T*>(a.tape_T);
  for (int o = threadIdx.x; o < nb * N * rows; o += kThreads) {
    const int j = o / (N * rows), n = o / rows % N, i = o % rows;
    tape_T[(size_t(col0 + j) * N + n) * D + row0 + i] = from_float<T>(tape[(j * N + n) * S + i]);
  }
  cluster.sync();  // no CTA leaves while a peer may still read its shared memory
}

}  // namespace

LowRankPlan tape_persistent_plan(int batch, int dim, int slots, bool bf16) {
  LowRankPlan plan;
  if (batch < 1 || dim < 1 || slots < 1 || slots > kMaxSlots) {
    plan.reason = "B, D must be at least 1 and 1 <= N <= 256";
    return plan;
  }
  if (!bf16) {  // fp32 runs the per-step paths (as the dense family's persistent kernels do)
    plan.reason = "the persistent kernels are bf16 only";
    return plan;
  }
  return plan_clusters<void(TapePersistent)>(
      {tape_persistent_kernel<__nv_bfloat16>}, {16, 8}, batch, dim, kBC,
      [&](int cluster) { return tape_smem(dim, slots, cluster); },
      "W_h, W_wr and the tape slices do not fit one cluster's shared memory at this D and N");
}

template <typename T>
cudaError_t tape_persistent_forward(const LowRankPlan& plan, const TapePersistent& a) {
  return launch_clusters(tape_persistent_kernel<T>, plan, a);
}

template cudaError_t tape_persistent_forward<__nv_bfloat16>(const LowRankPlan&, const TapePersistent&);

}  // namespace elman
