// Plain C++ launchers of the two-GEMM family's fused stages (no torch headers): the binding
// (binding.cpp) validates every input and calls these; the GEMMs between stages are the
// caller's (torch and cuBLAS). T is float or __nv_bfloat16; arithmetic is fp32. The math of each
// stage is lib/elman/families/twogemm/stages.py.
#pragma once

#include <cuda_runtime.h>

namespace elman {

// Low-rank stage modes (stages.MODES).
enum LowRankMode : int { kTanhGate = 0, kGatedTanh = 1, kGatedAlpha = 2 };
constexpr int kLowRankModes = 3;

// One forward step on [B, D] rows: pre = a + q + b; writes h_next, out and (modes 1, 2) aux.
template <typename T>
cudaError_t lowrank_forward(int mode, int batch, int dim, const T* a, const T* c, const T* q,
                            const T* b, const T* h_prev, T* h_next, T* out, T* aux,
                            cudaStream_t stream);

// One backward step: g = dL/dh_t from later steps; writes d_pre, d_c and g_out (the part of
// dL/dh_{t-1} that bypasses U V). g_out may alias g.
template <typename T>
cudaError_t lowrank_backward(int mode, int batch, int dim, const T* d_out, const T* c,
                             const T* h_prev, const T* h, const T* aux, const T* g, T* d_pre,
                             T* d_c, T* g_out, cudaStream_t stream);

// The tape kernels run one CTA per batch row and keep two floats per slot in shared memory.
constexpr int kMaxSlots = 256;

// read: alpha = softmax(s M w_prev), w = tanh(hw + wx + M^T alpha + b), out = w * silu(z).
template <typename T>
cudaError_t tape_read(int batch, int slots, int dim, const T* wx, const T* z, const T* hw,
                      const T* b, const T* m, const T* w_prev, T* w_out, T* out,
                      cudaStream_t stream);

// write: beta = softmax(s M_in w), M_out = (1 - beta) M_in + beta u^T. M_out may alias M_in.
template <typename T>
cudaError_t tape_write(int batch, int slots, int dim, const T* m_in, const T* w, const T* u,
                       T* m_out, cudaStream_t stream);

// Back through write and output: dm (fp32) holds dL/dM_t and becomes the write's part of
// dL/dM_{t-1}; writes gw = g + d_out silu'(...) terms + s sum_n de_n M_n, du, dz.
template <typename T>
cudaError_t tape_write_backward(int batch, int slots, int dim, const T* m, float* dm, const T* w,
                                const T* u, const T* d_out, const T* z, const T* g, T* gw, T* du,
                                T* dz, cudaStream_t stream);

// Back through read and update: writes d_pre, adds the read's part into dm, writes
// g_out = s sum_n da_n M_n.
template <typename T>
cudaError_t tape_read_backward(int batch, int slots, int dim, const T* m, float* dm,
                               const T* w_prev, const T* w, const T* gw, T* d_pre, T* g_out,
                               cudaStream_t stream);

}  // namespace elman

namespace elman {

// ---- the low-rank persistent kernels: one launch runs the whole sequence -----------------
// A cluster of C CTAs (1 to 16) owns kPersistentColumns batch columns; CTA c owns the state
// rows [c S, c S + S), S = 64 or 128, with its slices of U and V in registers. Per step the
// CTAs exchange only r-wide partial sums, through st.async and mbarriers (persistent.cu).
constexpr int kPersistentColumns = 8;
// clock64 stamps per step of a traced forward (persistent.cu names the phases).
constexpr int kLowRankTracePhases = 6;

struct LowRankPersistent {
  int mode, steps, batch, dim, rank;
  const void* a;        // [T][B][D]
  const void* c;        // [T][B][D]
  const void* u;        // U [D][r]
  const void* v;        // V [r][D]
  const void* b;        // [D]
  const void* h0;       // [B][D]
  void* out;            // forward: [T][B][D]
  void* h_all;          // [T+1][B][D]: written forward, read backward
  void* p_all;          // forward: V h_{t-1} [T][B][r]
  void* aux;            // [T][B][D] (modes 1, 2): written forward, read backward
  const void* d_out;    // backward: [T][B][D]
  const void* d_hT;     // backward: [B][D]
  void* d_pre;          // backward: [T][B][D]
  void* d_c;            // backward: [T][B][D]
  void* dp_all;         // backward: d_pre U [T][B][r]
  void* dh0;            // backward: [B][D]
  long long* trace;     // forward, optional: [T * kLowRankTracePhases + 4] (the traced kernel)
  cudaStream_t stream;
};

struct LowRankPlan {
  bool ok = false;
  int cluster = 0, clusters = 0, smem = 0;
  int ka = 0, r16 = 0;  // low-rank: rows per CTA / 16 and the padded rank / 16
  const char* reason = "";
};

// Whether (and how) the persistent kernels take this size: bf16, D a multiple of 8 up to
// 2048, r up to 320; both directions must fit. The launchers are instantiated for __nv_bfloat16.
LowRankPlan lowrank_persistent_plan(int batch, int dim, int rank, bool bf16);

template <typename T>
cudaError_t lowrank_persistent_forward(const LowRankPlan& plan, const LowRankPersistent& a);
template <typename T>
cudaError_t lowrank_persistent_backward(const LowRankPlan& plan, const LowRankPersistent& a);

}  // namespace elman

namespace elman {

// ---- E23's persistent kernels: one launch runs the whole sequence --------------------------
// A cluster of C CTAs (4, 8 or 16) owns kTapeForwardColumns batch columns; CTA c owns 32 state
// rows, holds its 32-row slices of W_h and W_wr (forward) or of their transposes (backward)
// in registers (mma fragments) and its columns of the tape in shared memory; two exchanges a
// step (tape_cta.cuh, tape_persistent.cu, tape_persistent_backward.cu). D <= kTapeMaxDim,
// N <= kTapeMaxSlotsOnChip, bf16.
constexpr int kTapeForwardColumns = 8;
constexpr int kTapeMaxDim = 512;
constexpr int kTapeMaxSlotsOnChip = 32;

struct TapePersistent {
  int steps, batch, dim, slots, interval;  // interval: K, a tape checkpoint every K steps
  const void* wx;      // W_x x [T][B][D]
  const void* z;       // [T][B][D]
  const void* w_h;     // [D][D]
  const void* w_wr;    // [D][D]
  const void* b;       // [D]
  const void* h0;      // [B][D]
  const void* tape0;   // [B][N][D]
  void* out;           // [T][B][D]
  void* w_all;         // [T+1][B][D]
  void* tape_T;        // [B][N][D]
  void* ckpt;          // [ceil(T/K)][B][N][D]: the tape before steps 0, K, 2K, ...
  void* u_all;         // W_wr w_t [T][B][D], or nullptr (then alpha_all, beta_all unused)
  float* alpha_all;    // read weights [T][B][N]
  float* beta_all;     // write weights [T][B][N]
  cudaStream_t stream;
};

LowRankPlan tape_persistent_plan(int batch, int dim, int slots, bool bf16);

template <typename T>
cudaError_t tape_persistent_forward(const LowRankPlan& plan, const TapePersistent& a);

// The backward: segments of K steps last to first; each segment's tapes are recomputed from
// its checkpoint with the saved u, beta (no exchange) into shared memory, then its steps run
// backward with dL/dM on chip (fp32) and two exchanges a step.
struct TapePersistentBackward {
  int steps, batch, dim, slots, interval;
  const void* z;           // [T][B][D]
  const void* w_h;         // [D][D]
  const void* w_wr;        // [D][D]
  const void* w_all;       // [T+1][B][D]
  const void* u_all;       // [T][B][D]
  const float* alpha_all;  // [T][B][N]
  const float* beta_all;   // [T][B][N]
  const void* ckpt;        // [ceil(T/K)][B][N][D]
  const void* d_out;       // [T][B][D]
  const void* d_hT;        // [B][D]
  const float* d_tapeT;    // [B][N][D]
  void* d_pre;             // [T][B][D]
  void* d_u;               // [T][B][D]
  void* d_z;               // [T][B][D]
  void* dh0;               // [B][D]
  float* d_tape0;          // [B][N][D]
  cudaStream_t stream;
};

// The largest K <= ceil(sqrt(T)) whose segment of tapes fits the backward's shared memory
// (0 where the persistent kernels do not take D and N).
int tape_persistent_interval(int steps, int dim, int slots);

LowRankPlan tape_persistent_backward_plan(int batch, int dim, int slots, int interval, bool bf16);

template <typename T>
cudaError_t tape_persistent_backward(const LowRankPlan& plan, const TapePersistentBackward& a);

}  // namespace elman
