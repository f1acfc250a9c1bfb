// Gate inputs in the kernel parameters of the persistent designs, and the operands of a call
// copied into a design's parameters. A design's parameter struct
// holds the first gate input g0 and its gradient dg0; a two-gate epilogue's kernels take the
// struct extended by the second (g1, dg1), the others the struct itself (measured: appending
// fields to the one-gate struct changed the register allocation of every kernel).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "dense/zeros.cuh"

namespace elman {

template <class Base>
struct WithSecondGate : Base {
  const __nv_bfloat16* g1;
  __nv_bfloat16* dg1;
};
template <class Base, int kG>
using GateArgs = std::conditional_t<(kG > 1), WithSecondGate<Base>, Base>;

// An epilogue that reads h_{t-1} (kReadsPrev) also has the candidate plane v [T][B][D]:
// written forward, staged backward. The others keep the gate struct itself.
template <class Base>
struct WithCandidate : Base {
  __nv_bfloat16* v_all;
};
template <class Base, class Epi>
using EpiArgs = std::conditional_t<kReadsPrevOf<Epi>, WithCandidate<GateArgs<Base, Epi::kGates>>,
                                   GateArgs<Base, Epi::kGates>>;

// Gate input i and its gradient, by static indices (the pointers stay kernel parameters).
template <int kG, class A>
__device__ __forceinline__ const __nv_bfloat16* gate_input(const A& p, int i) {
  if constexpr (kG <= 1) return p.g0;
  else return i == 0 ? p.g0 : p.g1;
}
template <int kG, class A>
__device__ __forceinline__ __nv_bfloat16* gate_grad(const A& p, int i) {
  if constexpr (kG <= 1) return p.dg0;
  else return i == 0 ? p.dg0 : p.dg1;
}

// The fields both designs share, from a call's operands (a two-gate epilogue's second gate
// only where the parameters have it).
template <int kG, class A>
void set_forward(A& a, const DenseForward& f) {
  a.steps = f.steps; a.batch = f.batch;
  a.w = static_cast<const __nv_bfloat16*>(f.w_h);
  a.b = bias_or_zeros(f.b);
  a.wx = static_cast<const __nv_bfloat16*>(f.wx);
  a.g0 = static_cast<const __nv_bfloat16*>(f.gates[0]);
  if constexpr (kG > 1) a.g1 = static_cast<const __nv_bfloat16*>(f.gates[1]);
  a.h0 = static_cast<const __nv_bfloat16*>(f.h0);
  a.out = static_cast<__nv_bfloat16*>(f.out);
  a.h_all = static_cast<__nv_bfloat16*>(f.h_all);
}
template <int kG, class A>
void set_backward(A& a, const DenseBackward& g) {
  a.steps = g.steps; a.batch = g.batch;
  a.w = static_cast<const __nv_bfloat16*>(g.w_h);
  a.g0 = static_cast<const __nv_bfloat16*>(g.gates[0]);
  a.dg0 = static_cast<__nv_bfloat16*>(g.d_gates[0]);
  if constexpr (kG > 1) {
    a.g1 = static_cast<const __nv_bfloat16*>(g.gates[1]);
    a.dg1 = static_cast<__nv_bfloat16*>(g.d_gates[1]);
  }
  a.h_all = static_cast<__nv_bfloat16*>(const_cast<void*>(g.h_all));
  a.d_out = static_cast<const __nv_bfloat16*>(g.d_out);
  a.d_hT = static_cast<const __nv_bfloat16*>(g.d_hT);
  a.dv = static_cast<__nv_bfloat16*>(g.dv);
  a.dh0 = static_cast<__nv_bfloat16*>(g.dh0);
}
template <class Epi, class A>
void set_candidate(A& a, const void* v_all) {
  if constexpr (kReadsPrevOf<Epi>) a.v_all = static_cast<__nv_bfloat16*>(const_cast<void*>(v_all));
}

}  // namespace elman
