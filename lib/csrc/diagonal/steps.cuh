// The diagonal family's step functors and THE table the scan kernels dispatch through.
// Adding a diagonal variant = one struct below + one entry in DiagonalSteps; ids are read by
// Python from the extension (`steps()`).
//
// A step maps, per element, the previous state hp = h_{t-1}, the step's kInputs inputs u[]
// (pre-activations from the variant's input GEMMs) and the channel's kParams fp32 vectors q[]
// to h_t:
//   forward (hp, u, q) -> h
//   backward(hp, h, u, q, dh, du, dq) -> dhp
// where dh = dL/dh_t (everything downstream: the next step and out_t), du[i] = dL/du_i (to be
// written), dq[j] += dL/dq_j (accumulated over T by the kernel) and dhp = the part of
// dL/dh_{t-1} that flows through this step. The backward recomputes what it needs from hp
// and u (elementwise, cheaper than storing it). Every step is a class template over kApprox:
// the bf16 kernels instantiate kApprox = true (hardware tanh.approx, relative error about
// 2^-11, below bf16's rounding; the sigmoid as (1 + tanh(x / 2)) / 2), fp32 kernels false.
#pragma once

#include "common/math.cuh"

namespace elman {

template <int N>
using Arr = float[N > 0 ? N : 1];

template <bool kApprox>
struct Act {
  __device__ __forceinline__ static float sig(float x) {
    return kApprox ? fmaf(0.5f, tanh_approx(0.5f * x), 0.5f) : 1.f / (1.f + expf(-x));
  }
  __device__ __forceinline__ static float tanh(float x) { return kApprox ? tanh_approx(x) : tanhf(x); }
};

// E34: h = tanh(u + delta * hp), delta = clamp(d_vec) (clamped in Python).
template <bool kApprox>
struct StepE34 {
  static constexpr int kId = 0, kInputs = 1, kParams = 1;
  static constexpr const char* kName = "e34";
  __device__ __forceinline__ static float forward(float hp, const Arr<1>& u, const Arr<1>& q) {
    return Act<kApprox>::tanh(fmaf(q[0], hp, u[0]));
  }
  __device__ __forceinline__ static float backward(float hp, float h, const Arr<1>&, const Arr<1>& q,
                                                   float dh, Arr<1>& du, Arr<1>& dq) {
    const float dpre = dh * (1.f - h * h);
    du[0] = dpre;
    dq[0] = fmaf(dpre, hp, dq[0]);
    return dpre * q[0];
  }
};

// E61: alpha = sigma(u0), h = alpha hp + (1 - alpha) u1.
template <bool kApprox>
struct StepE61 {
  static constexpr int kId = 1, kInputs = 2, kParams = 0;
  static constexpr const char* kName = "e61";
  __device__ __forceinline__ static float forward(float hp, const Arr<2>& u, const Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]);
    return fmaf(a, hp - u[1], u[1]);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<2>& u, const Arr<0>&,
                                                   float dh, Arr<2>& du, Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]);
    du[0] = dh * (hp - u[1]) * a * (1.f - a);
    du[1] = dh * (1.f - a);
    return dh * a;
  }
};

// E61b: h = sigma(u0) hp + u1.
template <bool kApprox>
struct StepE61b {
  static constexpr int kId = 2, kInputs = 2, kParams = 0;
  static constexpr const char* kName = "e61b";
  __device__ __forceinline__ static float forward(float hp, const Arr<2>& u, const Arr<0>&) {
    return fmaf(Act<kApprox>::sig(u[0]), hp, u[1]);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<2>& u, const Arr<0>&,
                                                   float dh, Arr<2>& du, Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]);
    du[0] = dh * hp * a * (1.f - a);
    du[1] = dh;
    return dh * a;
  }
};

// E61c: alpha = sigma(p), h = alpha hp + (1 - alpha) tanh(p), p = u0.
template <bool kApprox>
struct StepE61c {
  static constexpr int kId = 3, kInputs = 1, kParams = 0;
  static constexpr const char* kName = "e61c";
  __device__ __forceinline__ static float forward(float hp, const Arr<1>& u, const Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(u[0]);
    return fmaf(a, hp - v, v);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<1>& u, const Arr<0>&,
                                                   float dh, Arr<1>& du, Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(u[0]);
    du[0] = dh * ((hp - v) * a * (1.f - a) + (1.f - a) * (1.f - v * v));
    return dh * a;
  }
};

// E62: k = sigma(u0), v = tanh(u1), h = (1 - k) hp + k v.
template <bool kApprox>
struct StepE62 {
  static constexpr int kId = 4, kInputs = 2, kParams = 0;
  static constexpr const char* kName = "e62";
  __device__ __forceinline__ static float forward(float hp, const Arr<2>& u, const Arr<0>&) {
    const float k = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(u[1]);
    return fmaf(k, v - hp, hp);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<2>& u, const Arr<0>&,
                                                   float dh, Arr<2>& du, Arr<0>&) {
    const float k = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(u[1]);
    du[0] = dh * (v - hp) * k * (1.f - k);
    du[1] = dh * k * (1.f - v * v);
    return dh * (1.f - k);
  }
};

// E62b: alpha = sigma(u0), k = sigma(u1), v = tanh(u2), h = alpha (1 - k) hp + k v.
template <bool kApprox>
struct StepE62b {
  static constexpr int kId = 5, kInputs = 3, kParams = 0;
  static constexpr const char* kName = "e62b";
  __device__ __forceinline__ static float forward(float hp, const Arr<3>& u, const Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]), k = Act<kApprox>::sig(u[1]), v = Act<kApprox>::tanh(u[2]);
    return fmaf(a * (1.f - k), hp, k * v);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<3>& u, const Arr<0>&,
                                                   float dh, Arr<3>& du, Arr<0>&) {
    const float a = Act<kApprox>::sig(u[0]), k = Act<kApprox>::sig(u[1]), v = Act<kApprox>::tanh(u[2]);
    du[0] = dh * (1.f - k) * hp * a * (1.f - a);
    du[1] = dh * (v - a * hp) * k * (1.f - k);
    du[2] = dh * k * (1.f - v * v);
    return dh * a * (1.f - k);
  }
};

// E62c: k = sigma(p), v = tanh(p), h = (1 - k) hp + k v, p = u0.
template <bool kApprox>
struct StepE62c {
  static constexpr int kId = 6, kInputs = 1, kParams = 0;
  static constexpr const char* kName = "e62c";
  __device__ __forceinline__ static float forward(float hp, const Arr<1>& u, const Arr<0>&) {
    const float k = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(u[0]);
    return fmaf(k, v - hp, hp);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<1>& u, const Arr<0>&,
                                                   float dh, Arr<1>& du, Arr<0>&) {
    const float k = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(u[0]);
    du[0] = dh * ((v - hp) * k * (1.f - k) + k * (1.f - v * v));
    return dh * (1.f - k);
  }
};

// E64 (kParams = 0) and E65 (kParams = 1, the vector d_h): alpha = sigma(u0),
// v = tanh(d_h hp + u1) (d_h = 1 for E64), h = alpha hp + (1 - alpha) v.
template <bool kApprox, int kId_, int kP, const char* const* kName_>
struct StepHDependent {
  static constexpr int kId = kId_, kInputs = 2, kParams = kP;
  static constexpr const char* kName = *kName_;
  __device__ __forceinline__ static float scale(const Arr<kP>& q) {
    if constexpr (kP == 0) return 1.f; else return q[0];
  }
  __device__ __forceinline__ static float forward(float hp, const Arr<2>& u, const Arr<kP>& q) {
    const float a = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(fmaf(scale(q), hp, u[1]));
    return fmaf(a, hp - v, v);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<2>& u, const Arr<kP>& q,
                                                   float dh, Arr<2>& du, Arr<kP>& dq) {
    const float a = Act<kApprox>::sig(u[0]), v = Act<kApprox>::tanh(fmaf(scale(q), hp, u[1]));
    const float dpre = dh * (1.f - a) * (1.f - v * v);
    du[0] = dh * (hp - v) * a * (1.f - a);
    du[1] = dpre;
    if constexpr (kP > 0) dq[0] = fmaf(dpre, hp, dq[0]);
    return fmaf(dh, a, dpre * scale(q));
  }
};
inline constexpr const char* kNameE64 = "e64";
inline constexpr const char* kNameE65 = "e65";
template <bool kApprox>
using StepE64 = StepHDependent<kApprox, 7, 0, &kNameE64>;
template <bool kApprox>
using StepE65 = StepHDependent<kApprox, 8, 1, &kNameE65>;

// E67: alpha = sigma(u0 + d_a hp), v = tanh(u1), h = alpha hp + (1 - alpha) v.
template <bool kApprox>
struct StepE67 {
  static constexpr int kId = 9, kInputs = 2, kParams = 1;
  static constexpr const char* kName = "e67";
  __device__ __forceinline__ static float forward(float hp, const Arr<2>& u, const Arr<1>& q) {
    const float a = Act<kApprox>::sig(fmaf(q[0], hp, u[0])), v = Act<kApprox>::tanh(u[1]);
    return fmaf(a, hp - v, v);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<2>& u, const Arr<1>& q,
                                                   float dh, Arr<2>& du, Arr<1>& dq) {
    const float a = Act<kApprox>::sig(fmaf(q[0], hp, u[0])), v = Act<kApprox>::tanh(u[1]);
    const float dpre = dh * (hp - v) * a * (1.f - a);
    du[0] = dpre;
    du[1] = dh * (1.f - a) * (1.f - v * v);
    dq[0] = fmaf(dpre, hp, dq[0]);
    return fmaf(dh, a, dpre * q[0]);
  }
};

// E68 (kInverse = false): g = sigma(d_g hp + b_g); E68i (true): g = sigma(-d_g |hp| + b_g);
// alpha = sigma(u0), w = tanh(u1), v = w g, h = alpha hp + (1 - alpha) v. q = (d_g, b_g).
template <bool kApprox, bool kInverse>
struct StepSelfGate {
  static constexpr int kId = kInverse ? 11 : 10, kInputs = 2, kParams = 2;
  static constexpr const char* kName = kInverse ? "e68i" : "e68";
  __device__ __forceinline__ static float gate_in(float hp) { return kInverse ? -fabsf(hp) : hp; }
  __device__ __forceinline__ static float forward(float hp, const Arr<2>& u, const Arr<2>& q) {
    const float a = Act<kApprox>::sig(u[0]), w = Act<kApprox>::tanh(u[1]);
    const float g = Act<kApprox>::sig(fmaf(q[0], gate_in(hp), q[1]));
    const float v = w * g;
    return fmaf(a, hp - v, v);
  }
  __device__ __forceinline__ static float backward(float hp, float, const Arr<2>& u, const Arr<2>& q,
                                                   float dh, Arr<2>& du, Arr<2>& dq) {
    const float a = Act<kApprox>::sig(u[0]), w = Act<kApprox>::tanh(u[1]);
    const float s = gate_in(hp);
    const float g = Act<kApprox>::sig(fmaf(q[0], s, q[1]));
    const float v = w * g;
    const float dv = dh * (1.f - a);
    const float dgpre = dv * w * g * (1.f - g);
    du[0] = dh * (hp - v) * a * (1.f - a);
    du[1] = dv * g * (1.f - w * w);
    dq[0] = fmaf(dgpre, s, dq[0]);
    dq[1] += dgpre;
    // d s / d hp: 1, or -sign(hp) for the inverse gate (0 at hp = 0, as torch's abs).
    const float ds = kInverse ? (hp > 0.f ? -1.f : (hp < 0.f ? 1.f : 0.f)) : 1.f;
    return fmaf(dh, a, dgpre * q[0] * ds);
  }
};
template <bool kApprox>
using StepE68 = StepSelfGate<kApprox, false>;
template <bool kApprox>
using StepE68i = StepSelfGate<kApprox, true>;

// ---- the table ---------------------------------------------------------------------------
template <template <bool> class... S>
struct StepList {};

// Every production diagonal step. Ids must be unique (checked below).
using DiagonalSteps = StepList<StepE34, StepE61, StepE61b, StepE61c, StepE62, StepE62b, StepE62c,
                               StepE64, StepE65, StepE67, StepE68, StepE68i>;

template <bool kApprox, class List>
struct StepDispatch;
template <bool kApprox>
struct StepDispatch<kApprox, StepList<>> {
  template <class F>
  static bool run(int, F&&) { return false; }
  static constexpr bool lacks(int) { return true; }
  static constexpr bool valid() { return true; }
};
template <bool kApprox, template <bool> class S, template <bool> class... Ss>
struct StepDispatch<kApprox, StepList<S, Ss...>> {
  using Rest = StepDispatch<kApprox, StepList<Ss...>>;
  template <class F>
  static bool run(int id, F&& f) {
    if (id == S<kApprox>::kId) {
      f(S<kApprox>{});
      return true;
    }
    return Rest::run(id, f);
  }
  static constexpr bool lacks(int id) { return id != S<kApprox>::kId && Rest::lacks(id); }
  static constexpr bool valid() {
    return S<kApprox>::kId >= 0 && S<kApprox>::kInputs >= 1 && S<kApprox>::kInputs <= 3 &&
           S<kApprox>::kParams >= 0 && S<kApprox>::kParams <= 2 && Rest::lacks(S<kApprox>::kId) &&
           Rest::valid();
  }
};
template <bool kApprox, class F>
bool with_step(int id, F&& f) {
  return StepDispatch<kApprox, DiagonalSteps>::run(id, f);
}
static_assert(StepDispatch<false, DiagonalSteps>::valid(),
              "diagonal steps need unique ids >= 0, 1 to 3 inputs and 0 to 2 params");

}  // namespace elman
