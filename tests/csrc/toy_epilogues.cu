// Compile-only proof that the dense skeleton is generic over its epilogue table: two toy
// epilogues, with no gate input and with two, instantiate every path's kernels (cluster and
// grid persistent designs, forward and backward; the per-step kernels in fp32 and bf16)
// through the same dispatch the production table uses. tests/test_kernels_compile.py
// compiles this file for sm_90a and requires no register spills.
#include <cuda_bf16.h>

#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "dense/grid.cuh"
#include "dense/persistent.cuh"
#include "dense/steps.cuh"

namespace toy {

using elman::Gates;

// h = tanh(v), out = h: no gate input.
template <bool kApprox>
struct NoGate {
  static constexpr int kId = 100;
  static constexpr const char* kName = "toy_no_gate";
  static constexpr int kGates = 0;
  struct Pre {};
  __device__ __forceinline__ static Pre prepare(const Gates<NoGate>&) { return {}; }
  __device__ __forceinline__ static float act(float v) {
    return kApprox ? elman::tanh_approx(v) : tanhf(v);
  }
  __device__ __forceinline__ static float output(float h, const Pre&) { return h; }
  __device__ __forceinline__ static void backward_parts(float d_out, float h, const Gates<NoGate>&,
                                                        float& c, float& f, Gates<NoGate>&) {
    c = d_out;
    f = 1.f - h * h;
  }
};

// h = tanh(v), out = h * sigmoid(a) + b: two gate inputs a, b.
template <bool kApprox>
struct TwoGates {
  static constexpr int kId = 101;
  static constexpr const char* kName = "toy_two_gates";
  static constexpr int kGates = 2;
  struct Pre {
    float s, b;
  };
  __device__ __forceinline__ static Pre prepare(const Gates<TwoGates>& g) {
    return {elman::sigmoidf(g[0]), g[1]};
  }
  __device__ __forceinline__ static float act(float v) {
    return kApprox ? elman::tanh_approx(v) : tanhf(v);
  }
  __device__ __forceinline__ static float output(float h, const Pre& pre) {
    return fmaf(h, pre.s, pre.b);
  }
  __device__ __forceinline__ static void backward_parts(float d_out, float h,
                                                        const Gates<TwoGates>& g, float& c,
                                                        float& f, Gates<TwoGates>& dg) {
    const float s = elman::sigmoidf(g[0]);
    c = d_out * s;
    f = 1.f - h * h;
    dg[0] = d_out * h * s * (1.f - s);
    dg[1] = d_out;
  }
};

using Table = elman::EpilogueList<NoGate, TwoGates>;
static_assert(elman::Dispatch<true, Table>::unique(), "toy ids are unique");

}  // namespace toy

// Every path of every toy epilogue, through the table's dispatch (host code: instantiates the
// kernels; never run).
cudaError_t toy_paths(int id, const elman::DenseForward& f, const elman::DenseBackward& b) {
  using namespace elman;
  cudaError_t err = cudaErrorInvalidValue;
  with_epilogue<true, toy::Table>(id, [&](auto e) {
    using E = decltype(e);
    for (int dim : {256, 512, 768, 1024}) {
      const PersistentPlan pf = cluster_design::make_plan<E>(f.batch, dim, false);
      const PersistentPlan pb = cluster_design::make_plan<E>(b.batch, dim, true);
      err = cluster_design::forward<E>(pf, f, nullptr);
      err = cluster_design::backward<E>(pb, b);
    }
    const PersistentPlan gf = grid_design::make_plan<E>(f.batch, 2048, false);
    const PersistentPlan gb = grid_design::make_plan<E>(b.batch, 2048, true);
    err = grid_design::forward<E>(gf, f, nullptr);
    err = grid_design::backward<E>(gb, b);
  });
  with_epilogue<false, toy::Table>(id, [&](auto e) {
    using E = decltype(e);
    StepGates<float> g32 = {};
    StepGateGrads<float> dg32 = {};
    StepGates<__nv_bfloat16> g16 = {};
    StepGateGrads<__nv_bfloat16> dg16 = {};
    err = steps_design::forward<float, E>(f.stream, 1, 1, 1, nullptr, nullptr, g32, nullptr,
                                          nullptr, nullptr);
    err = steps_design::backward<float, E>(f.stream, 1, 1, nullptr, nullptr, nullptr, nullptr,
                                           g32, nullptr, dg32);
    err = steps_design::forward<__nv_bfloat16, E>(f.stream, 1, 1, 1, nullptr, nullptr, g16,
                                                  nullptr, nullptr, nullptr);
    err = steps_design::backward<__nv_bfloat16, E>(f.stream, 1, 1, nullptr, nullptr, nullptr,
                                                   nullptr, g16, nullptr, dg16);
  });
  return err;
}
