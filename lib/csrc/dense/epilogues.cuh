// The dense family's per-step elementwise math (the "epilogue") and THE table of epilogues
// that every dense path dispatches through: the cluster and grid persistent kernels
// (persistent.cuh, grid.cuh), forward and backward, and the per-step kernels (steps.cu,
// which the CUDA graph path replays). Adding a dense variant = one struct below + one entry
// in DenseEpilogues; ids are read by Python from the extension (`epilogues()`).
//
// A dense cell computes, per element of a [B, D] step, with kGates gate inputs g_1..g_k
// ([T, B, D] each, besides wx):
//   forward : v = acc + wx + b;  h = act(v);  out = gate(h, g)
//   backward: dh = acc + d_out * dout/dh;  dv = dh * act'(v);  dg_i = d_out * dout/dg_i
// where acc is W_h h_{t-1} (forward) or W_h^T dv_{t+1} (backward). The kernels own the
// sums (acc, wx and b, in their own order) and split the epilogue around the product, so
// that everything that does not depend on it is computed while the state is in flight:
//   forward : pre = prepare(g)                  (before the product)
//             h = act(v), out = output(h, pre)   (after it)
//   backward: backward_parts(d_out, h, g) -> c = d_out * dout/dh, f = act'(v) (from the
//             stored h), dg                      (before the product's sum)
//             dv = (acc + c) * f                 (the kernel, after it)
// An epilogue is a class template over kApprox: the bf16 persistent kernels instantiate it
// with kApprox = true (hardware tanh.approx where its error is below bf16's rounding), the
// per-step kernels (fp32 and bf16) with false.
//
// Required members: kId (unique, >= 0), kName, kGates (0, 1 or 2), struct Pre, prepare, act,
// output, backward_parts with the signatures of TanhSiluGate below. `Gates<E>` is the
// per-element array of gate values (one element when kGates = 0, unused).
//
// Hook for a variant whose epilogue reads h_{t-1} elementwise and carries a direct gradient
// term to the previous step (E63: h_t = f(v_t, h_{t-1}, g_t)):
//   - forward: in both persistent designs the thread that finishes element (n, r) of h_t
//     is the one that finished (n, r) of h_{t-1} (out_n/out_r in persistent.cuh, sub_j in
//     grid.cuh do not depend on t), so h_{t-1}(n, r) stays in a register across the step:
//     add `static constexpr bool kReadsPrev`, pass the previous hb[k] (fp32) to act, and
//     seed it from h0 in the prologue; steps.cu reads h_all[t] at the same index.
//   - backward: dh_{t-1} = W_h^T dv_t + d(direct)_t; the direct term of element (n, r) is
//     produced by the same thread at step t and consumed at step t - 1, so it is carried
//     in a register too (backward_parts gains `float& carry_out`, the kernel adds the
//     carried value to acc before finishing, and the final dh0 = acc + carry). h_{t-1} is
//     one more staged backward input (h_all[t], beside h_t = h_all[t + 1]).
//   Neither changes the exchange, the multiply or the schedule.
#pragma once

#include <cuda_bf16.h>

#include "common/math.cuh"

namespace elman {

template <class E>
using Gates = float[E::kGates > 0 ? E::kGates : 1];

// E0 and E1: h = tanh(v), out = h * silu(z), one gate input z. kApprox uses the hardware
// tanh for tanh and for the sigmoid (sigma(z) = (1 + tanh(z / 2)) / 2; relative error about
// 2^-11, below bf16's rounding).
template <bool kApprox>
struct TanhSiluGate {
  static constexpr int kId = 0;
  static constexpr const char* kName = "tanh_silu_gate";
  static constexpr int kGates = 1;

  __device__ __forceinline__ static float sigmoid(float z) {
    return kApprox ? fmaf(0.5f, tanh_approx(0.5f * z), 0.5f) : sigmoidf(z);
  }
  __device__ __forceinline__ static float act(float v) { return kApprox ? tanh_approx(v) : tanhf(v); }

  struct Pre {
    float g;  // silu(z)
  };
  __device__ __forceinline__ static Pre prepare(const Gates<TanhSiluGate>& g) {
    return {g[0] * sigmoid(g[0])};
  }
  __device__ __forceinline__ static float output(float h, const Pre& pre) { return h * pre.g; }
  // h is the stored h_t (tanh'(v) = 1 - h^2).
  __device__ __forceinline__ static void backward_parts(float d_out, float h,
                                                        const Gates<TanhSiluGate>& g, float& c,
                                                        float& f, Gates<TanhSiluGate>& dg) {
    const float z = g[0];
    const float s = sigmoid(z);
    const float dsilu = s * (1.f + z * (1.f - s));
    c = d_out * (z * s);
    f = 1.f - h * h;
    dg[0] = d_out * h * dsilu;
  }
};

// The self gate of E33, E36-E39, E42: out = h * silu(h) = h^2 sigma(h), no gate input. The
// activation is a template parameter: tanh (E33, E37, E38, E39) or the identity (the linear
// E36 and E42, whose act'(v) = 1). Backward: dout/dh = h sigma(h) (2 + h (1 - sigma(h)));
// act'(v) from the stored h. kApprox computes sigma with the hardware tanh as TanhSiluGate.
template <bool kApprox, bool kTanh>
struct SelfGate {
  static constexpr int kGates = 0;

  __device__ __forceinline__ static float sigmoid(float z) {
    return kApprox ? fmaf(0.5f, tanh_approx(0.5f * z), 0.5f) : sigmoidf(z);
  }
  __device__ __forceinline__ static float act(float v) {
    if constexpr (kTanh) return kApprox ? tanh_approx(v) : tanhf(v);
    else return v;
  }

  struct Pre {};
  __device__ __forceinline__ static Pre prepare(const float (&)[1]) { return {}; }
  __device__ __forceinline__ static float output(float h, const Pre&) { return h * h * sigmoid(h); }
  __device__ __forceinline__ static void backward_parts(float d_out, float h, const float (&)[1],
                                                        float& c, float& f, float (&)[1]) {
    const float s = sigmoid(h);
    c = d_out * (h * s) * fmaf(h, 1.f - s, 2.f);
    f = kTanh ? 1.f - h * h : 1.f;
  }
};

// E33, E37, E38, E39: h = tanh(v), out = h * silu(h).
template <bool kApprox>
struct TanhSelfGate : SelfGate<kApprox, true> {
  static constexpr int kId = 1;
  static constexpr const char* kName = "tanh_self_gate";
};

// E36, E42: h = v (linear recurrence), out = h * silu(h).
template <bool kApprox>
struct LinearSelfGate : SelfGate<kApprox, false> {
  static constexpr int kId = 2;
  static constexpr const char* kName = "linear_self_gate";
};

// ---- the table ---------------------------------------------------------------------------
template <template <bool> class... E>
struct EpilogueList {};

// Every production dense epilogue. Ids must be unique (checked below).
using DenseEpilogues = EpilogueList<TanhSiluGate, TanhSelfGate, LinearSelfGate>;

// Calls f(E<kApprox>{}) for the epilogue of `id` in List; false when no entry has that id.
template <bool kApprox, class List>
struct Dispatch;
template <bool kApprox>
struct Dispatch<kApprox, EpilogueList<>> {
  template <class F>
  static bool run(int, F&&) { return false; }
  static constexpr bool unique() { return true; }
  static constexpr bool lacks(int) { return true; }
};
template <bool kApprox, template <bool> class E, template <bool> class... Es>
struct Dispatch<kApprox, EpilogueList<E, Es...>> {
  using Rest = Dispatch<kApprox, EpilogueList<Es...>>;
  template <class F>
  static bool run(int id, F&& f) {
    if (id == E<kApprox>::kId) {
      f(E<kApprox>{});
      return true;
    }
    return Rest::run(id, f);
  }
  static constexpr bool lacks(int id) { return id != E<kApprox>::kId && Rest::lacks(id); }
  static constexpr bool unique() {
    return E<kApprox>::kId >= 0 && E<kApprox>::kGates >= 0 && E<kApprox>::kGates <= 2 &&
           Rest::lacks(E<kApprox>::kId) && Rest::unique();
  }
};
template <bool kApprox, class List, class F>
bool with_epilogue(int id, F&& f) {
  return Dispatch<kApprox, List>::run(id, f);
}
static_assert(Dispatch<false, DenseEpilogues>::unique(),
              "dense epilogues need unique ids >= 0 and 0 to 2 gates");

}  // namespace elman
