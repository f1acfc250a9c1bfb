// The development extension `elman_dev`: the synchronisation probes of the "Kernel
// engineering" chapter (primitives.cu) and the traced persistent forward of the dense family
// (the dense sources compiled with ELMAN_TRACE; the production extension has neither).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "dense/binding.h"
#include "dense/dense.h"
#include "dev/primitives.h"

namespace {

using elman::check::num;
using elman::check::value_error;

cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }

unsigned* flags_of(const at::Tensor& flags, int64_t need) {
  if (!(flags.is_cuda() && flags.scalar_type() == at::kInt && flags.is_contiguous() &&
        flags.numel() >= need))
    value_error("flags must be a contiguous CUDA int32 tensor of at least " + num(need) + " zeros");
  return reinterpret_cast<unsigned*>(flags.data_ptr<int>());
}

// The persistent forward with CTA 0's per-step phase clocks in `trace` (int64 [T * 6 + 4]).
void dense_forward_traced(int64_t epilogue, const at::Tensor& wx,
                          const std::vector<at::Tensor>& gates, const at::Tensor& w_h,
                          const c10::optional<at::Tensor>& b, const at::Tensor& h0,
                          at::Tensor& out, at::Tensor& h_all, at::Tensor& trace) {
  elman::DenseForward a = elman::dense_forward_operands(epilogue, wx, gates, w_h, b, h0, out, h_all,
                                                        true, {at::kBFloat16});
  elman::check::Tensors{wx.device(), at::kLong}(trace, "trace", {int64_t(a.steps) * 6 + 4});
  const c10::cuda::CUDAGuard guard(wx.device());
  a.stream = current_stream();
  const auto plan = elman::dense_persistent_plan(int(epilogue), a.batch, a.dim, false, true);
  const at::Tensor xchg = at::empty({int64_t(plan.xchg_bytes)}, wx.options().dtype(at::kByte));
  a.xchg = xchg.data_ptr();
  elman::check::cuda(elman::dense_persistent_forward_traced(
                         int(epilogue), a, reinterpret_cast<long long*>(trace.data_ptr<int64_t>())),
                     "dense persistent forward (traced)");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elman development probes and traces (lib/csrc/dev)";
  m.def("dense_forward_traced", &dense_forward_traced,
        "the dense persistent forward, recording CTA 0's phase clocks of every step",
        py::arg("epilogue"), py::arg("wx"), py::arg("gates"), py::arg("w_h"), py::arg("b"),
        py::arg("h0"), py::arg("out"), py::arg("h_all"), py::arg("trace"));
  m.def("empty", [] { elman::check::cuda(elman::launch_empty(current_stream()), "empty kernel"); });
  m.def("grid_sync", [](int64_t iters, bool use_cg, const at::Tensor& flags) {
    elman::check::cuda(elman::launch_grid_sync(current_stream(), int(iters), use_cg, flags_of(flags, 1)),
                       "grid sync");
  });
  m.def("flag_pingpong", [](int64_t iters, const at::Tensor& flags) {
    elman::check::cuda(elman::launch_flag_pingpong(current_stream(), int(iters), flags_of(flags, 64)),
                       "flag ping-pong");
  });
  m.def("cluster_sync", [](int64_t cluster, int64_t iters) {
    elman::check::cuda(elman::launch_cluster_sync(current_stream(), int(cluster), int(iters)),
                       "cluster sync");
  });
  m.def("dsmem_pingpong", [](int64_t iters) {
    elman::check::cuda(elman::launch_dsmem_pingpong(current_stream(), int(iters)), "DSMEM ping-pong");
  });
  m.def("allgather", [](int64_t method, int64_t cluster, int64_t slice, int64_t iters,
                        const at::Tensor& scratch) {
    if (!(scratch.is_cuda() && scratch.is_contiguous() &&
          scratch.nbytes() >= size_t(2 * cluster * slice)))
      value_error("scratch must be a contiguous CUDA tensor of at least 2 * cluster * slice bytes");
    elman::check::cuda(elman::launch_allgather(current_stream(), int(method), int(cluster),
                                               int(slice), int(iters), scratch.data_ptr()),
                       "all-gather");
  }, py::arg("method"), py::arg("cluster"), py::arg("slice"), py::arg("iters"), py::arg("scratch"));
  m.def("clock_probe", [](int64_t work, int64_t blocks, int64_t rounds, const at::Tensor& out) {
    if (!(out.is_cuda() && out.is_contiguous() && out.scalar_type() == at::kLong &&
          out.numel() >= 2 * blocks))
      value_error("out must be a contiguous CUDA int64 tensor of at least 2 * blocks elements");
    elman::check::cuda(elman::launch_clock_probe(current_stream(), int(work), int(blocks),
                                                 int(rounds),
                                                 reinterpret_cast<long long*>(out.data_ptr<int64_t>())),
                       "clock probe");
  }, py::arg("work"), py::arg("blocks"), py::arg("rounds"), py::arg("out"));
  m.def("throughput", [](int64_t op, int64_t blocks, int64_t threads, int64_t iters,
                         const at::Tensor& out, const at::Tensor& sink) {
    if (!(out.is_cuda() && out.is_contiguous() && out.scalar_type() == at::kLong && out.numel() >= 3 * blocks))
      value_error("out must be a contiguous CUDA int64 tensor of at least 3 * blocks elements");
    if (!(sink.is_cuda() && sink.scalar_type() == at::kFloat && sink.numel() >= 1))
      value_error("sink must be a CUDA float32 tensor of at least one element");
    elman::check::cuda(elman::launch_throughput(current_stream(), int(op), int(blocks), int(threads),
                                                int(iters),
                                                reinterpret_cast<long long*>(out.data_ptr<int64_t>()),
                                                sink.data_ptr<float>()),
                       "throughput probe");
  }, py::arg("op"), py::arg("blocks"), py::arg("threads"), py::arg("iters"), py::arg("out"),
     py::arg("sink"));
}
