// The binding functions of the gated recurrence and of E74's diagonal state (registered into
// `elman_matrix` by binding.cpp): validate every input before any launch (common/check.h:
// device, dtype, exact shapes, contiguity, empty dimensions, supported n and v, rule and step
// ids, checkpoint interval) and call the plain C++ launchers of gated.h and diagonal.h.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "matrix/diagonal.h"
#include "matrix/gated.h"

namespace {

using elman::check::num;
using elman::check::value_error;
using Opt = c10::optional<at::Tensor>;

struct GatedCall {
  int64_t T, B, H, n, v;
  elman::check::Tensors same;
  elman::check::Tensors f32;
};

GatedCall check_gated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& c, const Opt& m, const Opt& e, const Opt& f, const Opt& x,
                      int64_t rule, int64_t step, int64_t K) {
  const auto same = elman::check::leading(k, "k", 4, "[T, B, H, n]", {at::kFloat, at::kBFloat16});
  const int64_t T = k.size(0), B = k.size(1), H = k.size(2), n = k.size(3);
  if (v.dim() != 4) value_error("v must be [T, B, H, v], got shape " + elman::check::shape(v.sizes()));
  const int64_t vd = v.size(3);
  same(q, "q", {T, B, H, n});
  same(v, "v", {T, B, H, vd});
  const char* why = "";
  if (!elman::gated_supported(int(n), int(vd), &why))
    value_error("the gated matrix kernels do not take n=" + num(n) + ", v=" + num(vd) + ": " + why);
  if (rule < 0 || rule >= elman::kGatedRules)
    value_error("rule must be a rule id 0.." + num(elman::kGatedRules - 1) + ", got " + num(rule));
  if (step < 0 || step > 1) value_error("step must be 0 (tanh) or 1 (linear), got " + num(step));
  if (K < 1) value_error("the checkpoint interval K must be at least 1, got " + num(K));
  if (T * B * H * std::max(n, vd) >= (int64_t(1) << 31))
    value_error("T * B * H * max(n, v) must be below 2^31, got " + num(T * B * H * std::max(n, vd)));
  const bool needs_e = rule >= elman::kRetain && rule <= elman::kValueGateAbs;
  const bool needs_f = rule >= elman::kValueGate;
  if (e.has_value() != needs_e) value_error(std::string("e must be given exactly for the retain and value-gate rules"));
  if (f.has_value() != needs_f) value_error(std::string("f must be given exactly for the value-gate and write-gate rules"));
  const elman::check::Tensors f32{k.device(), at::kFloat};
  f32(c, "c", {T, B, H, vd});
  if (m) f32(*m, "m", {T, B, H, n});
  if (e) f32(*e, "e", {T, B, H, vd});
  if (f) f32(*f, "f", {T, B, H, vd});
  if (x) f32(*x, "x", {T, B, H, vd});
  return {T, B, H, n, vd, same, f32};
}

elman::GatedArgs gated_args(const GatedCall& g, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& c, const Opt& m, const Opt& e,
                            const Opt& f, const Opt& x, int64_t rule, int64_t step, int64_t K) {
  elman::GatedArgs a;
  a.T = int(g.T), a.B = int(g.B), a.H = int(g.H), a.n = int(g.n), a.v = int(g.v), a.K = int(K);
  a.rule = int(rule), a.step = int(step), a.bf16 = k.scalar_type() == at::kBFloat16;
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v_in = v.data_ptr(), a.c = c.data_ptr<float>();
  a.m = m ? m->data_ptr<float>() : nullptr;
  a.e = e ? e->data_ptr<float>() : nullptr;
  a.f = f ? f->data_ptr<float>() : nullptr;
  a.x = x ? x->data_ptr<float>() : nullptr;
  a.stream = at::cuda::getCurrentCUDAStream();
  return a;
}

void forward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& c,
                   const Opt& m, const Opt& e, const Opt& f, const at::Tensor& h0, at::Tensor& o,
                   at::Tensor& S_T, at::Tensor& ckpt, int64_t rule, int64_t step, int64_t K,
                   const Opt& x) {
  const GatedCall g = check_gated(q, k, v, c, m, e, f, x, rule, step, K);
  g.f32(h0, "h0", {g.B, g.H, g.n, g.v});
  g.same(o, "o", {g.T, g.B, g.H, g.v});
  g.f32(S_T, "S_T", {g.B, g.H, g.n, g.v});
  g.f32(ckpt, "ckpt", {(g.T + K - 1) / K, g.B, g.H, g.n, g.v});
  const c10::cuda::CUDAGuard guard(k.device());
  elman::GatedArgs a = gated_args(g, q, k, v, c, m, e, f, x, rule, step, K);
  a.h0 = h0.data_ptr<float>(), a.o = o.data_ptr(), a.S_T = S_T.data_ptr<float>();
  a.ckpt = ckpt.data_ptr<float>();
  elman::check::cuda(elman::gated_forward(a), "gated matrix forward");
}

void backward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& c, const Opt& m, const Opt& e, const Opt& f,
                    const at::Tensor& ckpt, const at::Tensor& d_o, const at::Tensor& d_ST,
                    at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dc, const Opt& dm,
                    const Opt& de, const Opt& df, at::Tensor& dh0, int64_t rule, int64_t step,
                    int64_t K, const Opt& x, const Opt& dx) {
  const GatedCall g = check_gated(q, k, v, c, m, e, f, x, rule, step, K);
  g.f32(ckpt, "ckpt", {(g.T + K - 1) / K, g.B, g.H, g.n, g.v});
  g.same(d_o, "d_o", {g.T, g.B, g.H, g.v});
  g.f32(d_ST, "d_S_T", {g.B, g.H, g.n, g.v});
  g.same(dq, "dq", {g.T, g.B, g.H, g.n});
  g.same(dk, "dk", {g.T, g.B, g.H, g.n});
  g.same(dv, "dv", {g.T, g.B, g.H, g.v});
  g.f32(dc, "dc", {g.T, g.B, g.H, g.v});
  if (m.has_value() != dm.has_value()) value_error("dm must be given exactly when m is");
  if (e.has_value() != de.has_value()) value_error("de must be given exactly when e is");
  if (f.has_value() != df.has_value()) value_error("df must be given exactly when f is");
  if (dm) g.f32(*dm, "dm", {g.T, g.B, g.H, g.n});
  if (de) g.f32(*de, "de", {g.T, g.B, g.H, g.v});
  if (df) g.f32(*df, "df", {g.T, g.B, g.H, g.v});
  if (x.has_value() != dx.has_value()) value_error("dx must be given exactly when x is");
  if (dx) g.f32(*dx, "dx", {g.T, g.B, g.H, g.v});
  g.f32(dh0, "dh0", {g.B, g.H, g.n, g.v});
  const c10::cuda::CUDAGuard guard(k.device());
  const int64_t slots = std::min(K, g.T) + 1;
  const at::Tensor scratch = at::empty({g.B * g.H, slots, g.n, g.v}, ckpt.options());
  elman::GatedArgs a = gated_args(g, q, k, v, c, m, e, f, x, rule, step, K);
  a.ckpt = ckpt.data_ptr<float>(), a.d_o = d_o.data_ptr(), a.d_ST = d_ST.data_ptr<float>();
  a.scratch = scratch.data_ptr<float>(), a.dq = dq.data_ptr(), a.dk = dk.data_ptr();
  a.dv = dv.data_ptr(), a.dc = dc.data_ptr<float>(), a.dh0 = dh0.data_ptr<float>();
  a.dm = dm ? dm->data_ptr<float>() : nullptr;
  a.de = de ? de->data_ptr<float>() : nullptr;
  a.df = df ? df->data_ptr<float>() : nullptr;
  a.dx = dx ? dx->data_ptr<float>() : nullptr;
  elman::check::cuda(elman::gated_backward(a), "gated matrix backward");
}

struct DiagonalCall {
  int64_t T, B, H, n;
  elman::check::Tensors same;
  elman::check::Tensors f32;
};

DiagonalCall check_diagonal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& c, int64_t rule, int64_t step) {
  const auto same = elman::check::leading(k, "k", 4, "[T, B, H, n]", {at::kFloat, at::kBFloat16});
  const int64_t T = k.size(0), B = k.size(1), H = k.size(2), n = k.size(3);
  same(q, "q", {T, B, H, n});
  same(v, "v", {T, B, H, n});
  if (rule < 0 || rule >= elman::kDiagonalRules)
    value_error("rule must be 0 (delta), 1 (simple) or 2 (ema), got " + num(rule));
  if (step < 0 || step > 1) value_error("step must be 0 (tanh) or 1 (linear), got " + num(step));
  const elman::check::Tensors f32{k.device(), at::kFloat};
  f32(c, "c", {T, B, H, n});
  return {T, B, H, n, same, f32};
}

elman::DiagonalArgs diagonal_args(const DiagonalCall& d, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& c, int64_t rule, int64_t step) {
  elman::DiagonalArgs a;
  a.T = int(d.T), a.channels = d.B * d.H * d.n, a.rule = int(rule), a.step = int(step);
  a.bf16 = k.scalar_type() == at::kBFloat16;
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v_in = v.data_ptr(), a.c = c.data_ptr<float>();
  a.stream = at::cuda::getCurrentCUDAStream();
  return a;
}

void diagonal_forward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& c, const at::Tensor& h0, at::Tensor& o, at::Tensor& S_T,
                         at::Tensor& states, int64_t rule, int64_t step) {
  const DiagonalCall d = check_diagonal(q, k, v, c, rule, step);
  d.f32(h0, "h0", {d.B, d.H, d.n});
  d.same(o, "o", {d.T, d.B, d.H, d.n});
  d.f32(S_T, "S_T", {d.B, d.H, d.n});
  d.f32(states, "states", {d.T, d.B, d.H, d.n});
  const c10::cuda::CUDAGuard guard(k.device());
  elman::DiagonalArgs a = diagonal_args(d, q, k, v, c, rule, step);
  a.h0 = h0.data_ptr<float>(), a.o = o.data_ptr(), a.S_T = S_T.data_ptr<float>();
  a.states = states.data_ptr<float>();
  elman::check::cuda(elman::diagonal_forward(a), "diagonal state forward");
}

void diagonal_backward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& c, const at::Tensor& h0, const at::Tensor& states,
                          const at::Tensor& d_o, const at::Tensor& d_ST, at::Tensor& dq,
                          at::Tensor& dk, at::Tensor& dv, at::Tensor& dc, at::Tensor& dh0,
                          int64_t rule, int64_t step) {
  const DiagonalCall d = check_diagonal(q, k, v, c, rule, step);
  d.f32(h0, "h0", {d.B, d.H, d.n});
  d.f32(states, "states", {d.T, d.B, d.H, d.n});
  d.same(d_o, "d_o", {d.T, d.B, d.H, d.n});
  d.f32(d_ST, "d_S_T", {d.B, d.H, d.n});
  d.same(dq, "dq", {d.T, d.B, d.H, d.n});
  d.same(dk, "dk", {d.T, d.B, d.H, d.n});
  d.same(dv, "dv", {d.T, d.B, d.H, d.n});
  d.f32(dc, "dc", {d.T, d.B, d.H, d.n});
  d.f32(dh0, "dh0", {d.B, d.H, d.n});
  const c10::cuda::CUDAGuard guard(k.device());
  elman::DiagonalArgs a = diagonal_args(d, q, k, v, c, rule, step);
  a.h0 = h0.data_ptr<float>(), a.states = const_cast<float*>(states.data_ptr<float>());
  a.d_o = d_o.data_ptr(), a.d_ST = d_ST.data_ptr<float>(), a.dq = dq.data_ptr();
  a.dk = dk.data_ptr(), a.dv = dv.data_ptr(), a.dc = dc.data_ptr<float>(), a.dh0 = dh0.data_ptr<float>();
  elman::check::cuda(elman::diagonal_backward(a), "diagonal state backward");
}

}  // namespace

namespace elman {

void register_gated(pybind11::module& m) {
  m.def("gated_forward", &forward_op, "gated matrix recurrence forward into (o, S_T, ckpt)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("c"), py::arg("m"), py::arg("e"),
        py::arg("f"), py::arg("h0"), py::arg("o"), py::arg("S_T"), py::arg("ckpt"), py::arg("rule"),
        py::arg("step"), py::arg("K"), py::arg("x") = py::none());
  m.def("gated_backward", &backward_op,
        "gated matrix recurrence backward into (dq, dk, dv, dc, dm, de, df, dh0)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("c"), py::arg("m"), py::arg("e"), py::arg("f"),
        py::arg("ckpt"), py::arg("d_o"), py::arg("d_S_T"), py::arg("dq"), py::arg("dk"),
        py::arg("dv"), py::arg("dc"), py::arg("dm"), py::arg("de"), py::arg("df"), py::arg("dh0"),
        py::arg("rule"), py::arg("step"), py::arg("K"), py::arg("x") = py::none(),
        py::arg("dx") = py::none());
  m.def("diagonal_forward", &diagonal_forward_op, "E74 diagonal state forward into (o, S_T, states)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("c"), py::arg("h0"), py::arg("o"),
        py::arg("S_T"), py::arg("states"), py::arg("rule"), py::arg("step"));
  m.def("diagonal_backward", &diagonal_backward_op,
        "E74 diagonal state backward into (dq, dk, dv, dc, dh0)", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("c"), py::arg("h0"), py::arg("states"), py::arg("d_o"),
        py::arg("d_S_T"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("dc"), py::arg("dh0"),
        py::arg("rule"), py::arg("step"));
}

}  // namespace elman
