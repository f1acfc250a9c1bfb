// The per-step kernels for every epilogue of the table (steps.cuh), and the table as the
// binding sees it (ids, names, gate counts).
#include <cuda_bf16.h>

#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "dense/steps.cuh"

namespace elman {
namespace {

template <class List>
struct Info;
template <template <bool> class... E>
struct Info<EpilogueList<E...>> {
  static constexpr int kCount = sizeof...(E);
  static constexpr EpilogueInfo kAll[kCount > 0 ? kCount : 1] = {
      {E<false>::kId, E<false>::kName, E<false>::kGates}...};
};
using Table = Info<DenseEpilogues>;

}  // namespace

int dense_epilogue_count() { return Table::kCount; }
EpilogueInfo dense_epilogue_info(int index) { return Table::kAll[index]; }
int dense_epilogue_gates(int id) {
  for (int i = 0; i < Table::kCount; ++i)
    if (Table::kAll[i].id == id) return Table::kAll[i].gates;
  return -1;
}
bool dense_epilogue_reads_prev(int id) {
  bool reads = false;
  with_epilogue<false, DenseEpilogues>(id, [&](auto e) { reads = kReadsPrevOf<decltype(e)>; });
  return reads;
}

template <typename T>
cudaError_t dense_step_forward(cudaStream_t stream, int epilogue, int n, int dim, int splits,
                               const float* acc, const T* wx, StepGates<T> gates, const T* b,
                               T* h, T* out) {
  cudaError_t err = cudaErrorInvalidValue;
  with_epilogue<false, DenseEpilogues>(epilogue, [&](auto e) {
    if constexpr (!kReadsPrevOf<decltype(e)>)  // those run on the persistent path only
      err = steps_design::forward<T, decltype(e)>(stream, n, dim, splits, acc, wx, gates, b, h, out);
  });
  return err;
}

template <typename T>
cudaError_t dense_step_backward(cudaStream_t stream, int epilogue, int n, int splits,
                                const float* acc32, const T* accT, const T* d_out, const T* h,
                                StepGates<T> gates, T* dv, StepGateGrads<T> d_gates) {
  cudaError_t err = cudaErrorInvalidValue;
  with_epilogue<false, DenseEpilogues>(epilogue, [&](auto e) {
    if constexpr (!kReadsPrevOf<decltype(e)>)
      err = steps_design::backward<T, decltype(e)>(stream, n, splits, acc32, accT, d_out, h, gates,
                                                   dv, d_gates);
  });
  return err;
}

#define INSTANTIATE(T)                                                                        \
  template cudaError_t dense_step_forward<T>(cudaStream_t, int, int, int, int, const float*, \
                                             const T*, StepGates<T>, const T*, T*, T*);       \
  template cudaError_t dense_step_backward<T>(cudaStream_t, int, int, int, const float*,     \
                                              const T*, const T*, const T*, StepGates<T>, T*, \
                                              StepGateGrads<T>);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
#undef INSTANTIATE

}  // namespace elman
