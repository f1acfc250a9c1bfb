// Launchers of the matrix family's recurrence: the warp kernels (warp.cu) where `matrix_layout`
// takes them, the tiled kernels of recurrence.cuh where they fit (dispatch on the lane tile: row
// groups A, rows NR and columns NC a lane), else the column-group kernels (dispatch on the rows
// per thread R = n / 4); then on the compute dtype and the step functor of steps.cuh. Every
// layout writes and reads the same checkpoints, so the forward and the backward choose
// independently.
#include <cuda_bf16.h>

#include "matrix/matrix.h"
#include "matrix/recurrence.cuh"
#include "matrix/steps.cuh"

namespace elman {
namespace {

constexpr int kSizes[] = {8, 16, 24, 32, 48, 64, 96, 128};

bool in_sizes(int x) {
  for (const int s : kSizes)
    if (s == x) return true;
  return false;
}

// Shared memory the tiled kernels may take per CTA: the forward's staged chunks must fit the
// opt-in limit; the backward's automatic slots keep four CTAs an SM (a quarter of 228 KB).
constexpr int kSharedLimit = 227 * 1024;
constexpr int kBackwardBudget = 56 * 1024;

struct Tile {
  int A, NR, NC;
  int Bc() const { return 32 / A; }
  int warps(int v) const { return v / (Bc() * NC); }
};

// Row groups A = 4 up to n = 32, else 8; the widest column block NC of {4, 2, 1} with at most
// `cells` state elements a lane (32 forward; 16 backward, which holds S_t and dS) that divides v.
Tile tile_of(int n, int v, bool backward) {
  const int A = n <= 32 ? 4 : 8, NR = n / A, cells = backward ? 16 : 32;
  for (const int NC : {4, 2, 1})
    if (NR * NC <= cells && v % ((32 / A) * NC) == 0) return {A, NR, NC};
  return {A, NR, 1};
}

int tsize(const MatrixArgs& a) { return a.bf16 ? 2 : 4; }

int forward_bytes(const MatrixArgs& a) {
  return 2 * matrix::tiled::stage_layout(a.K, a.n, a.v, a.column, tsize(a), false).bytes;
}

int backward_bytes(const MatrixArgs& a, int slots) {
  const Tile t = tile_of(a.n, a.v, true);
  return matrix::tiled::backward_bytes(a.K, a.n, a.v, a.column, tsize(a), slots, t.A,
                                       t.warps(a.v) * t.Bc());
}

template <typename Kernel>
cudaError_t launch_kernel(Kernel kernel, const MatrixArgs& a, int threads, int smem) {
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  kernel<<<unsigned(a.B) * unsigned(a.H), unsigned(threads), smem, a.stream>>>(a);
  return cudaGetLastError();
}

template <typename T, class Step>
cudaError_t tiled_forward(const MatrixArgs& a) {
  const Tile t = tile_of(a.n, a.v, false);
  const int threads = 32 * t.warps(a.v), smem = forward_bytes(a);
#define ELMAN_TILE(A_, NR_, NC_)                                                                    \
  if (t.A == A_ && t.NR == NR_ && t.NC == NC_)                                                      \
    return launch_kernel(matrix::tiled::forward_kernel<A_, NR_, NC_, T, Step>, a, threads, smem);
  ELMAN_TILE(4, 2, 1) ELMAN_TILE(4, 2, 2) ELMAN_TILE(4, 2, 4)
  ELMAN_TILE(4, 4, 1) ELMAN_TILE(4, 4, 2) ELMAN_TILE(4, 4, 4)
  ELMAN_TILE(4, 6, 1) ELMAN_TILE(4, 6, 2) ELMAN_TILE(4, 6, 4)
  ELMAN_TILE(4, 8, 1) ELMAN_TILE(4, 8, 2) ELMAN_TILE(4, 8, 4)
  ELMAN_TILE(8, 6, 2) ELMAN_TILE(8, 6, 4) ELMAN_TILE(8, 8, 2) ELMAN_TILE(8, 8, 4)
#undef ELMAN_TILE
  return cudaErrorInvalidValue;
}

template <typename T, class Step>
cudaError_t tiled_backward(const MatrixArgs& args) {
  MatrixArgs a = args;
  a.slots = matrix_slots(args);
  const Tile t = tile_of(a.n, a.v, true);
  const int threads = 32 * t.warps(a.v), smem = backward_bytes(a, a.slots);
#define ELMAN_TILE(A_, NR_, NC_)                                                                    \
  if (t.A == A_ && t.NR == NR_ && t.NC == NC_)                                                      \
    return launch_kernel(matrix::tiled::backward_kernel<A_, NR_, NC_, T, Step>, a, threads, smem);
  ELMAN_TILE(4, 2, 1) ELMAN_TILE(4, 2, 2) ELMAN_TILE(4, 2, 4)
  ELMAN_TILE(4, 4, 1) ELMAN_TILE(4, 4, 2) ELMAN_TILE(4, 4, 4)
  ELMAN_TILE(4, 6, 1) ELMAN_TILE(4, 6, 2) ELMAN_TILE(4, 8, 1) ELMAN_TILE(4, 8, 2)
  ELMAN_TILE(8, 6, 2) ELMAN_TILE(8, 8, 2)
#undef ELMAN_TILE
  return cudaErrorInvalidValue;
}

template <int R, typename T, class Step>
cudaError_t launch(const MatrixArgs& a, bool backward) {
  constexpr int G = kMatrixGroup;
  const int threads = a.v * G;
  if (backward) {
    const int smem = matrix::backward_shared_bytes<R>(threads);
    if (smem > 0) {  // static + dynamic may exceed the 48 KB default
      const cudaError_t e = cudaFuncSetAttribute(matrix::backward_kernel<R, G, T, Step>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
    }
    matrix::backward_kernel<R, G, T, Step><<<unsigned(a.B) * unsigned(a.H), threads, smem, a.stream>>>(a);
  } else {
    matrix::forward_kernel<R, G, T, Step><<<unsigned(a.B) * unsigned(a.H), threads, 0, a.stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T, class Step>
cudaError_t by_rows(const MatrixArgs& a, bool backward) {
  if (matrix_layout(a, backward) == kMatrixTiled)
    return backward ? tiled_backward<T, Step>(a) : tiled_forward<T, Step>(a);
  switch (a.n / kMatrixGroup) {
    case 2: return launch<2, T, Step>(a, backward);
    case 4: return launch<4, T, Step>(a, backward);
    case 6: return launch<6, T, Step>(a, backward);
    case 8: return launch<8, T, Step>(a, backward);
    case 12: return launch<12, T, Step>(a, backward);
    case 16: return launch<16, T, Step>(a, backward);
    case 24: return launch<24, T, Step>(a, backward);
    case 32: return launch<32, T, Step>(a, backward);
    default: return cudaErrorInvalidValue;
  }
}

template <class Step>
cudaError_t by_dtype(const MatrixArgs& a, bool backward) {
  return a.bf16 ? by_rows<__nv_bfloat16, Step>(a, backward) : by_rows<float, Step>(a, backward);
}

cudaError_t run(const MatrixArgs& a, bool backward) {
  if (!matrix_supported(a.n, a.v, nullptr) || !matrix_group_ok(a.group, a.n, a.v) || a.K < 1 || a.T < 1)
    return cudaErrorInvalidValue;
  const int layout = matrix_layout(a, backward);
  if (layout == kMatrixWarp || layout == kMatrixRing) return matrix_warp_run(a, backward);
  return with_step(a.step, [&](auto step) { return by_dtype<decltype(step)>(a, backward); });
}

}  // namespace

int matrix_step_count() {
  int count = 0;
#define ELMAN_MATRIX_COUNT(id, functor, name) ++count;
  ELMAN_MATRIX_STEPS(ELMAN_MATRIX_COUNT)
#undef ELMAN_MATRIX_COUNT
  return count;
}

const char* matrix_step_name(int step) {
#define ELMAN_MATRIX_NAME(id, functor, name) \
  if (step == id) return name;
  ELMAN_MATRIX_STEPS(ELMAN_MATRIX_NAME)
#undef ELMAN_MATRIX_NAME
  return nullptr;
}

bool matrix_supported(int n, int v, const char** why) {
  if (!in_sizes(n) || !in_sizes(v)) {
    if (why) *why = "n and v must each be one of 8, 16, 24, 32, 48, 64, 96, 128";
    return false;
  }
  return true;
}

bool matrix_group_ok(int group, int n, int v) {
  if (group == 0 || group == kMatrixGroup) return true;
  if (group == kMatrixWarp || group == kMatrixRing) return matrix_warp_fits(n, v);
  if (group == kMatrixTiled) return n <= 64 && v <= 64;
  return false;
}

int matrix_layout(const MatrixArgs& a, bool backward) {
  if ((a.group == 0 || a.group == kMatrixWarp) && matrix_warp_runs(a, backward)) return kMatrixWarp;
  if (a.group == kMatrixRing && matrix_warp_runs(a, backward)) return kMatrixRing;
  if (a.group != kMatrixGroup && a.n <= 64 && a.v <= 64 &&
      (backward ? backward_bytes(a, 1) : forward_bytes(a)) <= kSharedLimit)
    return kMatrixTiled;
  return kMatrixGroup;
}

int matrix_slots(const MatrixArgs& a) {
  const int most = a.K < a.T ? a.K : a.T;
  if (a.slots > 0) {
    int s = a.slots < most ? a.slots : most;
    while (s > 1 && backward_bytes(a, s) > kSharedLimit) --s;
    return s;
  }
  int s = most;
  while (s > 1 && backward_bytes(a, s) > kBackwardBudget) --s;
  return s;
}

cudaError_t matrix_forward(const MatrixArgs& a) { return run(a, false); }
cudaError_t matrix_backward(const MatrixArgs& a) { return run(a, true); }

}  // namespace elman
