// The persistent path's entry points: one of three designs (persistent.cuh: one cluster per
// batch group at D = 256, 512, 768, 1024; wide.cuh: a 16-CTA cluster per 8 batch columns (the
// forward per 12 where that takes fewer waves) with part of W_h in shared memory at D = 1280;
// grid.cuh: 4 D / 64 CTAs at the other multiples of 128 up to 2048) for every epilogue of the
// table. The supported sizes are stated once more in lib/elman/families/dense/op.py
// (`persistent_size`), which a GPU test checks against these plans.
// The traced forward is compiled only with ELMAN_TRACE (the development extension): in the
// production build its marks and its instantiation do not exist.
#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "dense/grid.cuh"
#include "dense/persistent.cuh"
#include "dense/wide.cuh"

namespace elman {

PersistentPlan dense_persistent_plan(int epilogue, int batch, int dim, bool backward, bool traced) {
  PersistentPlan plan;
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major < 9) { plan.reason = "needs compute capability 9.0+ (sm_90)"; return plan; }
  const bool known = with_epilogue<true, DenseEpilogues>(epilogue, [&](auto e) {
    using E = decltype(e);
    plan = dim % 256 == 0 && dim <= 1024 ? cluster_design::make_plan<E>(batch, dim, backward)
           : wide_design::takes(dim)     ? wide_design::make_plan<E>(batch, dim, backward, traced)
                                         : grid_design::make_plan<E>(batch, dim, backward);
  });
  if (!known) plan.reason = "unknown dense epilogue id";
  return plan;
}

namespace {

cudaError_t forward(int epilogue, const DenseForward& a, long long* trace) {
  const PersistentPlan plan = dense_persistent_plan(epilogue, a.batch, a.dim, false, trace != nullptr);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  cudaError_t err = cudaErrorInvalidValue;
  with_epilogue<true, DenseEpilogues>(epilogue, [&](auto e) {
    using E = decltype(e);
    err = plan.cluster == 1            ? grid_design::forward<E>(plan, a, trace)
          : wide_design::takes(a.dim) ? wide_design::forward<E>(plan, a, trace)
                                      : cluster_design::forward<E>(plan, a, trace);
  });
  return err;
}

}  // namespace

cudaError_t dense_persistent_forward(int epilogue, const DenseForward& a) {
  return forward(epilogue, a, nullptr);
}

#ifdef ELMAN_TRACE
cudaError_t dense_persistent_forward_traced(int epilogue, const DenseForward& a,
                                            long long* trace) {
  return forward(epilogue, a, trace);
}
#endif

cudaError_t dense_persistent_backward(int epilogue, const DenseBackward& a) {
  const PersistentPlan plan = dense_persistent_plan(epilogue, a.batch, a.dim, true);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  cudaError_t err = cudaErrorInvalidValue;
  with_epilogue<true, DenseEpilogues>(epilogue, [&](auto e) {
    using E = decltype(e);
    err = plan.cluster == 1            ? grid_design::backward<E>(plan, a)
          : wide_design::takes(a.dim) ? wide_design::backward<E>(plan, a)
                                      : cluster_design::backward<E>(plan, a);
  });
  return err;
}

}  // namespace elman
