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
// An epilogue that reads h_{t-1} elementwise and carries a direct gradient term to the
// previous step (E63: h_t = blend(v_t, h_{t-1}, g_t), v_t = act(acc + wx + b)) declares
// `static constexpr bool kReadsPrev = true` and replaces act/output/backward_parts by:
//   forward : v = act(acc + wx + b);  h = blend(v, h_prev, pre);  out = output(h, pre)
//             the kernels also store v (the `v_all` plane, [T, B, D]) for the backward.
//   backward: backward_prev(d_out, h, h_prev, v, g, Back& b) before the product, then after it
//             dh = acc + b.c + carry;  dv = dh * b.f;  dg_i = dh * b.q[i];  carry = dh * b.a
//             and at the end dh0 = W_h^T dv_0 + carry.
// In both persistent designs the thread that finishes element (n, r) of h_t is the one that
// finished (n, r) of h_{t-1} (out_n/out_r in persistent.cuh, sub_j in grid.cuh do not depend on
// t), so h_{t-1} (fp32) and the carry stay in registers across steps; the backward stages
// h_{t-1} (h_all[t]) and v_t besides d_out and h_t. Neither changes the exchange, the multiply
// or the schedule. Such an epilogue runs on the persistent path only (the per-step kernels
// refuse it; E63's graph and steps paths are the nonlinear-delta op, delta.h).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "common/math.cuh"

namespace elman {

template <class E>
using Gates = float[E::kGates > 0 ? E::kGates : 1];

// Whether epilogue E reads h_{t-1} (kReadsPrev; absent means false).
template <class E, class = void>
struct ReadsPrevOf : std::false_type {};
template <class E>
struct ReadsPrevOf<E, std::void_t<decltype(E::kReadsPrev)>> : std::bool_constant<E::kReadsPrev> {};
template <class E>
constexpr bool kReadsPrevOf = ReadsPrevOf<E>::value;

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

// E63 a, b, d (the nonlinear delta, kReadsPrev): v = tanh(W_h h_{t-1} + W_x x + b), gate
// inputs the pre-activations g_alpha = W_alpha x + b_alpha (and g_beta), out = h * silu(h):
//   kMode 0 (E63a): h = alpha h_{t-1} + (1 - alpha) v     kGates 1
//   kMode 1 (E63b): h = alpha h_{t-1} + beta v            kGates 2
//   kMode 3 (E63d): h = h_{t-1} + alpha v                 kGates 1
// Backward, with dh the total gradient of h_t: dv (of the tanh's argument) = dh f, the gate
// gradients dh q_i, the direct term to h_{t-1} dh a:
//   0: f = (1 - alpha)(1 - v^2), q = (h_{t-1} - v) alpha (1 - alpha), a = alpha
//   1: f = beta (1 - v^2), q = (h_{t-1} alpha (1 - alpha), v beta (1 - beta)), a = alpha
//   3: f = alpha (1 - v^2), q = v alpha (1 - alpha), a = 1
// (E63c's gates also read U_alpha h, U_beta h: a 3D x D recurrent matrix that the persistent
// designs cannot hold, see dense_persistent_plan; it runs on the nonlinear-delta op.)
template <bool kApprox, int kMode>
struct DeltaBlend {
  static constexpr bool kReadsPrev = true;
  static constexpr int kGates = kMode == 1 ? 2 : 1;

  __device__ __forceinline__ static float sigmoid(float z) {
    return kApprox ? fmaf(0.5f, tanh_approx(0.5f * z), 0.5f) : sigmoidf(z);
  }
  __device__ __forceinline__ static float act(float z) { return kApprox ? tanh_approx(z) : tanhf(z); }

  struct Pre {
    float alpha, beta;
  };
  __device__ __forceinline__ static Pre prepare(const float (&g)[kGates]) {
    return {sigmoid(g[0]), kGates > 1 ? sigmoid(g[kGates - 1]) : 0.f};
  }
  __device__ __forceinline__ static float blend(float v, float hp, const Pre& pre) {
    if constexpr (kMode == 0) return fmaf(pre.alpha, hp - v, v);
    else if constexpr (kMode == 1) return fmaf(pre.alpha, hp, pre.beta * v);
    else return fmaf(pre.alpha, v, hp);
  }
  __device__ __forceinline__ static float output(float h, const Pre&) { return h * h * sigmoid(h); }

  struct Back {
    float c, f, a;
    float q[kGates];
  };
  __device__ __forceinline__ static void backward_prev(float d_out, float h, float hp, float v,
                                                       const float (&g)[kGates], Back& b) {
    const float s = sigmoid(h);
    b.c = d_out * (h * s) * fmaf(h, 1.f - s, 2.f);
    const float alpha = sigmoid(g[0]), da = alpha * (1.f - alpha), dt = 1.f - v * v;
    if constexpr (kMode == 0) {
      b.f = (1.f - alpha) * dt;
      b.q[0] = (hp - v) * da;
      b.a = alpha;
    } else if constexpr (kMode == 1) {
      const float beta = sigmoid(g[kGates - 1]);
      b.f = beta * dt;
      b.q[0] = hp * da;
      b.q[kGates - 1] = v * beta * (1.f - beta);
      b.a = alpha;
    } else {
      b.f = alpha * dt;
      b.q[0] = v * da;
      b.a = 1.f;
    }
  }
};

template <bool kApprox>
struct DeltaComplementary : DeltaBlend<kApprox, 0> {
  static constexpr int kId = 3;
  static constexpr const char* kName = "delta_complementary";
};
template <bool kApprox>
struct DeltaIndependent : DeltaBlend<kApprox, 1> {
  static constexpr int kId = 4;
  static constexpr const char* kName = "delta_independent";
};
template <bool kApprox>
struct DeltaAdditive : DeltaBlend<kApprox, 3> {
  static constexpr int kId = 5;
  static constexpr const char* kName = "delta_additive";
};

// ---- the table ---------------------------------------------------------------------------
template <template <bool> class... E>
struct EpilogueList {};

// Every production dense epilogue. Ids must be unique (checked below).
using DenseEpilogues = EpilogueList<TanhSiluGate, TanhSelfGate, LinearSelfGate, DeltaComplementary,
                                    DeltaIndependent, DeltaAdditive>;

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
