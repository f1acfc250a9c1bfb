// The matrix family's binding (extension `elman_matrix`): validates every input before any
// launch (common/check.h: device, dtype, exact shapes, contiguity, empty dimensions, supported
// n and v, step id, checkpoint interval) and calls the plain C++ launchers of matrix.h.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "matrix/matrix.h"

namespace {

using elman::check::num;
using elman::check::value_error;

// The checked sizes of one call, and the float32 checker of decay, beta and the states.
struct Call {
  int64_t T, B, H, n, v;
  bool column;
  elman::check::Tensors same;  // q, k, v (and d_o): the compute dtype
  elman::check::Tensors f32;
};

Call check_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& decay, const c10::optional<at::Tensor>& beta, int64_t step,
                int64_t K, int64_t group) {
  const auto same = elman::check::leading(k, "k", 4, "[T, B, H, n]", {at::kFloat, at::kBFloat16});
  const int64_t T = k.size(0), B = k.size(1), H = k.size(2), n = k.size(3);
  if (v.dim() != 4) value_error("v must be [T, B, H, v], got shape " + elman::check::shape(v.sizes()));
  const int64_t vd = v.size(3);
  same(q, "q", {T, B, H, n});
  same(v, "v", {T, B, H, vd});
  const char* why = "";
  if (!elman::matrix_supported(int(n), int(vd), &why))
    value_error("the matrix kernels do not take n=" + num(n) + ", v=" + num(vd) + ": " + why);
  if (step < 0 || step >= elman::matrix_step_count())
    value_error("step must be an index of the step table (0.." + num(elman::matrix_step_count() - 1) +
                "), got " + num(step));
  if (K < 1) value_error("the checkpoint interval K must be at least 1, got " + num(K));
  if (!elman::matrix_group_ok(int(group), int(n), int(vd)))
    value_error("group must be 0 (the fastest layout that runs), " + num(elman::kMatrixWarp) +
                " (one warp a head; square n = v <= 32), " + num(elman::kMatrixRing) +
                " (one warp a head fed by a cp.async input ring; square n = v <= 32), " + num(elman::kMatrixTiled) +
                " (tiled; n, v <= 64) or " + num(elman::kMatrixGroup) + " (threads per value column); got " +
                num(group) + " at n=" + num(n) + ", v=" + num(vd));
  if (T * B * H * std::max(n, vd) >= (int64_t(1) << 31))
    value_error("T * B * H * max(n, v) must be below 2^31, got " + num(T * B * H * std::max(n, vd)));
  const elman::check::Tensors f32{k.device(), at::kFloat};
  const bool column = decay.dim() == 4;
  if (column) f32(decay, "decay", {T, B, H, vd});
  else f32(decay, "decay", {T, B, H});
  if (beta) f32(*beta, "beta", {T, B, H});
  return {T, B, H, n, vd, column, same, f32};
}

elman::MatrixArgs args_of(const Call& c, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& decay,
                          const c10::optional<at::Tensor>& beta, int64_t step, int64_t K,
                          int64_t group) {
  elman::MatrixArgs a;
  a.T = int(c.T), a.B = int(c.B), a.H = int(c.H), a.n = int(c.n), a.v = int(c.v), a.K = int(K);
  a.step = int(step), a.group = int(group), a.column = c.column, a.bf16 = k.scalar_type() == at::kBFloat16;
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v_in = v.data_ptr();
  a.decay = decay.data_ptr<float>();
  a.beta = beta ? beta->data_ptr<float>() : nullptr;
  a.stream = at::cuda::getCurrentCUDAStream();
  return a;
}

void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay,
             const c10::optional<at::Tensor>& beta, const at::Tensor& h0, at::Tensor& o,
             at::Tensor& S_T, at::Tensor& ckpt, int64_t step, int64_t K, int64_t group) {
  const Call c = check_call(q, k, v, decay, beta, step, K, group);
  c.f32(h0, "h0", {c.B, c.H, c.n, c.v});
  c.same(o, "o", {c.T, c.B, c.H, c.v});
  c.f32(S_T, "S_T", {c.B, c.H, c.n, c.v});
  c.f32(ckpt, "ckpt", {(c.T + K - 1) / K, c.B, c.H, c.n, c.v});
  const c10::cuda::CUDAGuard guard(k.device());
  elman::MatrixArgs a = args_of(c, q, k, v, decay, beta, step, K, group);
  a.h0 = h0.data_ptr<float>(), a.o = o.data_ptr(), a.S_T = S_T.data_ptr<float>();
  a.ckpt = ckpt.data_ptr<float>();
  elman::check::cuda(elman::matrix_forward(a), "matrix forward");
}

void backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay,
              const c10::optional<at::Tensor>& beta, const at::Tensor& ckpt, const at::Tensor& d_o,
              const at::Tensor& d_ST, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
              at::Tensor& d_decay, const c10::optional<at::Tensor>& d_beta, at::Tensor& dh0,
              int64_t step, int64_t K, int64_t group, int64_t slots) {
  const Call c = check_call(q, k, v, decay, beta, step, K, group);
  if (slots < 0) value_error("slots must be 0 (automatic) or positive, got " + num(slots));
  c.f32(ckpt, "ckpt", {(c.T + K - 1) / K, c.B, c.H, c.n, c.v});
  c.same(d_o, "d_o", {c.T, c.B, c.H, c.v});
  c.f32(d_ST, "d_S_T", {c.B, c.H, c.n, c.v});
  c.same(dq, "dq", {c.T, c.B, c.H, c.n});
  c.same(dk, "dk", {c.T, c.B, c.H, c.n});
  c.same(dv, "dv", {c.T, c.B, c.H, c.v});
  if (c.column) c.f32(d_decay, "d_decay", {c.T, c.B, c.H, c.v});
  else c.f32(d_decay, "d_decay", {c.T, c.B, c.H});
  if (beta.has_value() != d_beta.has_value())
    value_error("d_beta must be given exactly when beta is");
  if (d_beta) c.f32(*d_beta, "d_beta", {c.T, c.B, c.H});
  c.f32(dh0, "dh0", {c.B, c.H, c.n, c.v});
  const c10::cuda::CUDAGuard guard(k.device());
  elman::MatrixArgs a = args_of(c, q, k, v, decay, beta, step, K, group);
  a.slots = int(std::min<int64_t>(slots, K));
  a.ckpt = ckpt.data_ptr<float>(), a.d_o = d_o.data_ptr(), a.d_ST = d_ST.data_ptr<float>();
  a.dq = dq.data_ptr(), a.dk = dk.data_ptr(), a.dv = dv.data_ptr(), a.d_decay = d_decay.data_ptr<float>();
  a.dh0 = dh0.data_ptr<float>(), a.d_beta = d_beta ? d_beta->data_ptr<float>() : nullptr;
  // The column-group kernels replay each chunk into a global scratch; the others keep it on chip.
  const int64_t steps = elman::matrix_layout(a, true) == elman::kMatrixGroup ? std::min(K, c.T) + 1 : 0;
  const at::Tensor scratch = at::empty({c.B * c.H, steps, c.n, c.v}, ckpt.options());
  a.scratch = scratch.data_ptr<float>();
  elman::check::cuda(elman::matrix_backward(a), "matrix backward");
}

std::vector<std::string> steps() {
  std::vector<std::string> names;
  for (int i = 0; i < elman::matrix_step_count(); ++i) names.emplace_back(elman::matrix_step_name(i));
  return names;
}

}  // namespace

namespace elman {
void register_gated(pybind11::module& m);  // gated_binding.cpp
}  // namespace elman

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elman matrix-state family kernels (lib/csrc/matrix)";
  m.def("steps", &steps, "names of the step table, in id order");
  m.def("forward", &forward, "matrix recurrence forward into (o, S_T, ckpt)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("decay"), py::arg("beta"), py::arg("h0"), py::arg("o"),
        py::arg("S_T"), py::arg("ckpt"), py::arg("step"), py::arg("K"), py::arg("group") = 0);
  m.def("backward", &backward, "matrix recurrence backward into (dq, dk, dv, d_decay, d_beta, dh0)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("decay"), py::arg("beta"),
        py::arg("ckpt"), py::arg("d_o"), py::arg("d_S_T"), py::arg("dq"), py::arg("dk"),
        py::arg("dv"), py::arg("d_decay"), py::arg("d_beta"), py::arg("dh0"), py::arg("step"),
        py::arg("K"), py::arg("group") = 0, py::arg("slots") = 0);
  elman::register_gated(m);
}
