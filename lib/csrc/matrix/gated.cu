// Launchers of the gated recurrence (gated.cuh): dispatch on the threads per column G
// (matrix_group(v): 8 up to v = 64, else 4), the rows per thread R = n / G and the compute
// dtype.
#include <cuda_bf16.h>

#include "matrix/gated.cuh"
#include "matrix/gated.h"
#include "matrix/matrix.h"

namespace elman {
namespace {

constexpr int kGatedSizes[] = {8, 16, 32, 48, 64, 96, 128};

bool in_gated_sizes(int x) {
  for (const int s : kGatedSizes)
    if (s == x) return true;
  return false;
}

template <int R, int G, typename T>
cudaError_t launch(const GatedArgs& a, bool backward) {
  const dim3 grid(unsigned(a.B) * unsigned(a.H)), block(unsigned(a.v) * G);
  if (backward) {
    const int smem = gated::backward_shared_bytes<R>(int(block.x));
    if (smem > 0) {  // beyond the 48 KB default
      const cudaError_t e = cudaFuncSetAttribute(gated::backward_kernel<R, G, T>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
    }
    gated::backward_kernel<R, G, T><<<grid, block, smem, a.stream>>>(a);
  } else {
    gated::forward_kernel<R, G, T><<<grid, block, 0, a.stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t by_rows(const GatedArgs& a, bool backward) {
  if (matrix_group(a.v) == 8) {
    switch (a.n / 8) {
      case 1: return launch<1, 8, T>(a, backward);
      case 2: return launch<2, 8, T>(a, backward);
      case 4: return launch<4, 8, T>(a, backward);
      case 6: return launch<6, 8, T>(a, backward);
      case 8: return launch<8, 8, T>(a, backward);
      case 12: return launch<12, 8, T>(a, backward);
      case 16: return launch<16, 8, T>(a, backward);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (a.n / 4) {
    case 2: return launch<2, 4, T>(a, backward);
    case 4: return launch<4, 4, T>(a, backward);
    case 8: return launch<8, 4, T>(a, backward);
    case 12: return launch<12, 4, T>(a, backward);
    case 16: return launch<16, 4, T>(a, backward);
    case 24: return launch<24, 4, T>(a, backward);
    case 32: return launch<32, 4, T>(a, backward);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t run(const GatedArgs& a, bool backward) {
  if (!gated_supported(a.n, a.v, nullptr) || a.K < 1 || a.T < 1 || a.rule < 0 ||
      a.rule >= kGatedRules || a.step < 0 || a.step > 1)
    return cudaErrorInvalidValue;
  return a.bf16 ? by_rows<__nv_bfloat16>(a, backward) : by_rows<float>(a, backward);
}

}  // namespace

bool gated_supported(int n, int v, const char** why) {
  if (!in_gated_sizes(n) || !in_gated_sizes(v)) {
    if (why) *why = "n and v must each be one of 8, 16, 32, 48, 64, 96, 128";
    return false;
  }
  return true;
}

cudaError_t gated_forward(const GatedArgs& a) { return run(a, false); }
cudaError_t gated_backward(const GatedArgs& a) { return run(a, true); }

}  // namespace elman
