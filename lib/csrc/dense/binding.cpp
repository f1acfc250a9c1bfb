// The dense family's binding (extension `elman_dense`): validates every input before any
// launch (common/check.h: device, dtype, exact shapes, contiguity, alignment, empty
// dimensions, supported sizes) and dispatches to the plain C++ launchers of dense.h.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "dense/binding.h"
#include "dense/dense.h"

namespace {

using elman::check::num;
using elman::check::value_error;

const char* kDims = "[T, B, D]";
constexpr const char* kSteps = " or use path='steps'";

// The candidate plane of an epilogue that reads h_{t-1} (E63: v [T, B, D], written forward,
// read backward; persistent path only). Every other epilogue takes none.
void check_candidate(const elman::check::Tensors& check, int64_t epilogue,
                     const c10::optional<at::Tensor>& v_all, bool persistent, int64_t T,
                     int64_t B, int64_t D) {
  if (!elman::dense_epilogue_reads_prev(int(epilogue))) {
    if (v_all.has_value())
      value_error("epilogue " + num(epilogue) + " does not read h_{t-1}: pass no v_all");
    return;
  }
  if (!persistent)
    value_error("epilogue " + num(epilogue) + " reads h_{t-1} and runs on the persistent path "
                "only (E63's graph and steps paths are delta_forward / delta_backward)");
  if (!v_all.has_value()) value_error("epilogue " + num(epilogue) + " needs v_all [T, B, D]");
  check(*v_all, "v_all", {T, B, D});
  elman::check::aligned16(*v_all, "v_all", "");
}

void forward(int64_t epilogue, const at::Tensor& wx, const std::vector<at::Tensor>& gates,
             const at::Tensor& w_h, const c10::optional<at::Tensor>& b, const at::Tensor& h0,
             at::Tensor& out, at::Tensor& h_all, bool persistent,
             const c10::optional<at::Tensor>& v_all) {
  elman::DenseForward a = elman::dense_forward_operands(epilogue, wx, gates, w_h, b, h0, out, h_all,
                                                        persistent, {at::kFloat, at::kBFloat16});
  check_candidate(elman::check::Tensors{wx.device(), wx.scalar_type()}, epilogue, v_all, persistent,
                  wx.size(0), wx.size(1), wx.size(2));
  if (v_all.has_value()) a.v_all = v_all->data_ptr();
  const c10::cuda::CUDAGuard guard(wx.device());
  a.stream = at::cuda::getCurrentCUDAStream();
  if (persistent) {
    const auto plan = elman::dense_persistent_plan(int(epilogue), a.batch, a.dim, false);
    const at::Tensor xchg = at::empty({int64_t(plan.xchg_bytes)}, wx.options().dtype(at::kByte));
    a.xchg = xchg.data_ptr();
    elman::check::cuda(elman::dense_persistent_forward(int(epilogue), a), "dense persistent forward");
    return;
  }
  const int64_t BD = int64_t(a.batch) * a.dim;
  at::Tensor ws = at::empty({elman::dense_steps_splits(a.dim) * BD}, wx.options().dtype(at::kFloat));
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const cudaError_t e = wx.scalar_type() == at::kFloat
      ? elman::dense_steps_forward<float>(handle, int(epilogue), a, ws.data_ptr<float>())
      : elman::dense_steps_forward<__nv_bfloat16>(handle, int(epilogue), a, ws.data_ptr<float>());
  elman::check::cuda(e, "dense per-step forward");
}

void backward(int64_t epilogue, const at::Tensor& w_h, const at::Tensor& h_all,
              const std::vector<at::Tensor>& gates, const at::Tensor& d_out,
              const at::Tensor& d_hT, at::Tensor& dv, std::vector<at::Tensor> d_gates,
              at::Tensor& dh0, bool persistent, const c10::optional<at::Tensor>& v_all) {
  const auto check = elman::check::leading(d_out, "d_out", 3, kDims, {at::kFloat, at::kBFloat16});
  const int64_t T = d_out.size(0), B = d_out.size(1), D = d_out.size(2);
  check(d_out, "d_out", {T, B, D});
  if (B * D >= (int64_t(1) << 31)) value_error("B * D must be below 2^31, got " + num(B * D));
  const int n_gates = elman::dense_gates_of(epilogue);
  check(w_h, "W_h", {D, D});
  check(h_all, "h_all", {T + 1, B, D});
  elman::dense_check_gates(check, gates, n_gates, "gates", {T, B, D}, epilogue);
  check(d_hT, "d_hT", {B, D});
  check(dv, "dv", {T, B, D});
  elman::dense_check_gates(check, d_gates, n_gates, "d_gates", {T, B, D}, epilogue);
  check(dh0, "dh0", {B, D});
  check_candidate(check, epilogue, v_all, persistent, T, B, D);
  at::Tensor xchg;
  if (persistent) {
    const auto plan = elman::dense_persistent_plan_checked(epilogue, d_out, B, D, true);
    xchg = at::empty({int64_t(plan.xchg_bytes)}, d_out.options().dtype(at::kByte));
    elman::check::aligned16(h_all, "h_all", kSteps);
    elman::check::aligned16(d_out, "d_out", kSteps);
    for (size_t i = 0; i < gates.size(); ++i)
      elman::check::aligned16(gates[i], ("gates[" + num(int64_t(i)) + "]").c_str(), kSteps);
  }
  const c10::cuda::CUDAGuard guard(d_out.device());
  elman::DenseBackward a;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.steps = int(T); a.batch = int(B); a.dim = int(D);
  a.w_h = w_h.data_ptr();
  a.h_all = h_all.data_ptr();
  for (int i = 0; i < n_gates; ++i) {
    a.gates[i] = gates[i].data_ptr();
    a.d_gates[i] = d_gates[i].data_ptr();
  }
  a.d_out = d_out.data_ptr();
  a.d_hT = d_hT.data_ptr();
  a.dv = dv.data_ptr();
  a.dh0 = dh0.data_ptr();
  if (v_all.has_value()) a.v_all = v_all->data_ptr();
  if (persistent) {
    a.xchg = xchg.data_ptr();
    elman::check::cuda(elman::dense_persistent_backward(int(epilogue), a), "dense persistent backward");
    return;
  }
  at::Tensor ws = at::empty({elman::dense_steps_splits(int(D)) * B * D}, d_out.options().dtype(at::kFloat));
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const cudaError_t e = d_out.scalar_type() == at::kFloat
      ? elman::dense_steps_backward<float>(handle, int(epilogue), a, ws.data_ptr<float>())
      : elman::dense_steps_backward<__nv_bfloat16>(handle, int(epilogue), a, ws.data_ptr<float>());
  elman::check::cuda(e, "dense per-step backward");
}

py::dict epilogues() {
  py::dict d;
  for (int i = 0; i < elman::dense_epilogue_count(); ++i) {
    const auto e = elman::dense_epilogue_info(i);
    py::dict info;
    info["id"] = e.id;
    info["gates"] = e.gates;
    d[py::str(e.name)] = info;
  }
  return d;
}

std::tuple<bool, std::string> persistent_supported(int64_t B, int64_t D, bool bf16,
                                                   int64_t epilogue) {
  if (!bf16) return {false, "the persistent kernel is bf16 only"};
  if (B < 1 || D < 1) return {false, "B and D must be at least 1"};
  const auto f = elman::dense_persistent_plan(int(epilogue), int(B), int(D), false);
  const auto b = elman::dense_persistent_plan(int(epilogue), int(B), int(D), true);
  if (!f.ok) return {false, f.reason};
  if (!b.ok) return {false, b.reason};
  return {true, ""};
}

py::dict persistent_plan(int64_t B, int64_t D, bool backward, int64_t epilogue) {
  const auto p = elman::dense_persistent_plan(int(epilogue), int(B), int(D), backward);
  py::dict d;
  d["ok"] = p.ok;
  d["reason"] = std::string(p.reason);
  d["cluster"] = p.cluster;
  d["clusters"] = p.clusters;
  d["bc"] = p.bc;
  d["smem"] = p.smem;
  d["max_active_clusters"] = p.max_active;
  d["design"] = std::string(p.design);
  return d;
}

}  // namespace

void register_delta(pybind11::module& m);  // delta_binding.cpp: the nonlinear-delta op (E63)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elman dense-family kernels (lib/csrc/dense)";
  m.def("epilogues", &epilogues, "{name: {'id': int, 'gates': int}} of the epilogue table");
  m.def("forward", &forward, "dense-family recurrence forward", py::arg("epilogue"), py::arg("wx"),
        py::arg("gates"), py::arg("w_h"), py::arg("b"), py::arg("h0"), py::arg("out"),
        py::arg("h_all"), py::arg("persistent"), py::arg("v_all") = py::none());
  m.def("backward", &backward, "dense-family recurrence backward", py::arg("epilogue"),
        py::arg("w_h"), py::arg("h_all"), py::arg("gates"), py::arg("d_out"), py::arg("d_hT"),
        py::arg("dv"), py::arg("d_gates"), py::arg("dh0"), py::arg("persistent"),
        py::arg("v_all") = py::none());
  m.def("persistent_supported", &persistent_supported,
        "(ok, reason): whether the persistent kernels take this B, D and dtype", py::arg("B"),
        py::arg("D"), py::arg("bf16"), py::arg("epilogue") = 0);
  m.def("persistent_plan", &persistent_plan, "launch shape of the persistent kernel",
        py::arg("B"), py::arg("D"), py::arg("backward"), py::arg("epilogue") = 0);
  register_delta(m);
}
