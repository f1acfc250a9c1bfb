// The diagonal family's binding (extension `elman_diagonal`): validates every input before
// any launch (common/check.h: device, dtype, exact shapes, contiguity, empty dimensions, the
// step's input and parameter counts, sizes) and dispatches to the launchers of diagonal.h.
// Alignment needs no check: the launcher takes narrower accesses for a misaligned view.
// `vec` (0: the launcher's choice) forces the elements per thread, for timing the widths.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "diagonal/diagonal.h"

namespace {

using elman::check::num;
using elman::check::value_error;

const char* kDims = "[T, B, D]";

elman::StepInfo step_of(int64_t id) {
  const auto info = elman::diagonal_step_of(int(id));
  if (info.id < 0) value_error("unknown diagonal step id " + num(id) + " (see steps())");
  return info;
}

void check_count(const char* what, size_t got, int expected, const elman::StepInfo& info) {
  if (int(got) != expected)
    value_error(std::string("step ") + info.name + " takes " + num(expected) + " " + what + ", got " +
                num(int64_t(got)));
}

void check_list(const elman::check::Tensors& check, const std::vector<at::Tensor>& ts, const char* what,
                const std::vector<int64_t>& shape) {
  for (size_t i = 0; i < ts.size(); ++i)
    check(ts[i], (std::string(what) + "[" + num(int64_t(i)) + "]").c_str(), shape);
}

// The per-channel vectors: fp32, contiguous, [D], on the inputs' device.
void check_params(const std::vector<at::Tensor>& params, const at::Device& device, int64_t D) {
  const elman::check::Tensors check{device, at::kFloat};
  check_list(check, params, "params", {D});
}

void sizes(int64_t T, int64_t B, int64_t D) {
  if (B * D >= (int64_t(1) << 31)) value_error("B * D must be below 2^31, got " + num(B * D));
  if (T >= (int64_t(1) << 31)) value_error("T must be below 2^31, got " + num(T));
}

// A forced width must be 1, 2, 4 or 8 and the launch must be able to take it (it divides
// B * D, fits in 16 bytes, suits every pointer's alignment): checked before any launch.
template <class A>
void check_vec(int64_t step, const A& a) {
  if (a.vec == 0) return;
  if (a.vec != 1 && a.vec != 2 && a.vec != 4 && a.vec != 8)
    value_error("vec must be 0 (the launcher's choice), 1, 2, 4 or 8, got " + num(int64_t(a.vec)));
  if (elman::diagonal_plan(int(step), a).vec == 0)
    value_error("vec " + num(int64_t(a.vec)) + " does not suit this call: it must divide B * D = " +
                num(int64_t(a.batch) * a.dim) + ", fit in 16 bytes and every pointer's alignment");
}

void forward(int64_t step, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
             const at::Tensor& h0, at::Tensor& out, at::Tensor& h_all, int64_t vec) {
  const auto info = step_of(step);
  check_count("inputs", inputs.size(), info.inputs, info);
  check_count("params", params.size(), info.params, info);
  const auto check = elman::check::leading(inputs[0], "inputs[0]", 3, kDims, {at::kFloat, at::kBFloat16});
  const int64_t T = inputs[0].size(0), B = inputs[0].size(1), D = inputs[0].size(2);
  sizes(T, B, D);
  check_list(check, inputs, "inputs", {T, B, D});
  check_params(params, inputs[0].device(), D);
  check(h0, "h0", {B, D});
  check(out, "out", {T, B, D});
  check(h_all, "h_all", {T + 1, B, D});
  const c10::cuda::CUDAGuard guard(inputs[0].device());
  elman::DiagonalForward a;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.bf16 = inputs[0].scalar_type() == at::kBFloat16;
  a.steps = int(T); a.batch = int(B); a.dim = int(D);
  for (size_t i = 0; i < inputs.size(); ++i) a.inputs[i] = inputs[i].data_ptr();
  for (size_t j = 0; j < params.size(); ++j) a.params[j] = params[j].data_ptr<float>();
  a.h0 = h0.data_ptr();
  a.out = out.data_ptr();
  a.h_all = h_all.data_ptr();
  a.vec = int(vec);
  check_vec(step, a);
  elman::check::cuda(elman::diagonal_forward(int(step), a), "diagonal scan forward");
}

void backward(int64_t step, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
              const at::Tensor& h_all, const at::Tensor& d_out, const at::Tensor& d_hT,
              std::vector<at::Tensor>& d_inputs, at::Tensor& dh0, at::Tensor& d_params, int64_t vec) {
  const auto info = step_of(step);
  check_count("inputs", inputs.size(), info.inputs, info);
  check_count("params", params.size(), info.params, info);
  check_count("input gradients", d_inputs.size(), info.inputs, info);
  const auto check = elman::check::leading(inputs[0], "inputs[0]", 3, kDims, {at::kFloat, at::kBFloat16});
  const int64_t T = inputs[0].size(0), B = inputs[0].size(1), D = inputs[0].size(2);
  sizes(T, B, D);
  check_list(check, inputs, "inputs", {T, B, D});
  check_params(params, inputs[0].device(), D);
  check(h_all, "h_all", {T + 1, B, D});
  check(d_out, "d_out", {T, B, D});
  check(d_hT, "d_hT", {B, D});
  check_list(check, d_inputs, "d_inputs", {T, B, D});
  check(dh0, "dh0", {B, D});
  const elman::check::Tensors fp32{inputs[0].device(), at::kFloat};
  fp32(d_params, "d_params", {int64_t(info.params), B, D});
  const c10::cuda::CUDAGuard guard(inputs[0].device());
  elman::DiagonalBackward a;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.bf16 = inputs[0].scalar_type() == at::kBFloat16;
  a.steps = int(T); a.batch = int(B); a.dim = int(D);
  for (size_t i = 0; i < inputs.size(); ++i) {
    a.inputs[i] = inputs[i].data_ptr();
    a.d_inputs[i] = d_inputs[i].data_ptr();
  }
  for (size_t j = 0; j < params.size(); ++j) a.params[j] = params[j].data_ptr<float>();
  a.h_all = h_all.data_ptr();
  a.d_out = d_out.data_ptr();
  a.d_hT = d_hT.data_ptr();
  a.dh0 = dh0.data_ptr();
  a.d_params = info.params > 0 ? d_params.data_ptr<float>() : nullptr;
  a.vec = int(vec);
  check_vec(step, a);
  elman::check::cuda(elman::diagonal_backward(int(step), a), "diagonal scan backward");
}

py::dict steps() {
  py::dict d;
  for (int i = 0; i < elman::diagonal_step_count(); ++i) {
    const auto s = elman::diagonal_step_info(i);
    py::dict info;
    info["id"] = s.id;
    info["inputs"] = s.inputs;
    info["params"] = s.params;
    d[py::str(s.name)] = info;
  }
  return d;
}

// The launch a forward or backward of this step, dtype and size takes (fresh, aligned tensors).
py::dict plan(int64_t step, int64_t B, int64_t D, bool bf16, bool backward, int64_t vec) {
  const auto info = step_of(step);
  if (B < 1 || D < 1) value_error("B and D must be at least 1");
  elman::ScanPlan p;
  if (backward) {
    elman::DiagonalBackward a;
    a.bf16 = bf16; a.steps = 1; a.batch = int(B); a.dim = int(D); a.vec = int(vec);
    check_vec(step, a);
    p = elman::diagonal_plan(info.id, a);
  } else {
    elman::DiagonalForward a;
    a.bf16 = bf16; a.steps = 1; a.batch = int(B); a.dim = int(D); a.vec = int(vec);
    check_vec(step, a);
    p = elman::diagonal_plan(info.id, a);
  }
  py::dict d;
  d["vec"] = p.vec;
  d["threads"] = p.threads;
  d["blocks"] = p.blocks;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elman diagonal-family kernels (lib/csrc/diagonal)";
  m.def("steps", &steps, "{name: {'id', 'inputs', 'params'}} of the step table");
  m.def("forward", &forward, "diagonal scan forward", py::arg("step"), py::arg("inputs"),
        py::arg("params"), py::arg("h0"), py::arg("out"), py::arg("h_all"), py::arg("vec") = 0);
  m.def("backward", &backward, "diagonal scan backward", py::arg("step"), py::arg("inputs"),
        py::arg("params"), py::arg("h_all"), py::arg("d_out"), py::arg("d_hT"), py::arg("d_inputs"),
        py::arg("dh0"), py::arg("d_params"), py::arg("vec") = 0);
  m.def("plan", &plan, "{'vec', 'threads', 'blocks'} of a launch", py::arg("step"), py::arg("B"),
        py::arg("D"), py::arg("bf16"), py::arg("backward"), py::arg("vec") = 0);
}
