// Plain C++ declarations of the dense-family launchers (no torch headers: nvcc alone
// compiles the .cu files). Tensors are time-major and contiguous:
//   wx, z, out, d_out, dv, dz : [T, B, D]     h_all : [T + 1, B, D] (h_all[0] = h0)
//   w_h : [D, D] row-major (out x in)          b : [D]      h0, d_hT, dh0 : [B, D]
// Every launcher returns a CUDA error code (cudaSuccess on success) and checks the
// last launch error; the binding validates shapes, dtypes and sizes before calling.
#pragma once

#include <cuda_runtime.h>

struct cublasContext;  // the same declaration as cublas_v2.h, which the .cu files do not need
typedef struct cublasContext* cublasHandle_t;

namespace elman {

// Per-step elementwise math of a dense cell; the functors live in dense_cell.cuh.
enum Epilogue : int { kTanhSiluGate = 0 };  // h = tanh(v), out = h * silu(z): E0, E1

// ---- one step's fused elementwise work (dense_steps.cu) ------------------------------
// forward : h, out from acc = W_h h_{t-1} (fp32: the sum of `splits` partial products at
// acc + s * n), wx, z and b, for n = B * D elements.
// backward: dv, dz from the recurrent gradient (acc32 in fp32, `splits` partials as in
// forward, or accT = d_hT at the last step), d_out, h_t and z.
template <typename T>
cudaError_t dense_step_forward(cudaStream_t stream, int epilogue, int n, int dim, int splits,
                               const float* acc, const T* wx, const T* z, const T* b, T* h,
                               T* out);
template <typename T>
cudaError_t dense_step_backward(cudaStream_t stream, int epilogue, int n, int splits,
                                const float* acc32, const T* accT, const T* d_out, const T* h,
                                const T* z, T* dv, T* dz);

// ---- per-step path (dense_steps.cpp): one cuBLAS GEMM and one fused step per step ------
// The GEMM's inner dimension is split into this many batched GEMMs (D >= 2048: D / 512);
// the workspace `ws` of the launchers below holds splits * B * D floats.
int dense_steps_splits(int dim);
// T is float or __nv_bfloat16; ws is a float workspace of splits * B * D elements; the handle
// must be bound to `stream` (torch's handle for the current stream is; its workspace also
// makes the loop capturable in a CUDA graph).
template <typename T>
cudaError_t dense_steps_forward(cublasHandle_t handle, cudaStream_t stream, int epilogue,
                                int steps, int batch, int dim, const T* wx, const T* z,
                                const T* w_h, const T* b, const T* h0, T* out, T* h_all,
                                float* ws);

template <typename T>
cudaError_t dense_steps_backward(cublasHandle_t handle, cudaStream_t stream, int epilogue,
                                 int steps, int batch, int dim, const T* w_h, const T* h_all,
                                 const T* z, const T* d_out, const T* d_hT, T* dv, T* dz,
                                 T* dh0, float* ws);

// ---- persistent path (bf16, sm_90): W_h lives in registers for the whole sequence ------
// Two designs: "cluster" (D <= 1024, dense_persistent.cu): one thread-block cluster holds
// W_h and owns `bc` batch columns; "grid" (D = 2048, dense_grid.cu): 128 CTAs without
// clusters hold 64 x 512 tiles and exchange state and partial sums through L2 (B <= 64).
struct PersistentPlan {
  bool ok = false;
  const char* reason = "";
  const char* design = "cluster";
  int cluster = 0;     // CTAs per cluster (1 in the grid design)
  int clusters = 0;    // clusters launched (grid: CTAs of one launch)
  int bc = 0;          // batch columns per cluster (cluster: 8 or 16; grid: 8 to 64)
  int smem = 0;        // dynamic shared memory per CTA, bytes
  int max_active = 0;  // clusters (grid: CTAs) of this shape the GPU can hold at once
  size_t xchg_bytes = 0;  // global workspace of the exchange (the launcher's `xchg`)
};

// Either design's plan: the grid design at D = 2048, the cluster design below.
PersistentPlan dense_persistent_plan(int batch, int dim, bool backward);
PersistentPlan dense_grid_plan(int batch, int dim, bool backward);

// `xchg`: plan.xchg_bytes of device memory (contents need no initialisation).
// `trace` (may be null): int64 [steps * 6 + 4]; CTA 0 records clock64 at six phase
// boundaries of every step, then clock64 and %globaltimer at kernel start and end.
cudaError_t dense_persistent_forward(cudaStream_t stream, int epilogue, int steps, int batch,
                                     int dim, const void* wx, const void* z, const void* w_h,
                                     const void* b, const void* h0, void* out, void* h_all,
                                     void* xchg, long long* trace = nullptr);

cudaError_t dense_persistent_backward(cudaStream_t stream, int epilogue, int steps, int batch,
                                      int dim, const void* w_h, const void* h_all,
                                      const void* z, const void* d_out, const void* d_hT,
                                      void* dv, void* dz, void* dh0, void* xchg);

// The grid design's launchers (D = 2048; the persistent launchers above dispatch to them).
cudaError_t dense_grid_forward(cudaStream_t stream, int steps, int batch, const void* wx,
                               const void* z, const void* w_h, const void* b, const void* h0,
                               void* out, void* h_all, void* xchg, long long* trace = nullptr);
cudaError_t dense_grid_backward(cudaStream_t stream, int steps, int batch, const void* w_h,
                                const void* h_all, const void* z, const void* d_out,
                                const void* d_hT, void* dv, void* dz, void* dh0, void* xchg);

// ---- primitives measured for the "Kernel engineering" chapter ------------------------
cudaError_t launch_empty(cudaStream_t stream);
cudaError_t launch_grid_sync(cudaStream_t stream, int iters, bool use_cg, unsigned* flags);
cudaError_t launch_flag_pingpong(cudaStream_t stream, int iters, unsigned* flags);
cudaError_t launch_cluster_sync(cudaStream_t stream, int cluster, int iters);
cudaError_t launch_dsmem_pingpong(cudaStream_t stream, int iters);
// One cluster of `cluster` CTAs exchanging `slice`-byte blocks all-to-all `iters` times;
// method 0 st.async, 1 bulk copy shared-to-peer, 2 multicast bulk copy from global
// (`scratch`: 2 * cluster * slice bytes of global memory).
cudaError_t launch_allgather(cudaStream_t stream, int method, int cluster, int slice, int iters,
                             void* scratch);
// `blocks` CTAs of 512 threads doing `rounds` rounds of one kind of work (0 FMAs, 1 mma.sync
// back to back, 2 mma.sync bursts every 2 us); out[2 b], out[2 b + 1] = cycles, ns of CTA b.
cudaError_t launch_clock_probe(cudaStream_t stream, int work, int blocks, int rounds,
                               long long* out);

}  // namespace elman
