// Plain C++ launchers of the two-GEMM family's fused stages (no torch headers): the binding
// (binding.cpp) validates every input and calls these; the GEMMs between stages are the
// caller's (torch/cuBLAS). T is float or __nv_bfloat16; arithmetic is fp32. The math of each
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
