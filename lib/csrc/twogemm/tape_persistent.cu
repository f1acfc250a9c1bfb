// E23's persistent forward on tensor cores: one launch runs the whole sequence.
//
// The cluster layout is tape_cta.cuh's (C = 4, 8 or 16 CTAs of 32 rows, the fewest that cover
// D <= 512; one thread per state element; slot vectors one slot per lane). Each thread keeps
// its element's tape column M[:, i] (N fp32 in shared memory, laid out [n][thread] so that
// every access is its own bank); W_h[I_c, :] and W_wr[I_c, :] stay in registers for the whole
// sequence as mma A fragments.
//
// The recurrence needs two cross-CTA exchanges a step. With s = 1 / sqrt(D) and w = w_t:
//   read   alpha = softmax(s R), R = M_{t-1} w_{t-1} carried from the previous step (lane n);
//          r_i = sum_n alpha_n M[n, i]; w_i = tanh(hw_i + (W_x x_t)_i + r_i + b_i), hw = W_h
//          w_{t-1} from the previous step's products; the output w_i silu(z_i);
//   X1     each warp sends its 32 values of w (bf16) and the N partial write scores
//          sum_{i in I_c} M_{t-1}[n, i] w_i: every CTA then holds the whole w_t as the mma B
//          operand;
//   mma    W_h[I_c, :] w_t (the next step's hw) and u = W_wr[I_c, :] w_t in one pass over
//          the gathered w: each warp its k-range, partials summed over the warps in shared
//          memory; both rounded to bf16 as the per-step path stores them;
//   X2     the next read scores need M_t w_t = (1 - beta) W + beta (u . w): only the scalar
//          u . w per batch column crosses the cluster (a 4-byte st.async per peer), sent as
//          soon as the products are summed;
//   write  while X2 travels: the write scores W (rank-order sums of the X1 partials, identical
//          in every CTA), beta = softmax(s W), M[n, i] <- (1 - beta_n) M[n, i] + beta_n u_i
//          (rounded to bf16: the checkpoints and the per-step path hold the same values).
// No cluster barrier runs per step. Buffers and mbarriers are double (step t uses t % 2): a
// CTA sends step t + 2's X1 into buffer t % 2 only after its X2 wait of step t + 1, which
// needs every peer's step t + 1 X2, sent after that peer's warps read step t's X1 buffer
// (products, then a block barrier, then X2; the write-score partials are read after X2 is
// sent, before anything of step t + 1 is); a CTA sends step t + 2's X2 only after its X1
// wait of step t + 2, which needs every warp of every peer past its step t + 1 X2 read. Each
// mbarrier is armed by thread 0 at the start of its step; bytes that arrive earlier count
// against the not yet armed phase, which completes only once armed. The shared partial
// buffer of the products is rewritten only after the next X1 wait (which needs this CTA's
// own warps' packets, sent after their reads). A last cluster barrier keeps every CTA alive
// until all exchanges into it are done. The step-0 read scores M_0 w_0 are summed by each
// warp over the whole D from global memory before the loop; W_x x_t and z_t are loaded one
// step ahead. The tape is written to the checkpoints before steps 0, K, 2K, ...; where the
// backward runs persistent, u_t, alpha_t and beta_t are stored for it (u_all, alpha_all,
// beta_all), so that it recomputes the tapes from the checkpoints without any exchange.
// Work that the next exchange does not need runs while an exchange travels: the outputs and the
// checkpoint after X1 is sent; the write weights, the write and the saves after X2 is sent.
// schedule.py restates this schedule on the CPU (tape_forward).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "twogemm/stage.cuh"
#include "twogemm/tape_cta.cuh"

namespace elman {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;
using namespace tape_cta;

// Byte offsets: mbarriers [4] | X1 buffers [2] | u . w partials [2][C][8] | packets [8] |
// product partials (2 matrices) | tape [N][256] fp32.
struct Smem {
  int x1, uw, send, red, tape, bytes;
  __host__ __device__ Smem(int C, int N) {
    x1 = 64;
    uw = x1 + 2 * exchange_bytes(C, N);
    send = uw + 2 * C * kCols * 4;
    red = send + kCols * packet_bytes(N);
    tape = red + product_bytes(2);
    bytes = tape + N * kThreads * 4;
  }
};

template <int C>
__global__ void __launch_bounds__(kThreads, 1) tape_forward_kernel(TapePersistent a) {
  constexpr int KS = C / 4;                 // k-steps of 16 per warp
  constexpr int kW = gathered_width(C);
  static_assert(KS >= 1 && KS * 16 * kWarps == C * kRows, "the warps split D_p in k-steps");
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.dim, B = a.batch, N = a.slots, T = a.steps, K = a.interval;
  const int np = padded_slots(N);
  const Smem o(C, N);
  const int rank = int(cluster.block_rank()), row0 = rank * kRows;
  const int col0 = int(blockIdx.x) / C * kCols;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int bcol = warp, d = row0 + lane;  // this thread's element (row d, batch column bcol)
  const bool col_live = col0 + bcol < B;
  const bool live = col_live && d < D;
  const size_t BD = size_t(B) * D;
  const size_t idx = size_t(col0 + bcol) * D + d;  // used only where live
  const bf16* wx = static_cast<const bf16*>(a.wx);
  const bf16* zv = static_cast<const bf16*>(a.z);
  const bf16* w_h = static_cast<const bf16*>(a.w_h);
  const bf16* w_wr = static_cast<const bf16*>(a.w_wr);
  const bf16* h0 = static_cast<const bf16*>(a.h0);
  const bf16* tape0 = static_cast<const bf16*>(a.tape0);
  bf16* out = static_cast<bf16*>(a.out);
  bf16* w_all = static_cast<bf16*>(a.w_all);
  bf16* tape_T = static_cast<bf16*>(a.tape_T);
  bf16* ckpt = static_cast<bf16*>(a.ckpt);
  bf16* u_all = static_cast<bf16*>(a.u_all);
  const bool saves = u_all != nullptr;
  const bf16 zero = __float2bfloat16_rn(0.f);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);  // [buf]: X1, [2 + buf]: X2
  float* uw0 = reinterpret_cast<float*>(smem + o.uw);
  unsigned char* packet = smem + o.send + warp * packet_bytes(N);
  float* red = reinterpret_cast<float*>(smem + o.red);
  float* tape = reinterpret_cast<float*>(smem + o.tape) + tid;  // tape[n * kThreads]
  auto uws = [&](int buf) { return uw0 + buf * C * kCols; };   // [src][column]

  if (tid == 0) {
    for (int i = 0; i < 4; ++i) mbar_init(&bar[i]);
    mbar_init_fence();
  }
  for (int n = 0; n < N; ++n)
    tape[n * kThreads] = live ? __bfloat162float(tape0[(size_t(col0 + bcol) * N + n) * D + d]) : 0.f;
  // X1 buffer `buf` (double: step t uses t % 2).
  auto x1 = [&](int buf) { return Exchange{smem + o.x1 + buf * exchange_bytes(C, N), C, np}; };
  // h0 into buffer 1 (the first exchange writes buffer 0).
  bf16* h0s = x1(1).gathered();
  for (int i = tid; i < kCols * C * kRows; i += kThreads) {
    const int n = i / (C * kRows), k = i % (C * kRows);
    h0s[n * kW + k] = col0 + n < B && k < D ? h0[size_t(col0 + n) * D + k] : zero;
  }
  if (live) w_all[idx] = h0[idx];

  uint32_t f[2][2][KS][4];  // W_h, W_wr: rows I_c, this warp's k-range
  const int k0 = warp * KS * 16;
  load_slice(f[0], row0, k0, D, [&](int i, int k) { return w_h[size_t(i) * D + k]; });
  load_slice(f[1], row0, k0, D, [&](int i, int k) { return w_wr[size_t(i) * D + k]; });

  // Step-0 read scores R_n = sum_i M_0[n, i] w_0[i] over the whole D (lane n keeps R_n).
  __syncthreads();  // h0 gathered
  float rs = 0.f;
  for (int n = 0; n < N; ++n) {
    float p = 0.f;
    for (int k = lane; col_live && k < D; k += 32)
      p += __bfloat162float(tape0[(size_t(col0 + bcol) * N + n) * D + k]) *
           __bfloat162float(h0s[bcol * kW + k]);
    p = warp_sum(p);
    if (lane == n) rs = p;
  }
  float prod[2];
  products(f, h0s, kW, k0, red, prod);
  float hw = round_bf16(prod[0]);
  const float scale = 1.f / sqrtf(float(D));
  const float bias = live ? __bfloat162float(static_cast<const bf16*>(a.b)[d]) : 0.f;
  float wx_next = live ? __bfloat162float(wx[idx]) : 0.f;
  float z_next = live ? __bfloat162float(zv[idx]) : 0.f;
  const uint32_t x2_bytes = uint32_t(C * kCols * 4);
  __syncthreads();
  cluster.sync();  // mbarriers initialised in every CTA

  for (int t = 0; t < T; ++t) {
    const int buf = t & 1;
    const uint32_t phase = uint32_t(t >> 1) & 1u;
    if (tid == 0) {
      mbar_expect(&bar[buf], x1(buf).bytes());
      mbar_expect(&bar[2 + buf], x2_bytes);
    }
    const float wx_t = wx_next, z_t = z_next;
    if (t + 1 < T && live) {
      wx_next = __bfloat162float(wx[size_t(t + 1) * BD + idx]);
      z_next = __bfloat162float(zv[size_t(t + 1) * BD + idx]);
    }
    // read and update
    const float alpha = softmax_lanes(__fmul_rn(scale, rs), N);  // rounded: no FMA into the max
    float r = 0.f;
    for (int n = 0; n < N; ++n) r += __shfl_sync(0xffffffffu, alpha, n) * tape[n * kThreads];
    const float w = tanhf(hw + wx_t + r + bias);
    const bf16 wb = live ? __float2bfloat16_rn(w) : zero;
    const float wf = __bfloat162float(wb);
    // X1: w and the partial write scores (old tape, new w)
    const float ws = slot_sums(N, [&](int n) { return tape[n * kThreads] * wf; });
    x1(buf).send(packet, rank, wb, ws, &bar[buf]);
    // while X1 travels: the outputs, and the checkpoint of the tape M_{t-1}
    if (live) {
      w_all[size_t(t + 1) * BD + idx] = wb;
      out[size_t(t) * BD + idx] = __float2bfloat16_rn(w * silu_f(z_t));
    }
    if (t % K == 0 && live)
      for (int n = 0; n < N; ++n)
        ckpt[((size_t(t / K) * B + col0 + bcol) * N + n) * D + d] = __float2bfloat16_rn(tape[n * kThreads]);
    mbar_wait(&bar[buf], phase);

    // the products of w_t and X2 (they need no write weights)
    products(f, x1(buf).gathered(), kW, k0, red, prod);
    hw = round_bf16(prod[0]);
    const float u = round_bf16(prod[1]);
    const float uw_part = warp_sum(u * wf);
    if (lane < C)
      st_async4(map_to_rank(smem_u32(uws(buf) + rank * kCols + bcol), uint32_t(lane)),
                __float_as_uint(uw_part), map_to_rank(smem_u32(&bar[2 + buf]), uint32_t(lane)));
    // while X2 travels: the write weights and the write
    const float wsum = x1(buf).slot_total<C>(N);
    const float beta = softmax_lanes(__fmul_rn(scale, wsum), N);
    for (int n = 0; n < N; ++n) {
      const float bn = __shfl_sync(0xffffffffu, beta, n);
      tape[n * kThreads] = tape_update(tape[n * kThreads], bn, u);
    }
    if (saves) {
      if (live) u_all[size_t(t) * BD + idx] = __float2bfloat16_rn(u);
      if (rank == 0 && col_live && lane < N) {
        const size_t si = (size_t(t) * B + col0 + bcol) * N + lane;
        a.alpha_all[si] = alpha;
        a.beta_all[si] = beta;
      }
    }
    mbar_wait(&bar[2 + buf], phase);
    float uw = 0.f;
    for (int src = 0; src < C; ++src) uw += uws(buf)[src * kCols + bcol];
    rs = (1.f - beta) * wsum + beta * uw;
  }
  if (live)
    for (int n = 0; n < N; ++n)
      tape_T[(size_t(col0 + bcol) * N + n) * D + d] = __float2bfloat16_rn(tape[n * kThreads]);
  cluster.sync();  // no CTA leaves while an exchange into it may be in flight
}

using Kernel = void (*)(TapePersistent);

Kernel pick(int cluster) {
  switch (cluster) {
    case 4: return tape_forward_kernel<4>;
    case 8: return tape_forward_kernel<8>;
    case 16: return tape_forward_kernel<16>;
    default: return nullptr;
  }
}

}  // namespace

// The cluster: cluster_for(D) CTAs of 32 rows; one cluster per 8 batch columns.
LowRankPlan tape_persistent_plan(int batch, int dim, int slots, bool bf16) {
  LowRankPlan plan;
  if (batch < 1 || dim < 1 || slots < 1) {
    plan.reason = "B, D and N must be at least 1";
    return plan;
  }
  if (!bf16) {
    plan.reason = "the persistent kernels are bf16 only";
    return plan;
  }
  if (slots > kTapeMaxSlotsOnChip) {
    plan.reason =
        "N above 32: the slot scores are held one per lane of a warp, and at N = 128 the "
        "exchanged score partials (2 x C x 8 x N fp32) and the tape's columns (N x 256 fp32) "
        "exceed a CTA's shared memory";
    return plan;
  }
  if (dim > kTapeMaxDim) {
    plan.reason = "D above 512: W_h and W_wr (2 D^2 bf16) are held in the registers of at most "
                  "16 CTAs of 32 rows";
    return plan;
  }
  const int cluster = cluster_for(dim);
  const int smem = Smem(cluster, slots).bytes;
  if (!cluster_fits(pick(cluster), cluster, smem)) {
    plan.reason = "the GPU cannot hold one cluster of this shape";
    return plan;
  }
  plan.ok = true;
  plan.cluster = cluster;
  plan.clusters = (batch + kCols - 1) / kCols;
  plan.smem = smem;
  return plan;
}

template <typename T>
cudaError_t tape_persistent_forward(const LowRankPlan& plan, const TapePersistent& a) {
  return launch_clusters(pick(plan.cluster), plan, a);
}

template cudaError_t tape_persistent_forward<__nv_bfloat16>(const LowRankPlan&, const TapePersistent&);

}  // namespace elman
