// The matrix family's plain C++ interface (no torch headers): the arguments of one recurrence
// call and the launchers of recurrence.cu. The binding (binding.cpp) fills them after it has
// validated every tensor.
#pragma once

#include <cuda_runtime.h>

namespace elman {

// Per head a key-first state S [n, v]; tensors are dense, time-major:
//   q, k [T, B, H, n], v, o, d_o [T, B, H, v] of the compute dtype (float or bf16);
//   decay [T, B, H] (column == false) or [T, B, H, v] (column == true), beta [T, B, H] or null,
//   h0, S_T, dh0, d_ST [B, H, n, v], ckpt [ceil(T / K), B, H, n, v], all float32;
//   scratch [B * H, min(K, T) + 1, n, v] float32 (backward: the chunk's recomputed states).
struct MatrixArgs {
  int T = 0, B = 0, H = 0, n = 0, v = 0, K = 16;
  int step = 0;          // index into the step table (steps.cuh)
  int group = 0;         // the layout (below: 0 the fastest that runs, 1 warp, 2 tiled, 3 ring, 4 columns)
  int slots = 0;         // backward: states kept on chip per sub-chunk (0: the most that fit)
  bool column = false;
  bool bf16 = false;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v_in = nullptr;
  const float* decay = nullptr;
  const float* beta = nullptr;
  const float* h0 = nullptr;
  void* o = nullptr;
  float* S_T = nullptr;
  float* ckpt = nullptr;
  const void* d_o = nullptr;
  const float* d_ST = nullptr;
  float* scratch = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* d_decay = nullptr;
  float* d_beta = nullptr;
  float* dh0 = nullptr;
  cudaStream_t stream = nullptr;
};

// Three kernel layouts: the warp kernels (warp.cuh: one warp a head, square n = v <= 32), the
// tiled kernels (recurrence.cuh: a warp owns whole state columns, several warps a head; n, v <= 64
// and the staged chunk within shared memory) and the column-group kernels (4 threads a value
// column, n / 4 rows each; every supported size). `group` picks: 0 the first that runs of warp,
// tiled, column groups; 1 (kMatrixWarp) the warp kernels where they run, else as 0; 2
// (kMatrixTiled) the tiled kernels where they fit, else the column groups; 3 (kMatrixRing) the
// warp kernels fed by a cp.async ring of input rows several steps ahead (same arithmetic, same
// results) where they run, else as 1; 4 the column groups.
// The tests and the benchmark compare them. All write and read the same checkpoints, so the
// forward and the backward choose independently.
constexpr int kMatrixThreads = 512;
constexpr int kMatrixGroup = 4;
constexpr int kMatrixWarp = 1;
constexpr int kMatrixTiled = 2;
constexpr int kMatrixRing = 3;
// Threads per value column of the gated kernels (gated.cu): 8 up to v = 64, else 4.
constexpr int matrix_group(int v) { return v <= 64 ? 8 : 4; }
// Whether `group` is a layout the op takes at (n, v) (1 and 3 need the warp kernels' sizes, 2 n,
// v <= 64).
bool matrix_group_ok(int group, int n, int v);
// The layout that runs this call (forward or backward): kMatrixWarp, kMatrixRing, kMatrixTiled or
// kMatrixGroup.
int matrix_layout(const MatrixArgs& a, bool backward);
// The tiled backward's slots.
int matrix_slots(const MatrixArgs& a);
// The warp kernels (warp.cu): the sizes they take, whether they run this call (sizes and 16-byte
// aligned tensors), and their launcher.
bool matrix_warp_fits(int n, int v);
bool matrix_warp_runs(const MatrixArgs& a, bool backward);
cudaError_t matrix_warp_run(const MatrixArgs& a, bool backward);

int matrix_step_count();
const char* matrix_step_name(int step);
// Whether the kernels take this (n, v); `why` says what is wrong otherwise.
bool matrix_supported(int n, int v, const char** why);
cudaError_t matrix_forward(const MatrixArgs& a);
cudaError_t matrix_backward(const MatrixArgs& a);

}  // namespace elman
