// Launchers of the matrix family's recurrence (recurrence.cuh): dispatch on the threads per
// column G (the caller's, or matrix_group(v)), the rows per thread R = n / G, the compute dtype
// and the step functor of steps.cuh.
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

template <int R, int G, typename T, class Step>
cudaError_t launch(const MatrixArgs& a, bool backward) {
  const dim3 grid(unsigned(a.B) * unsigned(a.H)), block(unsigned(a.v) * G);
  if (backward) {
    const int smem = matrix::backward_shared_bytes<R>(int(block.x));
    if (smem > 0) {  // static + dynamic may exceed the 48 KB default
      const cudaError_t e = cudaFuncSetAttribute(matrix::backward_kernel<R, G, T, Step>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
    }
    matrix::backward_kernel<R, G, T, Step><<<grid, block, smem, a.stream>>>(a);
  } else {
    matrix::forward_kernel<R, G, T, Step><<<grid, block, 0, a.stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T, class Step>
cudaError_t by_rows(const MatrixArgs& a, bool backward) {
  if ((a.group ? a.group : matrix_group(a.v)) == 8) {
    switch (a.n / 8) {
      case 1: return launch<1, 8, T, Step>(a, backward);
      case 2: return launch<2, 8, T, Step>(a, backward);
      case 3: return launch<3, 8, T, Step>(a, backward);
      case 4: return launch<4, 8, T, Step>(a, backward);
      case 6: return launch<6, 8, T, Step>(a, backward);
      case 8: return launch<8, 8, T, Step>(a, backward);
      case 12: return launch<12, 8, T, Step>(a, backward);
      case 16: return launch<16, 8, T, Step>(a, backward);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (a.n / 4) {
    case 2: return launch<2, 4, T, Step>(a, backward);
    case 4: return launch<4, 4, T, Step>(a, backward);
    case 6: return launch<6, 4, T, Step>(a, backward);
    case 8: return launch<8, 4, T, Step>(a, backward);
    case 12: return launch<12, 4, T, Step>(a, backward);
    case 16: return launch<16, 4, T, Step>(a, backward);
    case 24: return launch<24, 4, T, Step>(a, backward);
    case 32: return launch<32, 4, T, Step>(a, backward);
    default: return cudaErrorInvalidValue;
  }
}

template <class Step>
cudaError_t by_dtype(const MatrixArgs& a, bool backward) {
  return a.bf16 ? by_rows<__nv_bfloat16, Step>(a, backward) : by_rows<float, Step>(a, backward);
}

cudaError_t run(const MatrixArgs& a, bool backward) {
  if (!matrix_supported(a.n, a.v, nullptr) || !matrix_group_ok(a.group, a.v) || a.K < 1 || a.T < 1)
    return cudaErrorInvalidValue;
#define ELMAN_MATRIX_CASE(id, functor, name) \
  case id: return by_dtype<functor>(a, backward);
  switch (a.step) {
    ELMAN_MATRIX_STEPS(ELMAN_MATRIX_CASE)
    default: return cudaErrorInvalidValue;
  }
#undef ELMAN_MATRIX_CASE
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

cudaError_t matrix_forward(const MatrixArgs& a) { return run(a, false); }
cudaError_t matrix_backward(const MatrixArgs& a) { return run(a, true); }

}  // namespace elman
