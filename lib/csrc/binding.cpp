// The one binding file: validates every input before any launch (device, dtype,
// contiguity, shapes, supported sizes) and dispatches to the plain C++ launchers.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dense.h"

namespace {

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
}

struct Check {
  at::Device device;
  at::ScalarType dtype;
  void operator()(const at::Tensor& t, const char* name, std::vector<int64_t> shape) const {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device());
    TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the other inputs are on ",
                device);
    TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), "; expected ", dtype,
                " (all tensors of one call share a dtype)");
    TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " has shape ", t.sizes(), "; expected ",
                at::IntArrayRef(shape));
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
  }
};

// Integers go into messages as strings: streaming a 64-bit integer into TORCH_CHECK's
// message instantiates std::ostream::operator<<(long) in this module, and on the H100 host
// that copy crashed the process (segfault inside the insertion, run dev-s3a) instead of
// raising.
std::string num(int64_t v) { return std::to_string(v); }

Check leading(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.is_cuda(), name, " must be a CUDA tensor, got one on ", x.device());
  TORCH_CHECK(x.dim() == 3, name, " must be [T, B, D], got ", num(x.dim()), " dimensions");
  TORCH_CHECK(x.size(0) >= 1 && x.size(1) >= 1 && x.size(2) >= 1, name,
              " must have T, B, D >= 1, got ", x.sizes());
  TORCH_CHECK(x.size(1) * x.size(2) < (int64_t(1) << 31), "B * D must be below 2^31");
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "the dense kernels take float32 or bfloat16, got ",
              dt);
  return Check{x.device(), dt};
}

void check_epilogue(int64_t epilogue) {
  TORCH_CHECK(epilogue == elman::kTanhSiluGate, "unknown dense epilogue id ", num(epilogue));
}

// The persistent kernels stage their per-step inputs with 16-byte copies (cp.async): a
// contiguous view that starts at an odd element (a storage offset not a multiple of 8) would
// make them fault and take the CUDA context with it.
void check_aligned(const at::Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must start at a 16-byte aligned address for the persistent kernel (it is a view "
              "with storage offset ", num(t.storage_offset()), "); pass a copy (.clone()) or use "
              "path='steps'");
}

// The staging buffer of the persistent kernel's state exchange, after checking it takes
// the size.
at::Tensor persistent_xchg(const at::Tensor& like, int64_t B, int64_t D, bool backward) {
  TORCH_CHECK(like.scalar_type() == at::kBFloat16,
              "the persistent kernel is bf16 only; float32 takes path='steps'");
  const auto plan = elman::dense_persistent_plan(int(B), int(D), backward);
  TORCH_CHECK(plan.ok, "the persistent kernel does not take B=", num(B), ", D=", num(D), ": ",
              plan.reason);
  return at::empty({int64_t(plan.xchg_bytes)}, like.options().dtype(at::kByte));
}

void dense_forward(const at::Tensor& wx, const at::Tensor& z, const at::Tensor& w_h,
                   const at::Tensor& b, const at::Tensor& h0, at::Tensor& out, at::Tensor& h_all,
                   int64_t epilogue, bool persistent, const c10::optional<at::Tensor>& trace) {
  const Check check = leading(wx, "wx");
  const int64_t T = wx.size(0), B = wx.size(1), D = wx.size(2);
  check(wx, "wx", {T, B, D});
  check(z, "z", {T, B, D});
  check(w_h, "W_h", {D, D});
  check(b, "b", {D});
  check(h0, "h0", {B, D});
  check(out, "out", {T, B, D});
  check(h_all, "h_all", {T + 1, B, D});
  check_epilogue(epilogue);
  const at::Tensor xchg = persistent ? persistent_xchg(wx, B, D, false) : at::Tensor();
  if (persistent) {
    check_aligned(wx, "wx");
    check_aligned(z, "z");
  }
  long long* trace_ptr = nullptr;
  if (trace.has_value()) {
    TORCH_CHECK(persistent, "a trace is recorded by the persistent kernel only");
    Check{wx.device(), at::kLong}(*trace, "trace", {T * 6 + 4});
    trace_ptr = reinterpret_cast<long long*>(trace->data_ptr<int64_t>());
  }
  const c10::cuda::CUDAGuard guard(wx.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (persistent) {
    check_cuda(elman::dense_persistent_forward(stream, int(epilogue), int(T), int(B), int(D),
                                               wx.data_ptr(), z.data_ptr(), w_h.data_ptr(),
                                               b.data_ptr(), h0.data_ptr(), out.data_ptr(),
                                               h_all.data_ptr(), xchg.data_ptr(), trace_ptr),
               "dense persistent forward");
    return;
  }
  at::Tensor ws = at::empty({elman::dense_steps_splits(int(D)) * B * D}, wx.options().dtype(at::kFloat));
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  cudaError_t e;
  if (wx.scalar_type() == at::kFloat) {
    e = elman::dense_steps_forward<float>(handle, stream, int(epilogue), int(T), int(B), int(D),
                                          wx.data_ptr<float>(), z.data_ptr<float>(),
                                          w_h.data_ptr<float>(), b.data_ptr<float>(),
                                          h0.data_ptr<float>(), out.data_ptr<float>(),
                                          h_all.data_ptr<float>(), ws.data_ptr<float>());
  } else {
    using bf = __nv_bfloat16;
    e = elman::dense_steps_forward<bf>(
        handle, stream, int(epilogue), int(T), int(B), int(D), static_cast<const bf*>(wx.data_ptr()),
        static_cast<const bf*>(z.data_ptr()), static_cast<const bf*>(w_h.data_ptr()),
        static_cast<const bf*>(b.data_ptr()), static_cast<const bf*>(h0.data_ptr()),
        static_cast<bf*>(out.data_ptr()), static_cast<bf*>(h_all.data_ptr()), ws.data_ptr<float>());
  }
  check_cuda(e, "dense per-step forward");
}

void dense_backward(const at::Tensor& w_h, const at::Tensor& h_all, const at::Tensor& z,
                    const at::Tensor& d_out, const at::Tensor& d_hT, at::Tensor& dv, at::Tensor& dz,
                    at::Tensor& dh0, int64_t epilogue, bool persistent) {
  const Check check = leading(z, "z");
  const int64_t T = z.size(0), B = z.size(1), D = z.size(2);
  check(w_h, "W_h", {D, D});
  check(h_all, "h_all", {T + 1, B, D});
  check(z, "z", {T, B, D});
  check(d_out, "d_out", {T, B, D});
  check(d_hT, "d_hT", {B, D});
  check(dv, "dv", {T, B, D});
  check(dz, "dz", {T, B, D});
  check(dh0, "dh0", {B, D});
  check_epilogue(epilogue);
  const at::Tensor xchg = persistent ? persistent_xchg(z, B, D, true) : at::Tensor();
  if (persistent) {
    check_aligned(h_all, "h_all");
    check_aligned(z, "z");
    check_aligned(d_out, "d_out");
  }
  const c10::cuda::CUDAGuard guard(z.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (persistent) {
    check_cuda(elman::dense_persistent_backward(stream, int(epilogue), int(T), int(B), int(D),
                                                w_h.data_ptr(), h_all.data_ptr(), z.data_ptr(),
                                                d_out.data_ptr(), d_hT.data_ptr(), dv.data_ptr(),
                                                dz.data_ptr(), dh0.data_ptr(), xchg.data_ptr()),
               "dense persistent backward");
    return;
  }
  at::Tensor ws = at::empty({elman::dense_steps_splits(int(D)) * B * D}, z.options().dtype(at::kFloat));
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  cudaError_t e;
  if (z.scalar_type() == at::kFloat) {
    e = elman::dense_steps_backward<float>(
        handle, stream, int(epilogue), int(T), int(B), int(D), w_h.data_ptr<float>(),
        h_all.data_ptr<float>(), z.data_ptr<float>(), d_out.data_ptr<float>(),
        d_hT.data_ptr<float>(), dv.data_ptr<float>(), dz.data_ptr<float>(), dh0.data_ptr<float>(),
        ws.data_ptr<float>());
  } else {
    using bf = __nv_bfloat16;
    e = elman::dense_steps_backward<bf>(
        handle, stream, int(epilogue), int(T), int(B), int(D), static_cast<const bf*>(w_h.data_ptr()),
        static_cast<const bf*>(h_all.data_ptr()), static_cast<const bf*>(z.data_ptr()),
        static_cast<const bf*>(d_out.data_ptr()), static_cast<const bf*>(d_hT.data_ptr()),
        static_cast<bf*>(dv.data_ptr()), static_cast<bf*>(dz.data_ptr()),
        static_cast<bf*>(dh0.data_ptr()), ws.data_ptr<float>());
  }
  check_cuda(e, "dense per-step backward");
}

std::tuple<bool, std::string> dense_persistent_supported(int64_t B, int64_t D, bool bf16) {
  if (!bf16) return {false, "the persistent kernel is bf16 only"};
  const auto f = elman::dense_persistent_plan(int(B), int(D), false);
  const auto b = elman::dense_persistent_plan(int(B), int(D), true);
  if (!f.ok) return {false, f.reason};
  if (!b.ok) return {false, b.reason};
  return {true, ""};
}

py::dict dense_persistent_plan(int64_t B, int64_t D, bool backward) {
  const auto p = elman::dense_persistent_plan(int(B), int(D), backward);
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

cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }

unsigned* flags_of(const at::Tensor& flags, int64_t need) {
  TORCH_CHECK(flags.is_cuda() && flags.scalar_type() == at::kInt && flags.is_contiguous() &&
                  flags.numel() >= need,
              "flags must be a contiguous CUDA int32 tensor of at least ", need, " zeros");
  return reinterpret_cast<unsigned*>(flags.data_ptr<int>());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elman CUDA kernels (see lib/csrc)";
  m.def("dense_forward", &dense_forward, "dense-family recurrence forward", py::arg("wx"),
        py::arg("z"), py::arg("w_h"), py::arg("b"), py::arg("h0"), py::arg("out"),
        py::arg("h_all"), py::arg("epilogue"), py::arg("persistent"),
        py::arg("trace") = py::none());
  m.def("dense_backward", &dense_backward, "dense-family recurrence backward", py::arg("w_h"),
        py::arg("h_all"), py::arg("z"), py::arg("d_out"), py::arg("d_hT"), py::arg("dv"),
        py::arg("dz"), py::arg("dh0"), py::arg("epilogue"), py::arg("persistent"));
  m.def("dense_persistent_supported", &dense_persistent_supported,
        "(ok, reason): whether the persistent kernels take this B, D and dtype");
  m.def("dense_persistent_plan", &dense_persistent_plan, "launch shape of the persistent kernel");
  m.def("empty", [] { check_cuda(elman::launch_empty(current_stream()), "empty kernel"); });
  m.def("grid_sync", [](int64_t iters, bool use_cg, const at::Tensor& flags) {
    check_cuda(elman::launch_grid_sync(current_stream(), int(iters), use_cg, flags_of(flags, 1)),
               "grid sync");
  });
  m.def("flag_pingpong", [](int64_t iters, const at::Tensor& flags) {
    check_cuda(elman::launch_flag_pingpong(current_stream(), int(iters), flags_of(flags, 64)),
               "flag ping-pong");
  });
  m.def("cluster_sync", [](int64_t cluster, int64_t iters) {
    check_cuda(elman::launch_cluster_sync(current_stream(), int(cluster), int(iters)), "cluster sync");
  });
  m.def("dsmem_pingpong", [](int64_t iters) {
    check_cuda(elman::launch_dsmem_pingpong(current_stream(), int(iters)), "DSMEM ping-pong");
  });
  m.def("allgather", [](int64_t method, int64_t cluster, int64_t slice, int64_t iters,
                        const at::Tensor& scratch) {
    TORCH_CHECK(scratch.is_cuda() && scratch.is_contiguous() &&
                    scratch.nbytes() >= size_t(2 * cluster * slice),
                "scratch must be a contiguous CUDA tensor of at least 2 * cluster * slice bytes");
    check_cuda(elman::launch_allgather(current_stream(), int(method), int(cluster), int(slice),
                                       int(iters), scratch.data_ptr()),
               "all-gather");
  }, py::arg("method"), py::arg("cluster"), py::arg("slice"), py::arg("iters"), py::arg("scratch"));
  m.def("clock_probe", [](int64_t work, int64_t blocks, int64_t rounds, const at::Tensor& out) {
    TORCH_CHECK(out.is_cuda() && out.is_contiguous() && out.scalar_type() == at::kLong &&
                    out.numel() >= 2 * blocks,
                "out must be a contiguous CUDA int64 tensor of at least 2 * blocks elements");
    check_cuda(elman::launch_clock_probe(current_stream(), int(work), int(blocks), int(rounds),
                                         reinterpret_cast<long long*>(out.data_ptr<int64_t>())),
               "clock probe");
  }, py::arg("work"), py::arg("blocks"), py::arg("rounds"), py::arg("out"));
}
