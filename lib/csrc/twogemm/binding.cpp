// The two-GEMM family's binding (extension `elman_twogemm`): validates every input of a fused
// stage before its launch (common/check.h: device, dtype, exact shapes, contiguity, empty
// dimensions, supported sizes) and dispatches to the plain C++ launchers of twogemm.h. The
// per-step loops and their GEMMs are in lib/elman/families/twogemm/op.py.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>

#include "common/check.h"
#include "twogemm/twogemm.h"

namespace {

using elman::check::num;
using elman::check::value_error;

const char* kRow = "[B, D]";
const char* kTape = "[B, N, D]";

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

void check_mode(int64_t mode) {
  if (mode < 0 || mode >= elman::kLowRankModes)
    value_error("unknown low-rank mode " + num(mode) + "; the kernels take 0.." +
                num(elman::kLowRankModes - 1));
}

void check_row_size(int64_t B, int64_t D, int64_t N = 1) {
  if (B * N * D >= (int64_t(1) << 31))
    value_error("B * N * D = " + num(B * N * D) + " is too large: the kernels take below 2^31");
}

void lowrank_forward(int64_t mode, const at::Tensor& a, const at::Tensor& c, const at::Tensor& q,
                     const at::Tensor& b, const at::Tensor& h_prev, at::Tensor& h_next,
                     at::Tensor& out, const c10::optional<at::Tensor>& aux) {
  check_mode(mode);
  const auto check = elman::check::leading(a, "a", 2, kRow, {at::kFloat, at::kBFloat16});
  const int64_t B = a.size(0), D = a.size(1);
  check_row_size(B, D);
  check(c, "c", {B, D});
  check(q, "q", {B, D});
  check(b, "b", {D});
  check(h_prev, "h_prev", {B, D});
  check(h_next, "h_next", {B, D});
  check(out, "out", {B, D});
  if (mode != elman::kTanhGate) {
    if (!aux.has_value()) value_error("aux is required for low-rank mode " + num(mode));
    check(*aux, "aux", {B, D});
  }
  const c10::cuda::CUDAGuard guard(a.device());
  const cudaStream_t s = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    T* aux_p = mode != elman::kTanhGate ? ptr<T>(*aux) : nullptr;
    return elman::lowrank_forward<T>(int(mode), int(B), int(D), ptr<T>(a), ptr<T>(c), ptr<T>(q),
                                     ptr<T>(b), ptr<T>(h_prev), ptr<T>(h_next), ptr<T>(out), aux_p, s);
  };
  elman::check::cuda(a.scalar_type() == at::kFloat ? run(float{}) : run(__nv_bfloat16{}),
                     "low-rank forward stage");
}

void lowrank_backward(int64_t mode, const at::Tensor& d_out, const at::Tensor& c,
                      const at::Tensor& h_prev, const at::Tensor& h,
                      const c10::optional<at::Tensor>& aux, const at::Tensor& g, at::Tensor& d_pre,
                      at::Tensor& d_c, at::Tensor& g_out) {
  check_mode(mode);
  const auto check = elman::check::leading(d_out, "d_out", 2, kRow, {at::kFloat, at::kBFloat16});
  const int64_t B = d_out.size(0), D = d_out.size(1);
  check_row_size(B, D);
  check(c, "c", {B, D});
  check(h_prev, "h_prev", {B, D});
  check(h, "h", {B, D});
  check(g, "g", {B, D});
  check(d_pre, "d_pre", {B, D});
  check(d_c, "d_c", {B, D});
  check(g_out, "g_out", {B, D});
  if (mode != elman::kTanhGate) {
    if (!aux.has_value()) value_error("aux is required for low-rank mode " + num(mode));
    check(*aux, "aux", {B, D});
  }
  const c10::cuda::CUDAGuard guard(d_out.device());
  const cudaStream_t s = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* aux_p = mode != elman::kTanhGate ? ptr<T>(*aux) : nullptr;
    return elman::lowrank_backward<T>(int(mode), int(B), int(D), ptr<T>(d_out), ptr<T>(c),
                                      ptr<T>(h_prev), ptr<T>(h), aux_p, ptr<T>(g), ptr<T>(d_pre),
                                      ptr<T>(d_c), ptr<T>(g_out), s);
  };
  elman::check::cuda(d_out.scalar_type() == at::kFloat ? run(float{}) : run(__nv_bfloat16{}),
                     "low-rank backward stage");
}

// The tape's sizes: M is [B, N, D] with 1 <= N <= kMaxSlots.
struct TapeSizes {
  elman::check::Tensors check;
  int64_t B, N, D;
};

TapeSizes tape_sizes(const at::Tensor& m, const char* name) {
  const auto check = elman::check::leading(m, name, 3, kTape, {at::kFloat, at::kBFloat16});
  const int64_t B = m.size(0), N = m.size(1), D = m.size(2);
  if (N > elman::kMaxSlots)
    value_error("the tape kernels do not take N = " + num(N) + " slots (unsupported); they take 1 <= N <= " +
                num(elman::kMaxSlots));
  check_row_size(B, D, N);
  check(m, name, {B, N, D});
  return {check, B, N, D};
}

void check_fp32_tape(const at::Tensor& dm, const at::Tensor& m, int64_t B, int64_t N, int64_t D) {
  const elman::check::Tensors f32{m.device(), at::kFloat};
  f32(dm, "dM", {B, N, D});
}

void tape_read(const at::Tensor& wx, const at::Tensor& z, const at::Tensor& hw, const at::Tensor& b,
               const at::Tensor& m, const at::Tensor& w_prev, at::Tensor& w_out, at::Tensor& out) {
  const auto t = tape_sizes(m, "M");
  const int64_t B = t.B, D = t.D;
  for (const auto& [x, name] : {std::pair<const at::Tensor&, const char*>{wx, "wx"}, {z, "z"},
                               {hw, "hw"}, {w_prev, "w_prev"}, {w_out, "w_out"}, {out, "out"}})
    t.check(x, name, {B, D});
  t.check(b, "b", {D});
  const c10::cuda::CUDAGuard guard(m.device());
  const cudaStream_t s = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    return elman::tape_read<T>(int(B), int(t.N), int(D), ptr<T>(wx), ptr<T>(z), ptr<T>(hw),
                               ptr<T>(b), ptr<T>(m), ptr<T>(w_prev), ptr<T>(w_out), ptr<T>(out), s);
  };
  elman::check::cuda(m.scalar_type() == at::kFloat ? run(float{}) : run(__nv_bfloat16{}),
                     "tape read stage");
}

void tape_write(const at::Tensor& m_in, const at::Tensor& w, const at::Tensor& u, at::Tensor& m_out) {
  const auto t = tape_sizes(m_in, "M_in");
  t.check(m_out, "M_out", {t.B, t.N, t.D});
  t.check(w, "w", {t.B, t.D});
  t.check(u, "u", {t.B, t.D});
  const c10::cuda::CUDAGuard guard(m_in.device());
  const cudaStream_t s = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    return elman::tape_write<T>(int(t.B), int(t.N), int(t.D), ptr<T>(m_in), ptr<T>(w), ptr<T>(u),
                                ptr<T>(m_out), s);
  };
  elman::check::cuda(m_in.scalar_type() == at::kFloat ? run(float{}) : run(__nv_bfloat16{}),
                     "tape write stage");
}

void tape_write_backward(const at::Tensor& m, at::Tensor& dm, const at::Tensor& w,
                         const at::Tensor& u, const at::Tensor& d_out, const at::Tensor& z,
                         const at::Tensor& g, at::Tensor& gw, at::Tensor& du, at::Tensor& dz) {
  const auto t = tape_sizes(m, "M");
  const int64_t B = t.B, D = t.D;
  check_fp32_tape(dm, m, B, t.N, D);
  for (const auto& [x, name] : {std::pair<const at::Tensor&, const char*>{w, "w"}, {u, "u"},
                               {d_out, "d_out"}, {z, "z"}, {g, "g"}, {gw, "gw"}, {du, "du"},
                               {dz, "dz"}})
    t.check(x, name, {B, D});
  const c10::cuda::CUDAGuard guard(m.device());
  const cudaStream_t s = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    return elman::tape_write_backward<T>(int(B), int(t.N), int(D), ptr<T>(m), dm.data_ptr<float>(),
                                         ptr<T>(w), ptr<T>(u), ptr<T>(d_out), ptr<T>(z), ptr<T>(g),
                                         ptr<T>(gw), ptr<T>(du), ptr<T>(dz), s);
  };
  elman::check::cuda(m.scalar_type() == at::kFloat ? run(float{}) : run(__nv_bfloat16{}),
                     "tape write backward stage");
}

void tape_read_backward(const at::Tensor& m, at::Tensor& dm, const at::Tensor& w_prev,
                        const at::Tensor& w, const at::Tensor& gw, at::Tensor& d_pre,
                        at::Tensor& g_out) {
  const auto t = tape_sizes(m, "M");
  const int64_t B = t.B, D = t.D;
  check_fp32_tape(dm, m, B, t.N, D);
  for (const auto& [x, name] : {std::pair<const at::Tensor&, const char*>{w_prev, "w_prev"},
                               {w, "w"}, {gw, "gw"}, {d_pre, "d_pre"}, {g_out, "g_out"}})
    t.check(x, name, {B, D});
  const c10::cuda::CUDAGuard guard(m.device());
  const cudaStream_t s = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    return elman::tape_read_backward<T>(int(B), int(t.N), int(D), ptr<T>(m), dm.data_ptr<float>(),
                                        ptr<T>(w_prev), ptr<T>(w), ptr<T>(gw), ptr<T>(d_pre),
                                        ptr<T>(g_out), s);
  };
  elman::check::cuda(m.scalar_type() == at::kFloat ? run(float{}) : run(__nv_bfloat16{}),
                     "tape read backward stage");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elman two-GEMM family stages (lib/csrc/twogemm)";
  namespace py = pybind11;
  m.def("lowrank_forward", &lowrank_forward, py::arg("mode"), py::arg("a"), py::arg("c"),
        py::arg("q"), py::arg("b"), py::arg("h_prev"), py::arg("h_next"), py::arg("out"),
        py::arg("aux"));
  m.def("lowrank_backward", &lowrank_backward, py::arg("mode"), py::arg("d_out"), py::arg("c"),
        py::arg("h_prev"), py::arg("h"), py::arg("aux"), py::arg("g"), py::arg("d_pre"),
        py::arg("d_c"), py::arg("g_out"));
  m.def("tape_read", &tape_read);
  m.def("tape_write", &tape_write);
  m.def("tape_write_backward", &tape_write_backward);
  m.def("tape_read_backward", &tape_read_backward);
  m.attr("max_slots") = elman::kMaxSlots;
}
