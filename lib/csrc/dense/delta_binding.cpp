// The nonlinear-delta op's part of the dense binding (E63, delta.h): validates every input
// before any launch and runs the per-step loops on the current stream. binding.cpp registers
// these functions in the `elman_dense` module.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>

#include "common/check.h"
#include "dense/delta.h"

namespace {

using elman::check::num;
using elman::check::value_error;

const char* kPre = "[T, B, G D]";

struct Sizes {
  int64_t T, B, D, G, R;
};

// pre [T, B, G D] fixes T, B, D for the mode's G channels; B * G * D must fit an int.
Sizes sizes_of(int64_t mode, const at::Tensor& pre, const char* name) {
  if (mode < 0 || mode >= elman::kDeltaModes)
    value_error("delta mode must be in [0, " + num(elman::kDeltaModes) + "), got " + num(mode));
  const int64_t G = elman::delta_channels(int(mode)), R = elman::delta_recurrent(int(mode));
  elman::check::leading(pre, name, 3, kPre, {at::kFloat, at::kBFloat16});
  if (pre.size(2) % G != 0)
    value_error(std::string(name) + " has last dimension " + num(pre.size(2)) + "; mode " +
                num(mode) + " needs " + num(G) + " blocks of D");
  const int64_t D = pre.size(2) / G;
  if (pre.size(1) * pre.size(2) >= (int64_t(1) << 31))
    value_error("B * G * D must be below 2^31, got " + num(pre.size(1) * pre.size(2)));
  return {pre.size(0), pre.size(1), D, G, R};
}

void delta_forward(int64_t mode, const at::Tensor& pre, const at::Tensor& w_rec,
                   const at::Tensor& h0, at::Tensor& out, at::Tensor& h_all, at::Tensor& act) {
  const Sizes s = sizes_of(mode, pre, "pre");
  const elman::check::Tensors check{pre.device(), pre.scalar_type()};
  check(pre, "pre", {s.T, s.B, s.G * s.D});
  check(w_rec, "W_rec", {s.R * s.D, s.D});
  check(h0, "h0", {s.B, s.D});
  check(out, "out", {s.T, s.B, s.D});
  check(h_all, "h_all", {s.T + 1, s.B, s.D});
  check(act, "act", {s.T, s.B, s.G * s.D});
  const c10::cuda::CUDAGuard guard(pre.device());
  at::Tensor q = at::empty({s.B * s.R * s.D}, pre.options().dtype(at::kFloat));
  at::Tensor state = at::empty({s.B * s.D}, pre.options().dtype(at::kFloat));
  elman::DeltaForward a;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.mode = int(mode); a.steps = int(s.T); a.batch = int(s.B); a.dim = int(s.D);
  a.pre = pre.data_ptr(); a.w_rec = w_rec.data_ptr(); a.h0 = h0.data_ptr();
  a.out = out.data_ptr(); a.h_all = h_all.data_ptr(); a.act = act.data_ptr();
  a.q = q.data_ptr<float>();
  a.state = state.data_ptr<float>();
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const cudaError_t e = pre.scalar_type() == at::kFloat
      ? elman::delta_steps_forward<float>(handle, a)
      : elman::delta_steps_forward<__nv_bfloat16>(handle, a);
  elman::check::cuda(e, "nonlinear-delta per-step forward");
}

void delta_backward(int64_t mode, const at::Tensor& w_rec, const at::Tensor& h_all,
                    const at::Tensor& act, const at::Tensor& d_out, const at::Tensor& d_hT,
                    at::Tensor& d_pre, at::Tensor& dh0) {
  const Sizes s = sizes_of(mode, act, "act");
  const elman::check::Tensors check{act.device(), act.scalar_type()};
  check(w_rec, "W_rec", {s.R * s.D, s.D});
  check(h_all, "h_all", {s.T + 1, s.B, s.D});
  check(d_out, "d_out", {s.T, s.B, s.D});
  check(d_hT, "d_hT", {s.B, s.D});
  check(d_pre, "d_pre", {s.T, s.B, s.G * s.D});
  check(dh0, "dh0", {s.B, s.D});
  const c10::cuda::CUDAGuard guard(act.device());
  at::Tensor carry = at::empty({s.B * s.D}, act.options().dtype(at::kFloat));
  elman::DeltaBackward a;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.mode = int(mode); a.steps = int(s.T); a.batch = int(s.B); a.dim = int(s.D);
  a.w_rec = w_rec.data_ptr(); a.h_all = h_all.data_ptr(); a.act = act.data_ptr();
  a.d_out = d_out.data_ptr(); a.d_hT = d_hT.data_ptr(); a.d_pre = d_pre.data_ptr();
  a.dh0 = dh0.data_ptr(); a.carry = carry.data_ptr<float>();
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const cudaError_t e = act.scalar_type() == at::kFloat
      ? elman::delta_steps_backward<float>(handle, a)
      : elman::delta_steps_backward<__nv_bfloat16>(handle, a);
  elman::check::cuda(e, "nonlinear-delta per-step backward");
}

}  // namespace

void register_delta(pybind11::module& m) {
  m.def("delta_forward", &delta_forward,
        "nonlinear-delta (E63) per-step forward: (mode, pre, w_rec, h0, out, h_all, act)",
        py::arg("mode"), py::arg("pre"), py::arg("w_rec"), py::arg("h0"), py::arg("out"),
        py::arg("h_all"), py::arg("act"));
  m.def("delta_backward", &delta_backward,
        "nonlinear-delta (E63) per-step backward: (mode, w_rec, h_all, act, d_out, d_hT, d_pre, dh0)",
        py::arg("mode"), py::arg("w_rec"), py::arg("h_all"), py::arg("act"), py::arg("d_out"),
        py::arg("d_hT"), py::arg("d_pre"), py::arg("dh0"));
}
