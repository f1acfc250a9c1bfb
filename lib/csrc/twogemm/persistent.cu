// The low-rank persistent kernels (E4, E5, E66, E67lr): one launch runs the whole sequence.
//
// A cluster of C CTAs (1, 2, 4, 8 or 16; for r above 256 exactly ceil(D / S), 1 to 16) owns 8
// batch columns; CTA c owns the state rows I_c = [c S, c S + S) with S = 64 or 128 (rows
// beyond D are zeros). Both factor slices stay on chip for the whole sequence as mma.sync A
// fragments (forward: V[:, I_c] as an r x S tile and U[I_c, :] as S x r; backward their
// transposes), the rank padded to 16, 32, 64, 128, 256 or 320. Rank tiles 0-15 are held in
// registers; tiles 16-19 (r above 256) in shared memory in fragment order, each lane's
// fragments written and read by that lane alone (one 16-byte load an mma, no barrier). A
// forward step t is
//   A. warp w (of 8) multiplies its 16-row tiles w, w + 8 of V[:, I_c] by h_{t-1}[I_c] (bf16
//      in shared memory, mma m16n8k16, fp32 accumulate): this CTA's partial of p = V h_{t-1};
//   X. each lane rounds its accumulators to bf16 and st.async's them (8 bytes) into the same
//      slot of every CTA of the cluster, counted on the receiver's mbarrier: only the r-wide
//      partials cross the cluster, never a D-wide state, and no cluster barrier runs per step;
//   S. while the partials travel: the outputs of step t - 1 (out, aux, h_{t-1} to global
//      memory, from registers), the input copies of step t + kLead, and the part of the stage
//      that reads only step t's inputs (the gate: silu(c) or sigmoid(c), and a);
//   R. warp w waits for its tiles from every source, loads all C of them, then sums them in
//      rank order (so every CTA holds the same p, bitwise) and rounds p to bf16 (as the
//      per-step path stores it) into shared memory; CTA 0 stores it for dU;
//   B. after a block barrier, warp w < S / 16 multiplies its 16 rows of U[I_c, :] by p and
//      computes the new state only (one transcendental per element; the mode is a template
//      parameter, so the four elements of a lane interleave): each lane owns 4 (row, column)
//      elements for the whole sequence, h_{t-1} of them in registers; h_t goes to shared
//      memory (bf16); step t + 1's inputs are waited for before the closing block barrier,
//      which makes them and h_t visible to the next step's A.
// Only what the next step needs runs between the exchange and the closing barrier. The traced
// forward (kTrace) records clock64 at the phase boundaries of every step in CTA 0
// (kLowRankTracePhases).
// The backward runs the same machine on (U^T, V^T): the stage's gradient gives d_pre on
// I_c, A/X/R give dp = d_pre U (r wide), B gives g_{t-1}[I_c] = direct + (dp V)[I_c], kept in
// fp32 registers.
// Per-step inputs ([T][B][D] slices of this CTA's rows) are staged kLead steps ahead by
// cp.async in a ring of shared-memory buffers; the closing block barrier of the previous step
// makes each step's copies visible (forward and backward).
// Exchange safety: a receive buffer and its mbarrier are double (step t uses t % 2). A source
// writes step t + 2's partials into buffer t % 2 of a receiver only after it summed step
// t + 1, which needs the receiver's step t + 1 partial, which the receiver sends only after
// every one of its warps finished reading buffer t % 2 (block barriers in between). The
// mbarrier of step t + 2 is armed by the receiver's thread 0 after it waited for step t;
// bytes that arrive earlier are counted against the not yet armed phase, which completes only
// once armed. A last cluster barrier keeps every CTA alive until all exchanges are done.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/cluster.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "twogemm/exchange.cuh"
#include "twogemm/launch.cuh"
#include "twogemm/stage.cuh"
#include "twogemm/twogemm.h"

namespace elman {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
static_assert(kThreads == kLaunchThreads, "the plan asks occupancy at kLaunchThreads");
constexpr int kBc = kPersistentColumns;  // 8: one mma n-tile
static_assert(kBc == 8, "one n-tile of batch columns");
// Inputs come from HBM, about a step's latency away: staged three steps ahead.
constexpr int kLead = 3;
constexpr int kStages = kLead + 1;
constexpr int kRegR16 = 16;  // rank tiles held in registers (rank up to 256)
constexpr int kMaxR16 = 20;  // rank up to 320: tiles 16-19 in shared memory
constexpr int kMaxCluster = 16;

// Phases of a traced forward step (clock64 of thread 0 of CTA 0 at each boundary): start (h_{t-1}
// in shared memory), partials sent, shadow work done, partials arrived, p complete (block
// barrier passed), h_t written. After the T steps: clock64 and %globaltimer (ns) at kernel start
// and end, for the clock rate. In the untraced kernels the marks are no code.
static_assert(kLowRankTracePhases == 6, "the phases below");
template <bool kTrace>
__device__ __forceinline__ void mark(const LowRankPersistent& a, int step, int phase) {
  trace_mark<kTrace>(a.trace, kLowRankTracePhases, step, phase);
}
template <bool kTrace>
__device__ __forceinline__ void stamp(const LowRankPersistent& a, int slot) {
  trace_stamp<kTrace>(a.trace, kLowRankTracePhases, a.steps, slot);
}

// Shared memory of one CTA: mbarriers [2] | x [8][kX] (h_{t-1}, or d_pre) | p [8][kP] (the
// summed r-wide vector) | staged inputs [kStages][kIn][8][kX] | fragments of the rank tiles
// past kRegR16: stage A's [KA][kExtra * 32] and stage B's [kExtra][KA * 32] uint4 (one a lane)
// | receive [2][C][R16][32] uint2.
template <int KA, int R16, bool kBackward>
struct Layout {
  static constexpr int S = 16 * KA;          // rows per CTA
  static constexpr int RP = 16 * R16;        // padded rank
  static constexpr int kReg = R16 < kRegR16 ? R16 : kRegR16;  // rank tiles in registers
  static constexpr int kExtra = R16 - kReg;  // rank tiles in shared memory
  static_assert(kExtra == 0 || (kReg == kRegR16 && kExtra <= kWarps),
                "stage A: warp w < kExtra takes rank tile kRegR16 + w");
  static constexpr int kX = S + 8;           // bf16 per column of x and of a staged input
  static constexpr int kP = RP + 8;          // bf16 per column of p
  static constexpr int kIn = kBackward ? 5 : 2;  // forward a, c; backward d_out, c, h_{t-1}, h_t, aux
  static constexpr int kAM = (R16 + kWarps - 1) / kWarps;     // stage-A tiles per warp
  static constexpr int kAMReg = (kReg + kWarps - 1) / kWarps;  // of them in registers
  static constexpr int kXOff = 16;
  static constexpr int kPOff = kXOff + kBc * kX * 2;
  static constexpr int kStageOff = kPOff + kBc * kP * 2;
  static constexpr int kStageElems = kIn * kBc * kX;
  static constexpr int kFragOff = kStageOff + kStages * kStageElems * 2;
  static constexpr int kFragA = KA * kExtra * 32;  // uint4 of stage A's shared fragments
  static constexpr int kRecvOff = kFragOff + (kFragA + kExtra * KA * 32) * 16;
  static constexpr int kTileBytes = 32 * 8;  // one 16-row tile of one source, every lane
  static int bytes(int cluster) { return kRecvOff + 2 * cluster * R16 * kTileBytes; }
  static_assert(kXOff % 16 == 0 && kPOff % 16 == 0 && kStageOff % 16 == 0 && kFragOff % 16 == 0 &&
                    kRecvOff % 16 == 0,
                "16-byte aligned regions (cp.async destinations)");
};

// The CTA's place and its shared memory.
template <class L>
struct Cta {
  unsigned char* base;
  int C, rank, row0, col0, nb, warp, lane, g, q;

  __device__ Cta(unsigned char* smem, const cg::cluster_group& cluster, int batch) : base(smem) {
    C = int(cluster.num_blocks());
    rank = int(cluster.block_rank());
    row0 = rank * L::S;
    col0 = int(blockIdx.x) / C * kBc;
    nb = min(kBc, batch - col0);
    warp = int(threadIdx.x) >> 5;
    lane = int(threadIdx.x) & 31;
    g = lane >> 2;
    q = lane & 3;
  }
  __device__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base); }
  __device__ bf16* x() const { return reinterpret_cast<bf16*>(base + L::kXOff); }
  __device__ bf16* p() const { return reinterpret_cast<bf16*>(base + L::kPOff); }
  __device__ bf16* stage(int step) const {
    return reinterpret_cast<bf16*>(base + L::kStageOff) + (step % kStages) * L::kStageElems;
  }
  __device__ uint2* recv(int buf, int src, int tile) const {
    return reinterpret_cast<uint2*>(base + L::kRecvOff) + ((buf * C + src) * R16() + tile) * 32;
  }
  __device__ static constexpr int R16() { return L::RP / 16; }
  // This lane's fragment of stage A's shared rank tile kRegR16 + warp at k-step s (warp <
  // kExtra), and of stage B's rows at rank k-step kRegR16 + k (warp < KA).
  __device__ uint4& frag_a(int s) const {
    return reinterpret_cast<uint4*>(base + L::kFragOff)[s * L::kExtra * 32 + int(threadIdx.x)];
  }
  __device__ uint4& frag_b(int k) const {
    return reinterpret_cast<uint4*>(base + L::kFragOff)[L::kFragA + k * (L::S / 16) * 32 + int(threadIdx.x)];
  }
  // The rank tiles past the registers' into this lane's shared fragments: a_elem as wa's
  // elements, b_elem as wb's (the kernels' load_frags), m and k in the padded rank.
  template <class AElem, class BElem>
  __device__ void store_extra_frags(AElem a_elem, BElem b_elem) const {
    if constexpr (L::kExtra > 0) {
      uint32_t f[1][L::S / 16][4];
      if (warp < L::kExtra) {
        load_frags(f, kRegR16 + warp, kWarps, R16(), a_elem);
#pragma unroll
        for (int s = 0; s < L::S / 16; ++s) frag_a(s) = make_uint4(f[0][s][0], f[0][s][1], f[0][s][2], f[0][s][3]);
      }
      if (warp < L::S / 16) {
        uint32_t e[1][L::kExtra][4];
        load_frags(e, warp, kWarps, L::S / 16, [&](int m, int k) { return b_elem(m, k + 16 * kRegR16); });
#pragma unroll
        for (int k = 0; k < L::kExtra; ++k) frag_b(k) = make_uint4(e[0][k][0], e[0][k][1], e[0][k][2], e[0][k][3]);
      }
    }
  }
  // Lanes whose accumulator columns 2q, 2q + 1 hold a live batch column send them.
  __device__ int live_quads() const { return min(4, (nb + 1) / 2); }
  __device__ uint32_t exchange_bytes() const {
    return uint32_t(C * R16() * 8 * live_quads() * 8);
  }

  // Element e (0..3) of this lane's stage-B accumulators: row i of the CTA, batch column n.
  __device__ int elem_row(int e) const { return warp * 16 + g + 8 * (e >> 1); }
  __device__ int elem_col(int e) const { return 2 * q + (e & 1); }
  __device__ bool live(int e, int dim) const {
    return row0 + elem_row(e) < dim && elem_col(e) < nb;
  }

  // Init: mbarriers, zero receive buffers (unsent lanes' slots then hold finite values).
  __device__ void init() const {
    if (threadIdx.x == 0) {
      mbar_init(&bar()[0]);
      mbar_init(&bar()[1]);
      mbar_init_fence();
    }
    uint2* r = recv(0, 0, 0);
    for (int i = int(threadIdx.x); i < 2 * C * R16() * 32; i += kThreads) r[i] = make_uint2(0u, 0u);
  }

  // Stage step `step`'s kIn input slices (this CTA's rows, live columns) as one cp.async group;
  // `src(k)` is tensor k's [B][D] plane of that step, nullptr for a tensor the mode does not read.
  template <class Src>
  __device__ void stage_inputs(int step, bool skip, int batch, int dim, Src src) const {
    bf16* dst = stage(step);
    constexpr int kChunks = kBc * (L::S / 8);
    for (int c = int(threadIdx.x); !skip && c < L::kIn * kChunks; c += kThreads) {
      const int k = c / kChunks, n = (c % kChunks) / (L::S / 8), i = (c % (L::S / 8)) * 8;
      const bf16* plane = src(k);
      if (plane == nullptr || n >= nb || row0 + i >= dim) continue;
      const bf16* gp = plane + size_t(col0 + n) * dim + row0 + i;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                       smem_u32(dst + (k * kBc + n) * L::kX + i)),
                   "l"(gp));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  template <int kPending>
  __device__ static void wait_inputs() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
  }
  __device__ float staged(int step, int k, int e) const {
    return __bfloat162float(stage(step)[(k * kBc + elem_col(e)) * L::kX + elem_row(e)]);
  }

  // A: this warp's tiles of wa (and of the shared fragments) times x -> partials, sent to
  // every CTA's buffer `buf`.
  template <int KA, int AM>
  __device__ void multiply_and_send(const uint32_t (&wa)[AM][KA][4], int buf) const {
    if (warp >= R16()) return;
    constexpr int kE = L::kExtra > 0 ? 1 : 0;  // the shared tile, accumulated in acc[AM]
    float acc[AM + kE][2][4] = {};
    const bf16* xs = x() + g * L::kX + 2 * q;
#pragma unroll
    for (int s = 0; s < KA; ++s) {
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(xs + s * 16);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(xs + s * 16 + 8);
#pragma unroll
      for (int j = 0; j < AM; ++j)
        if (warp + j * kWarps < L::kReg) mma(acc[j][s & 1], wa[j][s], b0, b1);
      if constexpr (kE > 0) {
        if (warp < L::kExtra) {
          const uint4 f = frag_a(s);
          const uint32_t a[4] = {f.x, f.y, f.z, f.w};
          mma(acc[AM][s & 1], a, b0, b1);
        }
      }
    }
    if (q >= live_quads()) return;
    const uint32_t bar_local = smem_u32(&bar()[buf]);
#pragma unroll
    for (int j = 0; j < AM + kE; ++j) {
      const int tile = j < AM ? warp + j * kWarps : kRegR16 + warp;
      if (j < AM ? tile >= L::kReg : warp >= L::kExtra) continue;
      const uint32_t lo = pack(__float2bfloat16_rn(acc[j][0][0] + acc[j][1][0]),
                               __float2bfloat16_rn(acc[j][0][1] + acc[j][1][1]));
      const uint32_t hi = pack(__float2bfloat16_rn(acc[j][0][2] + acc[j][1][2]),
                               __float2bfloat16_rn(acc[j][0][3] + acc[j][1][3]));
      const uint32_t slot = smem_u32(recv(buf, rank, tile) + lane);
      for (int peer = 0; peer < C; ++peer)
        st_async8(map_to_rank(slot, uint32_t(peer)), lo, hi, map_to_rank(bar_local, uint32_t(peer)));
    }
  }

  // The lane's 4 sums of tile `tile`, rounded to bf16 into p; CTA 0 stores the live values to
  // dst ([B][r] plane of this step).
  __device__ __forceinline__ void store_sum(int tile, const float (&s)[4], int rank_r, bf16* dst) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = tile * 16 + g + 8 * (e >> 1), n = 2 * q + (e & 1);
      const bf16 v = __float2bfloat16_rn(s[e]);
      p()[n * L::kP + k] = v;
      if (rank == 0 && n < nb && k < rank_r) dst[size_t(col0 + n) * rank_r + k] = v;
    }
  }

  // R: this warp's tiles summed over the sources in rank order (`store_sum`).
  template <int AM>
  __device__ void reduce(int buf, int phase, int rank_r, bf16* dst) const {
    if (warp >= R16()) return;
    mbar_wait(&bar()[buf], uint32_t(phase));
#pragma unroll
    for (int j = 0; j < AM; ++j) {
      const int tile = warp + j * kWarps;
      if (tile >= R16()) continue;
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      for (int src = 0; src < C; ++src) {
        const uint2 v = recv(buf, src, tile)[lane];
        s[0] += lo_f(v.x);
        s[1] += hi_f(v.x);
        s[2] += lo_f(v.y);
        s[3] += hi_f(v.y);
      }
      store_sum(tile, s, rank_r, dst);
    }
  }

  // R as `reduce`, with every source's tile loaded before the sum (the same rank order);
  // `arrived()` runs once the tiles are in.
  template <int AM, class Arrived>
  __device__ void reduce_loaded(int buf, int phase, int rank_r, bf16* dst, Arrived arrived) const {
    if (warp >= R16()) return;
    mbar_wait(&bar()[buf], uint32_t(phase));
    arrived();
#pragma unroll
    for (int j = 0; j < AM; ++j) {
      const int tile = warp + j * kWarps;
      if (tile >= R16()) continue;
      uint2 v[kMaxCluster];
#pragma unroll
      for (int src = 0; src < kMaxCluster; ++src)
        if (src < C) v[src] = recv(buf, src, tile)[lane];
      float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int src = 0; src < kMaxCluster; ++src) {
        if (src >= C) break;
        s[0] += lo_f(v[src].x);
        s[1] += hi_f(v[src].x);
        s[2] += lo_f(v[src].y);
        s[3] += hi_f(v[src].y);
      }
      store_sum(tile, s, rank_r, dst);
    }
  }

  // B: this warp's 16 rows of wb (then of the shared fragments) times p -> the lane's 4
  // elements (fp32).
  __device__ void multiply_p(const uint32_t (&wb)[L::kReg][4], float (&out)[4]) const {
    float acc[2][4] = {};
    const bf16* ps = p() + g * L::kP + 2 * q;
#pragma unroll
    for (int k = 0; k < L::kReg; ++k) {
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(ps + k * 16);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(ps + k * 16 + 8);
      mma(acc[k & 1], wb[k], b0, b1);
    }
#pragma unroll
    for (int k = 0; k < L::kExtra; ++k) {
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(ps + (kRegR16 + k) * 16);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(ps + (kRegR16 + k) * 16 + 8);
      const uint4 f = frag_b(k);
      const uint32_t a[4] = {f.x, f.y, f.z, f.w};
      mma(acc[k & 1], a, b0, b1);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = acc[0][e] + acc[1][e];
  }
};

// The forward of one stage mode (header comment).
template <int KA, int R16, int kMode, bool kTrace>
__device__ __forceinline__ void forward(const LowRankPersistent& a) {
  using L = Layout<KA, R16, false>;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  const Cta<L> cta(smem, cluster, a.batch);
  const int D = a.dim, B = a.batch, r = a.rank, T = a.steps;
  const size_t BD = size_t(B) * D;
  const bf16* u = static_cast<const bf16*>(a.u);
  const bf16* v = static_cast<const bf16*>(a.v);
  const bf16* av = static_cast<const bf16*>(a.a);
  const bf16* cv = static_cast<const bf16*>(a.c);
  const bf16* h0 = static_cast<const bf16*>(a.h0);
  bf16* out = static_cast<bf16*>(a.out);
  bf16* h_all = static_cast<bf16*>(a.h_all);
  bf16* p_all = static_cast<bf16*>(a.p_all);
  bf16* aux = static_cast<bf16*>(a.aux);
  const bf16 zero = __float2bfloat16_rn(0.f);
  cta.init();
  auto inputs = [&](int t) {
    return [=](int k) -> const bf16* { return (k == 0 ? av : cv) + size_t(t) * BD; };
  };
  for (int i = 0; i < kLead; ++i) cta.stage_inputs(i, i >= T, B, D, inputs(i));

  // A: V[m][row0 + k]; B: U[row0 + m][k].
  uint32_t wa[L::kAMReg][KA][4];
  uint32_t wb[1][L::kReg][4];
  const int row0 = cta.row0;
  const auto a_elem = [&](int m, int k) {
    return m < r && row0 + k < D ? v[size_t(m) * D + row0 + k] : zero;
  };
  const auto b_elem = [&](int m, int k) {
    return k < r && row0 + m < D ? u[size_t(row0 + m) * r + k] : zero;
  };
  load_frags(wa, cta.warp, kWarps, L::kReg, a_elem);
  load_frags(wb, cta.warp, kWarps, KA, b_elem);
  cta.store_extra_frags(a_elem, b_elem);

  for (int o = int(threadIdx.x); o < kBc * L::S; o += kThreads) {
    const int n = o / L::S, i = o % L::S;
    const bool live = n < cta.nb && row0 + i < D;
    const size_t idx = size_t(cta.col0 + n) * D + row0 + i;
    cta.x()[n * L::kX + i] = live ? h0[idx] : zero;
    if (live) h_all[idx] = h0[idx];
  }
  const bool epi = cta.warp < KA;  // this warp owns 16 rows in B and the stage
  float hreg[4], bias[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const bool live = epi && cta.live(e, D);
    const size_t idx = size_t(cta.col0 + cta.elem_col(e)) * D + row0 + cta.elem_row(e);
    hreg[e] = live ? __bfloat162float(h0[idx]) : 0.f;
    bias[e] = live ? __bfloat162float(static_cast<const bf16*>(a.b)[row0 + cta.elem_row(e)]) : 0.f;
  }
  // Step t - 1's state (unrounded), aux and gate, whose outputs are stored during step t.
  float hf[4] = {}, auxf[4] = {}, gate[4] = {};
  auto store_outputs = [&](int t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!cta.live(e, D)) continue;
      const size_t idx = size_t(t) * BD + size_t(cta.col0 + cta.elem_col(e)) * D + row0 + cta.elem_row(e);
      h_all[idx + BD] = __float2bfloat16_rn(hreg[e]);
      out[idx] = __float2bfloat16_rn(lowrank_output<kMode>(hf[e], gate[e]));
      if (kMode != kTanhGate) aux[idx] = __float2bfloat16_rn(auxf[e]);
    }
  };
  Cta<L>::template wait_inputs<kLead - 1>();  // step 0's inputs (this thread's copies)
  __syncthreads();                            // x, and every thread's copies, visible
  cluster.sync();  // mbarriers initialised and receive buffers zeroed in every CTA
  stamp<kTrace>(a, 0);

  for (int t = 0; t < T; ++t) {
    const int buf = t & 1;
    mark<kTrace>(a, t, 0);
    if (threadIdx.x == 0) mbar_expect(&cta.bar()[buf], cta.exchange_bytes());
    cta.multiply_and_send(wa, buf);
    mark<kTrace>(a, t, 1);
    // Into the slot of step t - 1, whose reads all preceded the last block barrier.
    cta.stage_inputs(t + kLead, t + kLead >= T, B, D, inputs(t + kLead));
    float ain[4], cin[4];
    if (epi) {
      if (t > 0) store_outputs(t - 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        ain[e] = cta.staged(t, 0, e);
        cin[e] = cta.staged(t, 1, e);
        gate[e] = lowrank_gate<kMode>(cin[e]);
      }
    }
    mark<kTrace>(a, t, 2);
    cta.template reduce_loaded<L::kAM>(buf, (t >> 1) & 1, r, p_all + size_t(t) * B * r,
                                       [&] { mark<kTrace>(a, t, 3); });
    __syncthreads();  // p complete
    mark<kTrace>(a, t, 4);
    if (epi) {
      float qv[4];
      cta.multiply_p(wb[0], qv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = cta.elem_col(e), i = cta.elem_row(e);
        const bool live = cta.live(e, D);
        const float pre = ain[e] + qv[e] + bias[e];
        const StageState st = lowrank_state<kMode>(pre, gate[e], cin[e], hreg[e]);
        const bf16 hb = __float2bfloat16_rn(st.h);
        hreg[e] = live ? __bfloat162float(hb) : 0.f;
        cta.x()[n * L::kX + i] = live ? hb : zero;
        hf[e] = st.h;
        auxf[e] = st.aux;
      }
    }
    mark<kTrace>(a, t, 5);
    Cta<L>::template wait_inputs<kLead - 1>();  // step t + 1's inputs (this thread's copies)
    __syncthreads();  // h_t complete for the next step's A; step t + 1's inputs visible
  }
  if (epi && T > 0) store_outputs(T - 1);
  stamp<kTrace>(a, 1);
  cluster.sync();  // no CTA leaves while an exchange into it may be in flight
}

// One instantiation per mode, chosen per launch.
template <int KA, int R16, bool kTrace>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(LowRankPersistent a) {
  if (a.mode == kTanhGate) forward<KA, R16, kTanhGate, kTrace>(a);
  else if (a.mode == kGatedTanh) forward<KA, R16, kGatedTanh, kTrace>(a);
  else forward<KA, R16, kGatedAlpha, kTrace>(a);
}

template <int KA, int R16>
__global__ void __launch_bounds__(kThreads, 1) backward_kernel(LowRankPersistent a) {
  using L = Layout<KA, R16, true>;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  const Cta<L> cta(smem, cluster, a.batch);
  const int D = a.dim, B = a.batch, r = a.rank, T = a.steps, mode = a.mode;
  const bool gated = mode != kTanhGate;
  const size_t BD = size_t(B) * D;
  const bf16* u = static_cast<const bf16*>(a.u);
  const bf16* v = static_cast<const bf16*>(a.v);
  const bf16* cv = static_cast<const bf16*>(a.c);
  const bf16* h_all = static_cast<const bf16*>(a.h_all);
  const bf16* auxv = static_cast<const bf16*>(a.aux);
  const bf16* d_out = static_cast<const bf16*>(a.d_out);
  const bf16* d_hT = static_cast<const bf16*>(a.d_hT);
  bf16* d_pre = static_cast<bf16*>(a.d_pre);
  bf16* d_c = static_cast<bf16*>(a.d_c);
  bf16* dp_all = static_cast<bf16*>(a.dp_all);
  bf16* dh0 = static_cast<bf16*>(a.dh0);
  const bf16 zero = __float2bfloat16_rn(0.f);
  cta.init();
  // Staged tensors of step t: d_out, c, h_{t-1}, h_t, aux (the last three's first and last
  // only in the gated modes).
  auto inputs = [&](int t) {
    return [=](int k) -> const bf16* {
      const size_t o = size_t(t) * BD;
      switch (k) {
        case 0: return d_out + o;
        case 1: return cv + o;
        case 2: return gated ? h_all + o : nullptr;
        case 3: return h_all + o + BD;
        default: return gated ? auxv + o : nullptr;
      }
    };
  };
  for (int i = 0; i < kLead; ++i) cta.stage_inputs(i, i >= T, B, D, inputs(T - 1 - i));

  // A: U[row0 + k][m] (U^T); B: V[k][row0 + m] (V^T).
  uint32_t wa[L::kAMReg][KA][4];
  uint32_t wb[1][L::kReg][4];
  const int row0 = cta.row0;
  const auto a_elem = [&](int m, int k) {
    return m < r && row0 + k < D ? u[size_t(row0 + k) * r + m] : zero;
  };
  const auto b_elem = [&](int m, int k) {
    return k < r && row0 + m < D ? v[size_t(k) * D + row0 + m] : zero;
  };
  load_frags(wa, cta.warp, kWarps, L::kReg, a_elem);
  load_frags(wb, cta.warp, kWarps, KA, b_elem);
  cta.store_extra_frags(a_elem, b_elem);

  const bool epi = cta.warp < KA;
  float greg[4];  // dL/dh_t of this lane's elements, fp32
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const bool live = epi && cta.live(e, D);
    greg[e] = live ? __bfloat162float(
                         d_hT[size_t(cta.col0 + cta.elem_col(e)) * D + row0 + cta.elem_row(e)])
                   : 0.f;
  }
  Cta<L>::template wait_inputs<kLead - 1>();  // step T - 1's inputs
  __syncthreads();
  cluster.sync();

  for (int s = 0; s < T; ++s) {  // s-th step from the end: t = T - 1 - s
    const int t = T - 1 - s, buf = s & 1;
    if (threadIdx.x == 0) mbar_expect(&cta.bar()[buf], cta.exchange_bytes());
    cta.stage_inputs(s + kLead, s + kLead >= T, B, D, inputs(t - kLead));
    float direct[4] = {0.f, 0.f, 0.f, 0.f};
    if (epi) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = cta.elem_col(e), i = cta.elem_row(e);
        const bool live = cta.live(e, D);
        const StageGrad sg = lowrank_stage_grad(
            mode, cta.staged(s, 0, e), cta.staged(s, 1, e), gated ? cta.staged(s, 2, e) : 0.f,
            cta.staged(s, 3, e), gated ? cta.staged(s, 4, e) : 0.f, greg[e]);
        const bf16 db = __float2bfloat16_rn(sg.d_pre);
        cta.x()[n * L::kX + i] = live ? db : zero;
        direct[e] = live ? sg.direct : 0.f;
        if (live) {
          const size_t idx = size_t(t) * BD + size_t(cta.col0 + n) * D + row0 + i;
          d_pre[idx] = db;
          d_c[idx] = __float2bfloat16_rn(sg.d_c);
        }
      }
    }
    __syncthreads();  // d_pre complete for A
    cta.multiply_and_send(wa, buf);
    cta.template reduce<L::kAM>(buf, (s >> 1) & 1, r, dp_all + size_t(t) * B * r);
    Cta<L>::template wait_inputs<kLead - 1>();  // the next step's inputs landed
    __syncthreads();                            // dp complete; copies visible; x free
    if (epi) {
      float gv[4];
      cta.multiply_p(wb[0], gv);
#pragma unroll
      for (int e = 0; e < 4; ++e) greg[e] = cta.live(e, D) ? gv[e] + direct[e] : 0.f;
    }
  }
  if (epi) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (cta.live(e, D))
        dh0[size_t(cta.col0 + cta.elem_col(e)) * D + row0 + cta.elem_row(e)] =
            __float2bfloat16_rn(greg[e]);
  }
  cluster.sync();
}

// ---- shapes, plan and launch ---------------------------------------------------------------
using Kernel = void (*)(LowRankPersistent);

// The padded rank's 16-row tiles: 1, 2, 4, 8, 16 or 20 (0: above 320).
int rank_tiles(int rank) {
  const int t = (rank + 15) / 16;
  for (int p = 1; p <= kRegR16; p *= 2)
    if (t <= p) return p;
  return t <= kMaxR16 ? kMaxR16 : 0;
}

// The backward, or the forward, traced or not.
Kernel pick(int ka, int r16, bool backward, bool traced = false) {
#define ELMAN_CASE(KA, R16)                                                                     \
  if (ka == KA && r16 == R16) {                                                                 \
    if (backward) return backward_kernel<KA, R16>;                                              \
    return traced ? forward_kernel<KA, R16, true> : forward_kernel<KA, R16, false>;             \
  }
  ELMAN_CASE(4, 1) ELMAN_CASE(4, 2) ELMAN_CASE(4, 4) ELMAN_CASE(4, 8) ELMAN_CASE(4, 16) ELMAN_CASE(4, 20)
  ELMAN_CASE(8, 1) ELMAN_CASE(8, 2) ELMAN_CASE(8, 4) ELMAN_CASE(8, 8) ELMAN_CASE(8, 16) ELMAN_CASE(8, 20)
#undef ELMAN_CASE
  return nullptr;
}

template <int KA>
int smem_ka(int r16, int cluster, bool backward) {
  switch (r16) {
#define ELMAN_CASE(R16) \
  case R16: return backward ? Layout<KA, R16, true>::bytes(cluster) : Layout<KA, R16, false>::bytes(cluster);
    ELMAN_CASE(1) ELMAN_CASE(2) ELMAN_CASE(4) ELMAN_CASE(8) ELMAN_CASE(16) ELMAN_CASE(20)
#undef ELMAN_CASE
    default: return 1 << 30;
  }
}
int smem_of(int ka, int r16, int cluster, bool backward) {
  return ka == 4 ? smem_ka<4>(r16, cluster, backward) : smem_ka<8>(r16, cluster, backward);
}

}  // namespace

// The cluster: the fewest CTAs (a power of two, at most 16) of at most 128 rows each, 64 rows
// a CTA where that covers D. Fewer CTAs exchange fewer partials (each receives C r-wide
// partials a step); 128 rows keep a warp's chain at 8 mma. For r above 256 exactly
// ceil(D / 128) CTAs: the receive buffers (2 C R16 tiles) and the shared fragments then fit
// (D = 1280, r = 320: 10 CTAs of 182 KiB; 16 would need 242 KiB).
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
  if (dim % 8 != 0) {
    plan.reason = "D must be a multiple of 8 (inputs are staged in 16-byte rows)";
    return plan;
  }
  const int r16 = rank_tiles(rank);
  if (r16 == 0) {
    plan.reason = "r above 320 (the factor slices are held on chip)";
    return plan;
  }
  int cluster = 1;
  if (r16 > kRegR16) cluster = (dim + 127) / 128;
  else while (cluster * 128 < dim) cluster *= 2;
  if (cluster > 16) {
    plan.reason = "D above 2048 (at most 16 CTAs of 128 rows)";
    return plan;
  }
  const int ka = dim <= cluster * 64 ? 4 : 8;
  const int smem = max(smem_of(ka, r16, cluster, false), smem_of(ka, r16, cluster, true));
  if (!cluster_fits(pick(ka, r16, false), cluster, smem) ||
      !cluster_fits(pick(ka, r16, true), cluster, smem)) {
    plan.reason = "the GPU cannot hold one cluster of this shape";
    return plan;
  }
  plan.ok = true;
  plan.cluster = cluster;
  plan.clusters = (batch + kBc - 1) / kBc;
  plan.smem = smem;
  plan.ka = ka;
  plan.r16 = r16;
  return plan;
}

template <typename T>
cudaError_t lowrank_persistent_forward(const LowRankPlan& plan, const LowRankPersistent& a) {
  Kernel k = pick(plan.ka, plan.r16, false, a.trace != nullptr);
  if (k == nullptr) return cudaErrorInvalidValue;
  if (!cluster_fits(k, plan.cluster, plan.smem)) return cudaErrorInvalidConfiguration;
  return launch_clusters(k, plan, a);
}

template <typename T>
cudaError_t lowrank_persistent_backward(const LowRankPlan& plan, const LowRankPersistent& a) {
  return launch_clusters(pick(plan.ka, plan.r16, true), plan, a);
}

template cudaError_t lowrank_persistent_forward<__nv_bfloat16>(const LowRankPlan&, const LowRankPersistent&);
template cudaError_t lowrank_persistent_backward<__nv_bfloat16>(const LowRankPlan&, const LowRankPersistent&);

}  // namespace elman
