// Plain C++ declarations of the dense-family launchers (no torch headers: nvcc alone
// compiles the .cu files). Tensors are time-major and contiguous:
//   wx, gates[i], out, d_out, dv, d_gates[i] : [T, B, D]     h_all : [T + 1, B, D] (h_all[0] = h0)
//   w_h : [D, D] row-major (out x in)   b : [D] or null (no bias)   h0, d_hT, dh0 : [B, D]
// `epilogue` is an id of the table in epilogues.cuh; it takes kGates gate inputs (gates[0 ..
// kGates - 1]; the others are ignored). Every launcher returns a CUDA error code
// (cudaSuccess on success; cudaErrorInvalidValue for an unknown epilogue, before any launch)
// and checks the last launch error; the binding validates shapes, dtypes and sizes first.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

struct cublasContext;  // the same declaration as cublas_v2.h, which the .cu files do not need
typedef struct cublasContext* cublasHandle_t;

namespace elman {

constexpr int kMaxGates = 2;  // gate inputs an epilogue may take besides wx

// ---- the epilogue table, as the binding sees it --------------------------------------
struct EpilogueInfo {
  int id;
  const char* name;
  int gates;
};
int dense_epilogue_count();
EpilogueInfo dense_epilogue_info(int index);  // index in [0, dense_epilogue_count())
int dense_epilogue_gates(int id);             // -1: no epilogue has this id
// Whether epilogue `id` reads h_{t-1} (kReadsPrev: E63; persistent path only, with v_all).
bool dense_epilogue_reads_prev(int id);

// ---- one call's operands -------------------------------------------------------------
// Element type: bf16 on the persistent path; float or __nv_bfloat16 (the launcher's T) on
// the per-step path. `xchg` is the persistent path's workspace (plan.xchg_bytes, contents
// need no initialisation).
struct DenseForward {
  cudaStream_t stream = nullptr;
  int steps = 0, batch = 0, dim = 0;
  const void* wx = nullptr;
  const void* gates[kMaxGates] = {};
  const void* w_h = nullptr;
  const void* b = nullptr;
  const void* h0 = nullptr;
  void* out = nullptr;
  void* h_all = nullptr;
  void* v_all = nullptr;  // kReadsPrev epilogues: the candidate v [T, B, D] (persistent only)
  void* xchg = nullptr;
};
struct DenseBackward {
  cudaStream_t stream = nullptr;
  int steps = 0, batch = 0, dim = 0;
  const void* w_h = nullptr;
  const void* h_all = nullptr;
  const void* gates[kMaxGates] = {};
  const void* d_out = nullptr;
  const void* d_hT = nullptr;
  void* dv = nullptr;
  void* d_gates[kMaxGates] = {};
  void* dh0 = nullptr;
  const void* v_all = nullptr;  // kReadsPrev epilogues: the forward's candidate v [T, B, D]
  void* xchg = nullptr;
};

// ---- per-step path (steps.cpp + steps.cu): one cuBLAS GEMM and one fused step per step -
// The GEMM's inner dimension is split into this many batched GEMMs (D >= 2048: D / 512);
// the workspace `ws` of the launchers below holds splits * B * D floats.
int dense_steps_splits(int dim);

// Gate pointers of one step (offset by the caller).
template <typename T>
struct StepGates {
  const T* p[kMaxGates];
};
template <typename T>
struct StepGateGrads {
  T* p[kMaxGates];
};
// One step's fused elementwise work. forward: h, out from acc = W_h h_{t-1} (fp32: the sum
// of `splits` partial products at acc + s * n), wx, the gates and b, for n = B * D elements.
// backward: dv, d_gates from the recurrent gradient (acc32 in fp32, `splits` partials as in
// forward, or accT = d_hT at the last step), d_out, h_t and the gates.
template <typename T>
cudaError_t dense_step_forward(cudaStream_t stream, int epilogue, int n, int dim, int splits,
                               const float* acc, const T* wx, StepGates<T> gates, const T* b,
                               T* h, T* out);
template <typename T>
cudaError_t dense_step_backward(cudaStream_t stream, int epilogue, int n, int splits,
                                const float* acc32, const T* accT, const T* d_out, const T* h,
                                StepGates<T> gates, T* dv, StepGateGrads<T> d_gates);

// T is float or __nv_bfloat16; the handle must be bound to the call's stream (torch's handle
// for the current stream is; its workspace also makes the loop capturable in a CUDA graph).
template <typename T>
cudaError_t dense_steps_forward(cublasHandle_t handle, int epilogue, const DenseForward& a,
                                float* ws);
template <typename T>
cudaError_t dense_steps_backward(cublasHandle_t handle, int epilogue, const DenseBackward& a,
                                 float* ws);

// ---- persistent path (bf16, sm_90): W_h lives on chip for the whole sequence -----------
// Three designs: "cluster" (D = 256, 512, 768, 1024; persistent.cuh): one thread-block cluster
// holds W_h in registers and owns `bc` batch columns; "wide" (D = 1280; wide.cuh): a 16-CTA
// cluster per 8 batch columns holds W_h in registers and shared memory; "grid" (the other
// multiples of 128 up to 2048;
// grid.cuh): 4 D / 64 CTAs without clusters hold 64 x 512 tiles (zero-padded beyond D) and
// exchange state and partial sums through L2 (B <= 64).
struct PersistentPlan {
  bool ok = false;
  const char* reason = "";
  const char* design = "cluster";
  int cluster = 0;     // CTAs per cluster (1 in the grid design)
  int clusters = 0;    // clusters launched (grid: CTAs of one launch)
  int bc = 0;          // batch columns per cluster (cluster: 8 or 16; wide: 8, forward 8 or 12;
                       // grid: 8 to 64)
  int smem = 0;        // dynamic shared memory per CTA, bytes
  int max_active = 0;  // clusters (grid: CTAs) of this shape the GPU can hold at once
  size_t xchg_bytes = 0;  // global workspace of the exchange (the launcher's `xchg`)
};

// The plan of the design that takes D (cluster, wide, else grid) for this epilogue; `traced`:
// for the traced forward (development build), which the wide design runs at 8 columns only.
PersistentPlan dense_persistent_plan(int epilogue, int batch, int dim, bool backward,
                                     bool traced = false);

cudaError_t dense_persistent_forward(int epilogue, const DenseForward& a);
cudaError_t dense_persistent_backward(int epilogue, const DenseBackward& a);

// The traced forward (builds with ELMAN_TRACE only, the development extension): `trace` is
// int64 [steps * 6 + 4]; CTA 0 records clock64 at six phase boundaries of every step, then
// clock64 and %globaltimer at kernel start and end.
cudaError_t dense_persistent_forward_traced(int epilogue, const DenseForward& a,
                                            long long* trace);

}  // namespace elman
