// Plain C++ declarations of the diagonal-family launchers (no torch headers: nvcc alone
// compiles the .cu files). Tensors are time-major and contiguous; a step is the flattened
// [B * D] slice (n = B * D elements, channel d = element % D):
//   inputs[i], out, d_out, d_inputs[i] : [T, B, D]    h_all : [T + 1, B, D] (h_all[0] = h0)
//   h0, d_hT, dh0 : [B, D]    params[j] : [D] fp32    d_params : [kParams, B, D] fp32
// `step` is an id of the table in steps.cuh; it takes kInputs inputs and kParams params.
// Every launcher returns a CUDA error code (cudaErrorInvalidValue for an unknown step or a
// width `vec` it cannot take, before any launch) and checks the launch; the binding validates
// shapes, dtypes and sizes first. `vec` 0 lets the launcher choose the elements per thread;
// 1, 2, 4 or 8 forces that width (it must divide B * D, fit in 16 bytes and suit every
// pointer's alignment): for measuring the widths against each other.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace elman {

constexpr int kMaxInputs = 3;  // per-step [T, B, D] inputs a step may take
constexpr int kMaxParams = 2;  // per-channel [D] vectors a step may take

struct StepInfo {
  int id;
  const char* name;
  int inputs;
  int params;
};
int diagonal_step_count();
StepInfo diagonal_step_info(int index);  // index in [0, diagonal_step_count())
StepInfo diagonal_step_of(int id);       // id -1: no step has this id

struct DiagonalForward {
  cudaStream_t stream = nullptr;
  bool bf16 = false;  // element type: __nv_bfloat16 or float
  int steps = 0, batch = 0, dim = 0;
  int vec = 0;
  const void* inputs[kMaxInputs] = {};
  const float* params[kMaxParams] = {};
  const void* h0 = nullptr;
  void* out = nullptr;
  void* h_all = nullptr;
};

struct DiagonalBackward {
  cudaStream_t stream = nullptr;
  bool bf16 = false;
  int steps = 0, batch = 0, dim = 0;
  int vec = 0;
  const void* inputs[kMaxInputs] = {};
  const float* params[kMaxParams] = {};
  const void* h_all = nullptr;
  const void* d_out = nullptr;
  const void* d_hT = nullptr;
  void* d_inputs[kMaxInputs] = {};
  void* dh0 = nullptr;
  float* d_params = nullptr;  // [kParams, B, D]: per-sequence partial sums over T
};

// The elements per thread (1, 2, 4 or 8: at most 16 bytes), threads per block and blocks of
// this call's launch (vec 0: no step has this id, or the forced width is not allowed).
struct ScanPlan {
  int vec;
  int threads;
  int blocks;
};
ScanPlan diagonal_plan(int step, const DiagonalForward& a);
ScanPlan diagonal_plan(int step, const DiagonalBackward& a);

cudaError_t diagonal_forward(int step, const DiagonalForward& a);
cudaError_t diagonal_backward(int step, const DiagonalBackward& a);

}  // namespace elman
