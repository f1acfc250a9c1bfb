// Binding-side checks of the dense op's forward operands, shared by the production binding
// (binding.cpp) and the development one (dev/binding.cpp, the traced forward).
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/check.h"
#include "dense/dense.h"

namespace elman {

// The number of gate inputs of epilogue `id`; ValueError for an unknown id.
inline int dense_gates_of(int64_t id) {
  const int g = dense_epilogue_gates(int(id));
  if (g < 0) check::value_error("unknown dense epilogue id " + check::num(id) + " (see epilogues())");
  return g;
}

inline void dense_check_gates(const check::Tensors& check, const std::vector<at::Tensor>& gates,
                              int expected, const char* what, const std::vector<int64_t>& shape,
                              int64_t epilogue) {
  if (int(gates.size()) != expected)
    check::value_error("epilogue " + check::num(epilogue) + " takes " + check::num(expected) + " " +
                       what + ", got " + check::num(int64_t(gates.size())));
  for (size_t i = 0; i < gates.size(); ++i)
    check(gates[i], (std::string(what) + "[" + check::num(int64_t(i)) + "]").c_str(), shape);
}

// The persistent path's plan for this call, after checking it takes the size.
inline PersistentPlan dense_persistent_plan_checked(int64_t epilogue, const at::Tensor& like,
                                                    int64_t B, int64_t D, bool backward) {
  if (like.scalar_type() != at::kBFloat16)
    check::value_error("the persistent kernel is bf16 only; float32 takes path='steps'");
  const auto plan = dense_persistent_plan(int(epilogue), int(B), int(D), backward);
  if (!plan.ok)
    check::value_error("the persistent kernel does not take B=" + check::num(B) + ", D=" +
                       check::num(D) + ": " + plan.reason);
  return plan;
}

// Validates a forward call (every tensor's device, dtype, exact shape, contiguity; on the
// persistent path the size and 16-byte alignment of the staged inputs) and returns its
// operands, on the current stream. `xchg` is left for the caller.
inline DenseForward dense_forward_operands(int64_t epilogue, const at::Tensor& wx,
                                           const std::vector<at::Tensor>& gates,
                                           const at::Tensor& w_h,
                                           const c10::optional<at::Tensor>& b,
                                           const at::Tensor& h0, at::Tensor& out,
                                           at::Tensor& h_all, bool persistent,
                                           std::initializer_list<at::ScalarType> dtypes) {
  const auto check = check::leading(wx, "wx", 3, "[T, B, D]", dtypes);
  const int64_t T = wx.size(0), B = wx.size(1), D = wx.size(2);
  check(wx, "wx", {T, B, D});
  if (B * D >= (int64_t(1) << 31)) check::value_error("B * D must be below 2^31, got " + check::num(B * D));
  const int n_gates = dense_gates_of(epilogue);
  dense_check_gates(check, gates, n_gates, "gates", {T, B, D}, epilogue);
  check(w_h, "W_h", {D, D});
  if (b.has_value()) check(*b, "b", {D});
  check(h0, "h0", {B, D});
  check(out, "out", {T, B, D});
  check(h_all, "h_all", {T + 1, B, D});
  if (persistent) {
    dense_persistent_plan_checked(epilogue, wx, B, D, false);
    check::aligned16(wx, "wx", " or use path='steps'");
    for (size_t i = 0; i < gates.size(); ++i)
      check::aligned16(gates[i], ("gates[" + check::num(int64_t(i)) + "]").c_str(),
                       " or use path='steps'");
  }
  DenseForward a;
  a.stream = at::cuda::getCurrentCUDAStream();
  a.steps = int(T); a.batch = int(B); a.dim = int(D);
  a.wx = wx.data_ptr();
  for (int i = 0; i < n_gates; ++i) a.gates[i] = gates[i].data_ptr();
  a.w_h = w_h.data_ptr();
  a.b = b.has_value() ? b->data_ptr() : nullptr;
  a.h0 = h0.data_ptr();
  a.out = out.data_ptr();
  a.h_all = h_all.data_ptr();
  return a;
}

}  // namespace elman
