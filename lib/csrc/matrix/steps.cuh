// The step table of the matrix family: the nonlinearity applied to the pre-activation state
// P = decay * S + beta * k (v - S^T k)^T, and its derivative expressed through the new state.
// A new matrix-state variant with another elementwise state map adds a functor and one line of
// ELMAN_MATRIX_STEPS; the kernels of recurrence.cuh are instantiated for every entry.
#pragma once

#include <cuda_runtime.h>

#include "common/math.cuh"

namespace elman {

// act<kApprox>: the kernels pass kApprox = true when they compute for bf16 tensors, whose parity
// tolerance the approximation's error is far inside; fp32 gets the accurate function.
struct TanhStep {
  // tanh.approx (one MUFU op) costs a fraction of tanhf's instruction sequence, but its 2^-11
  // relative error would exceed the fp32 parity tolerance after a few hundred steps.
  template <bool kApprox>
  static __device__ __forceinline__ float act(float p) {
    if constexpr (kApprox) return tanh_approx(p);
    else return tanhf(p);
  }
  static __device__ __forceinline__ float grad(float s) { return 1.f - s * s; }
};

struct LinearStep {
  template <bool kApprox>
  static __device__ __forceinline__ float act(float p) { return p; }
  static __device__ __forceinline__ float grad(float) { return 1.f; }
};

// X(id, functor, name): ids are the indices the Python side passes (reference.STEPS order).
#define ELMAN_MATRIX_STEPS(X) \
  X(0, TanhStep, "tanh")      \
  X(1, LinearStep, "linear")

// f(Functor{}) for the functor of step id `step`; cudaErrorInvalidValue for an unknown id.
template <class F>
cudaError_t with_step(int step, F&& f) {
#define ELMAN_MATRIX_CASE(id, functor, name) \
  case id: return f(functor{});
  switch (step) {
    ELMAN_MATRIX_STEPS(ELMAN_MATRIX_CASE)
    default: return cudaErrorInvalidValue;
  }
#undef ELMAN_MATRIX_CASE
}

}  // namespace elman
