// E23's persistent backward on tensor cores: one launch runs the whole backward.
//
// The cluster layout is tape_cta.cuh's (the forward's, tape_persistent.cu). W_wr^T and W_h^T
// (rows I_c) stay in registers as mma A fragments; each thread keeps dL/dM of its element's
// tape column (N fp32, shared memory) and g = dL/dw_t of its element (fp32 register) for the
// whole backward. Segments of K steps run last to first. At a segment's start each warp
// copies (cp.async) its column's slices of u, z, d_out, w and the segment's checkpoint, and
// lane n the slot weights alpha_n, beta_n the forward stored, into shared memory; then each
// thread recomputes its element's tapes M_{t-1} of the segment by the replacement write with
// the stored beta and u, in the forward's order (bitwise the forward's tapes): no exchange.
// A step t, with s = 1 / sqrt(D), M = M_{t-1}, dM = dL/dM_t:
//   write  du_i = sum_n beta_n dM[n, i]; partial dbeta_n = sum_{i in I_c} dM[n, i] (u_i - M[n, i]);
//   XA     du (bf16) and the dbeta partials to every CTA; dsw = s beta (dbeta - beta . dbeta);
//          gw = g + d_out silu(z) + sum_n dsw_n M[n, i] + (W_wr^T du)_i (tensor cores);
//          dM <- (1 - beta) dM + dsw w_t; d_pre = gw (1 - w_t^2) (rounded to bf16);
//          partial dalpha_n = sum_{i in I_c} d_pre_i M[n, i];
//   XB     d_pre and the dalpha partials to every CTA; dra = s alpha (dalpha - alpha . dalpha);
//          g = (W_h^T d_pre)_i + sum_n dra_n M[n, i]; dM += alpha d_pre + dra w_{t-1}.
// Stored per step: d_pre, d_u, d_z (the op forms dW_h, dW_x, dW_wr, db and dx from them).
// Exchange safety as in the forward: XA uses buffer and mbarrier 0, XB 1; a CTA sends XA of
// step t - 1 only after its XB wait of step t, which needs every peer's XB packet, sent after
// the peer's products read buffer 0 (block barrier in between); likewise XB of t - 1 after
// the XA wait of t - 1. schedule.py restates this schedule on the CPU (tape_backward).
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

// Byte offsets: mbarriers [2] | XA, XB buffers | packets [8] | product partials (1 matrix) |
// dM [N][256] fp32 | the segment: tapes [K][N][256] bf16, u, z, d_out [K][256] bf16, w
// [K + 1][256] bf16, alpha, beta [K][8][np] fp32.
struct Smem {
  int x, send, red, dm, tapes, u, z, dout, w, alpha, beta, bytes;
  __host__ __device__ Smem(int C, int N, int K) {
    const int np = padded_slots(N), plane = kThreads * 2;
    x = 64;
    send = x + 2 * exchange_bytes(C, N);
    red = send + kCols * packet_bytes(N);
    dm = red + product_bytes(1);
    tapes = dm + N * kThreads * 4;
    u = tapes + K * N * plane;
    z = u + K * plane;
    dout = z + K * plane;
    w = dout + K * plane;
    alpha = w + (K + 1) * plane;
    beta = alpha + K * kCols * np * 4;
    bytes = beta + K * kCols * np * 4;
  }
};

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src));
}

template <int C>
__global__ void __launch_bounds__(kThreads, 1) tape_backward_kernel(TapePersistentBackward a) {
  constexpr int KS = C / 4;
  constexpr int kW = gathered_width(C);
  static_assert(KS >= 1 && KS * 16 * kWarps == C * kRows, "the warps split D_p in k-steps");
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.dim, B = a.batch, N = a.slots, T = a.steps, K = a.interval;
  const int np = padded_slots(N);
  const Smem o(C, N, K);
  const int rank = int(cluster.block_rank()), row0 = rank * kRows;
  const int col0 = int(blockIdx.x) / C * kCols;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int bcol = warp, d = row0 + lane;
  const bool col_live = col0 + bcol < B;
  const bool live = col_live && d < D;
  const size_t BD = size_t(B) * D;
  const size_t idx = size_t(col0 + bcol) * D + d;  // used only where live
  const size_t col_off = size_t(col0 + bcol) * D + row0;  // this warp's 32 rows of a [B][D] plane
  const bf16* zv = static_cast<const bf16*>(a.z);
  const bf16* w_h = static_cast<const bf16*>(a.w_h);
  const bf16* w_wr = static_cast<const bf16*>(a.w_wr);
  const bf16* w_all = static_cast<const bf16*>(a.w_all);
  const bf16* u_all = static_cast<const bf16*>(a.u_all);
  const bf16* ckpt = static_cast<const bf16*>(a.ckpt);
  const bf16* d_out = static_cast<const bf16*>(a.d_out);
  bf16* d_pre = static_cast<bf16*>(a.d_pre);
  bf16* d_u = static_cast<bf16*>(a.d_u);
  bf16* d_z = static_cast<bf16*>(a.d_z);
  const bf16 zero = __float2bfloat16_rn(0.f);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);  // [0]: XA, [1]: XB
  const Exchange xa{smem + o.x, C, np}, xb{smem + o.x + exchange_bytes(C, N), C, np};
  unsigned char* packet = smem + o.send + warp * packet_bytes(N);
  float* red = reinterpret_cast<float*>(smem + o.red);
  float* dM = reinterpret_cast<float*>(smem + o.dm) + tid;       // dM[n * kThreads]
  bf16* tapes0 = reinterpret_cast<bf16*>(smem + o.tapes);         // [j][n][thread]
  bf16* su0 = reinterpret_cast<bf16*>(smem + o.u);                // [j][thread]
  bf16* sz0 = reinterpret_cast<bf16*>(smem + o.z);
  bf16* sd0 = reinterpret_cast<bf16*>(smem + o.dout);
  bf16* sw0 = reinterpret_cast<bf16*>(smem + o.w);                // [j][thread], j = 0..K
  float* sa0 = reinterpret_cast<float*>(smem + o.alpha);          // [j][column][np]
  float* sb0 = reinterpret_cast<float*>(smem + o.beta);
  auto staged = [&](const bf16* plane, int j) {
    return live ? __bfloat162float(plane[j * kThreads + tid]) : 0.f;
  };
  auto tape_at = [&](int j, int n) {
    return live ? __bfloat162float(tapes0[(j * N + n) * kThreads + tid]) : 0.f;
  };
  auto slot_w = [&](const float* plane, int j, int n) {
    return col_live && n < N ? plane[(j * kCols + bcol) * np + n] : 0.f;
  };

  if (tid == 0) {
    mbar_init(&bar[0]);
    mbar_init(&bar[1]);
    mbar_init_fence();
  }
  for (int n = 0; n < N; ++n)
    dM[n * kThreads] = live ? a.d_tapeT[(size_t(col0 + bcol) * N + n) * D + d] : 0.f;
  float g = live ? __bfloat162float(static_cast<const bf16*>(a.d_hT)[idx]) : 0.f;
  uint32_t fwr[1][2][KS][4], fh[1][2][KS][4];  // W_wr^T, W_h^T: rows I_c, this warp's k-range
  const int k0 = warp * KS * 16;
  load_slice(fwr[0], row0, k0, D, [&](int i, int k) { return w_wr[size_t(k) * D + i]; });
  load_slice(fh[0], row0, k0, D, [&](int i, int k) { return w_h[size_t(k) * D + i]; });
  const float scale = 1.f / sqrtf(float(D));
  __syncthreads();
  cluster.sync();

  // Copies of the segment [start, start + len) into shared memory (this warp's column), then
  // the tapes before each of its steps.
  auto load_segment = [&](int start, int len) {
    __syncwarp();
    const int vec = 4 * len, jobs = 3 * vec + 4 * (len + 1) + 4 * N;
    for (int i = lane; i < jobs; i += 32) {
      const int ch = i & 3;
      if (!col_live || row0 + 8 * ch >= D) continue;
      const bf16* src;
      bf16* dst;
      if (i < 3 * vec) {
        const int arr = i / vec, j = (i % vec) >> 2;
        src = (arr == 0 ? u_all : arr == 1 ? zv : d_out) + size_t(start + j) * BD + col_off;
        dst = (arr == 0 ? su0 : arr == 1 ? sz0 : sd0) + j * kThreads;
      } else if (i < 3 * vec + 4 * (len + 1)) {
        const int j = (i - 3 * vec) >> 2;
        src = w_all + size_t(start + j) * BD + col_off;
        dst = sw0 + j * kThreads;
      } else {
        const int n = (i - 3 * vec - 4 * (len + 1)) >> 2;
        src = ckpt + ((size_t(start / K) * B + col0 + bcol) * N + n) * D + row0;
        dst = tapes0 + n * kThreads;
      }
      cp_async16(dst + warp * kRows + 8 * ch, src + 8 * ch);
    }
    if (col_live && lane < N)
      for (int j = 0; j < len; ++j) {
        const size_t si = (size_t(start + j) * B + col0 + bcol) * N + lane;
        cp_async4(sa0 + (j * kCols + bcol) * np + lane, a.alpha_all + si);
        cp_async4(sb0 + (j * kCols + bcol) * np + lane, a.beta_all + si);
      }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncwarp();
    for (int n = 0; n < N; ++n) {
      float m = tape_at(0, n);
      for (int j = 1; j < len; ++j) {
        m = tape_update(m, slot_w(sb0, j - 1, n), staged(su0, j - 1));
        tapes0[(j * N + n) * kThreads + tid] = __float2bfloat16_rn(m);
      }
    }
  };

  int start = 0;
  for (int s = 0; s < T; ++s) {
    const int t = T - 1 - s;
    const uint32_t phase = uint32_t(s) & 1u;
    if (tid == 0) {
      mbar_expect(&bar[0], xa.bytes());
      mbar_expect(&bar[1], xb.bytes());
    }
    if (s == 0 || (t + 1) % K == 0) {
      start = t / K * K;
      load_segment(start, t + 1 - start);
    }
    const int j = t - start;
    const float u = staged(su0, j), w = staged(sw0, j + 1), wp = staged(sw0, j);
    const float z = staged(sz0, j), dout = staged(sd0, j);
    const float alpha = slot_w(sa0, j, lane), beta = slot_w(sb0, j, lane);

    // back through the write
    float du = 0.f;
    for (int n = 0; n < N; ++n) du += __shfl_sync(0xffffffffu, beta, n) * dM[n * kThreads];
    const float dbeta_part = slot_sums(N, [&](int n) { return dM[n * kThreads] * (u - tape_at(j, n)); });
    const bf16 dub = live ? __float2bfloat16_rn(du) : zero;
    xa.send(packet, rank, dub, dbeta_part, &bar[0]);
    if (live) {
      d_u[size_t(t) * BD + idx] = dub;
      d_z[size_t(t) * BD + idx] = __float2bfloat16_rn(dout * w * silu_grad_f(z));
    }
    mbar_wait(&bar[0], phase);
    const float dbeta = xa.slot_total<C>(N);
    const float dsw = scale * beta * (dbeta - warp_sum(beta * dbeta));
    float pr[1];
    products(fwr, xa.gathered(), kW, k0, red, pr);
    float gw = g + dout * silu_f(z) + pr[0];
    for (int n = 0; n < N; ++n) {
      const float bn = __shfl_sync(0xffffffffu, beta, n), dn = __shfl_sync(0xffffffffu, dsw, n);
      gw += dn * tape_at(j, n);
      dM[n * kThreads] = (1.f - bn) * dM[n * kThreads] + dn * w;
    }
    const bf16 dpb = live ? __float2bfloat16_rn(gw * (1.f - w * w)) : zero;
    const float dp = __bfloat162float(dpb);
    if (live) d_pre[size_t(t) * BD + idx] = dpb;

    // back through the read and update
    const float dalpha_part = slot_sums(N, [&](int n) { return dp * tape_at(j, n); });
    xb.send(packet, rank, dpb, dalpha_part, &bar[1]);
    mbar_wait(&bar[1], phase);
    const float dalpha = xb.slot_total<C>(N);
    const float dra = scale * alpha * (dalpha - warp_sum(alpha * dalpha));
    products(fh, xb.gathered(), kW, k0, red, pr);
    float gn = pr[0];
    for (int n = 0; n < N; ++n) {
      const float an = __shfl_sync(0xffffffffu, alpha, n), rn = __shfl_sync(0xffffffffu, dra, n);
      gn += rn * tape_at(j, n);
      dM[n * kThreads] += an * dp + rn * wp;
    }
    g = live ? gn : 0.f;
  }
  if (live) {
    static_cast<bf16*>(a.dh0)[idx] = __float2bfloat16_rn(g);
    for (int n = 0; n < N; ++n) a.d_tape0[(size_t(col0 + bcol) * N + n) * D + d] = dM[n * kThreads];
  }
  cluster.sync();  // no CTA leaves while an exchange into it may be in flight
}

using Kernel = void (*)(TapePersistentBackward);

Kernel pick(int cluster) {
  switch (cluster) {
    case 4: return tape_backward_kernel<4>;
    case 8: return tape_backward_kernel<8>;
    case 16: return tape_backward_kernel<16>;
    default: return nullptr;
  }
}

}  // namespace

int tape_persistent_interval(int steps, int dim, int slots) {
  if (steps < 1 || dim < 1 || dim > kTapeMaxDim || slots < 1 || slots > kTapeMaxSlotsOnChip) return 0;
  int k = 1;
  while (k * k < steps) ++k;  // ceil(sqrt(T)), as the per-step paths take it
  const int cluster = cluster_for(dim);
  while (k > 1 && Smem(cluster, slots, k).bytes > kSmemBudget) --k;
  return Smem(cluster, slots, k).bytes <= kSmemBudget ? k : 0;
}

// The forward's limits (tape_persistent_plan), D a multiple of 8 and a segment of K tapes on chip.
LowRankPlan tape_persistent_backward_plan(int batch, int dim, int slots, int interval, bool bf16) {
  LowRankPlan plan = tape_persistent_plan(batch, dim, slots, bf16);
  if (!plan.ok) return plan;
  plan.ok = false;
  if (interval < 1) {
    plan.reason = "K must be at least 1";
    return plan;
  }
  if (dim % 8 != 0) {
    plan.reason = "D must be a multiple of 8 (a segment's inputs are copied in 16-byte rows)";
    return plan;
  }
  plan.smem = Smem(plan.cluster, slots, interval).bytes;
  if (plan.smem > kSmemBudget) {
    plan.reason = "a segment of K tapes does not fit shared memory (the op takes "
                  "K = tape_persistent_interval)";
    return plan;
  }
  if (!cluster_fits(pick(plan.cluster), plan.cluster, plan.smem)) {
    plan.reason = "the GPU cannot hold one cluster of this shape";
    return plan;
  }
  plan.ok = true;
  return plan;
}

template <typename T>
cudaError_t tape_persistent_backward(const LowRankPlan& plan, const TapePersistentBackward& a) {
  return launch_clusters(pick(plan.cluster), plan, a);
}

template cudaError_t tape_persistent_backward<__nv_bfloat16>(const LowRankPlan&,
                                                             const TapePersistentBackward&);

}  // namespace elman
