// The step table of the matrix family: the nonlinearity applied to the pre-activation state
// P = decay * S + beta * k (v - S^T k)^T, and its derivative expressed through the new state.
// A new matrix-state variant with another elementwise state map adds a functor and one line of
// ELMAN_MATRIX_STEPS; the kernels of recurrence.cuh are instantiated for every entry.
#pragma once

namespace elman {

struct TanhStep {
  // tanhf, not tanh.approx: the approximation's 2^-11 relative error would exceed the fp32
  // parity tolerance after a few hundred steps.
  static __device__ __forceinline__ float act(float p) { return tanhf(p); }
  static __device__ __forceinline__ float grad(float s) { return 1.f - s * s; }
};

struct LinearStep {
  static __device__ __forceinline__ float act(float p) { return p; }
  static __device__ __forceinline__ float grad(float) { return 1.f; }
};

// X(id, functor, name): ids are the indices the Python side passes (reference.STEPS order).
#define ELMAN_MATRIX_STEPS(X) \
  X(0, TanhStep, "tanh")      \
  X(1, LinearStep, "linear")

}  // namespace elman
