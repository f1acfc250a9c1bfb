// The two-GEMM family's binding (extension `elman_twogemm`): validates every input of a fused
// stage before its launch (common/check.h: device, dtype, exact shapes, contiguity, empty
// dimensions, supported sizes) and dispatches to the plain C++ launchers of twogemm.h. The
// per-step loops and their GEMMs are in lib/elman/families/twogemm/op.py.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

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

// The low-rank op's aux input ([T, B, D] or [B, D]): required for the gated modes only.
void check_aux(const elman::check::Tensors& check, const c10::optional<at::Tensor>& aux,
               int64_t mode, const std::vector<int64_t>& shape) {
  if (mode == elman::kTanhGate) return;
  if (!aux.has_value()) value_error("aux is required for low-rank mode " + num(mode));
  check(*aux, "aux", shape);
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
  check_aux(check, aux, mode, {B, D});
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
  check_aux(check, aux, mode, {B, D});
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

// ---- the low-rank persistent kernels -----------------------------------------------------------
// c [T, B, D], U [D, r], V [r, D] with r >= 1; returns r.
int64_t checked_rank(const elman::check::Tensors& check, const at::Tensor& c, const at::Tensor& u,
                     const at::Tensor& v, int64_t T, int64_t B, int64_t D) {
  elman::check::leading(u, "U", 2, "[D, r]", {at::kFloat, at::kBFloat16});
  const int64_t r = u.size(1);
  check_row_size(B, D);
  check(c, "c", {T, B, D});
  check(u, "U", {D, r});
  check(v, "V", {r, D});
  return r;
}

std::tuple<bool, std::string> lowrank_persistent_supported(int64_t B, int64_t D, int64_t r, bool bf16) {
  if (B < 1 || D < 1 || r < 1) return {false, "B, D and r must be at least 1"};
  if (B * D >= (int64_t(1) << 31) || r * D >= (int64_t(1) << 31)) return {false, "too large"};
  const auto plan = elman::lowrank_persistent_plan(int(B), int(D), int(r), bf16);
  return {plan.ok, std::string(plan.reason)};
}

// The persistent kernels stage [T, B, D] inputs by 16-byte copies.
void check_aligned16(std::initializer_list<std::pair<const at::Tensor*, const char*>> tensors) {
  for (const auto& [t, name] : tensors)
    if (t != nullptr && reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0)
      value_error(std::string(name) + " is not 16-byte aligned (the persistent kernel stages it "
                  "by 16-byte copies); pass a fresh contiguous tensor");
}

elman::LowRankPlan persistent_plan_checked(int64_t B, int64_t D, int64_t r, bool bf16) {
  const auto plan = elman::lowrank_persistent_plan(int(B), int(D), int(r), bf16);
  if (!plan.ok)
    value_error("the persistent kernel does not take B = " + num(B) + ", D = " + num(D) + ", r = " +
                num(r) + ": " + plan.reason + "; use path='graph' or 'steps'");
  return plan;
}

void lowrank_persistent_forward(int64_t mode, const at::Tensor& a, const at::Tensor& c,
                                const at::Tensor& u, const at::Tensor& v, const at::Tensor& b,
                                const at::Tensor& h0, at::Tensor& out, at::Tensor& h_all,
                                at::Tensor& p_all, const c10::optional<at::Tensor>& aux,
                                const c10::optional<at::Tensor>& trace) {
  check_mode(mode);
  const auto check = elman::check::leading(a, "a", 3, "[T, B, D]", {at::kFloat, at::kBFloat16});
  const int64_t T = a.size(0), B = a.size(1), D = a.size(2);
  const int64_t r = checked_rank(check, c, u, v, T, B, D);
  check(b, "b", {D});
  check(h0, "h0", {B, D});
  check(out, "out", {T, B, D});
  check(h_all, "h_all", {T + 1, B, D});
  check(p_all, "p_all", {T, B, r});
  check_aux(check, aux, mode, {T, B, D});
  const bool bf16 = a.scalar_type() == at::kBFloat16;
  const auto plan = persistent_plan_checked(B, D, r, bf16);
  check_aligned16({{&a, "a"}, {&c, "c"}, {&h_all, "h_all"}});
  const c10::cuda::CUDAGuard guard(a.device());
  elman::LowRankPersistent args = {};
  args.mode = int(mode); args.steps = int(T); args.batch = int(B); args.dim = int(D); args.rank = int(r);
  args.a = a.data_ptr(); args.c = c.data_ptr(); args.u = u.data_ptr(); args.v = v.data_ptr();
  args.b = b.data_ptr(); args.h0 = h0.data_ptr(); args.out = out.data_ptr();
  args.h_all = h_all.data_ptr(); args.p_all = p_all.data_ptr();
  args.aux = mode != elman::kTanhGate ? aux->data_ptr() : nullptr;
  if (trace.has_value()) {
    const int64_t n = T * elman::kLowRankTracePhases + 4;
    if (trace->scalar_type() != at::kLong || !trace->is_cuda() || !trace->is_contiguous() ||
        trace->numel() != n || trace->device() != a.device())
      value_error("trace must be a contiguous int64 CUDA tensor of T * " +
                  num(elman::kLowRankTracePhases) + " + 4 = " + num(n) + " elements on a's device");
    args.trace = reinterpret_cast<long long*>(trace->data_ptr<int64_t>());
  }
  args.stream = at::cuda::getCurrentCUDAStream();
  elman::check::cuda(elman::lowrank_persistent_forward<__nv_bfloat16>(plan, args),
                     "low-rank persistent forward");
}

void lowrank_persistent_backward(int64_t mode, const at::Tensor& c, const at::Tensor& u,
                                 const at::Tensor& v, const at::Tensor& h_all,
                                 const c10::optional<at::Tensor>& aux, const at::Tensor& d_out,
                                 const at::Tensor& d_hT, at::Tensor& d_pre, at::Tensor& d_c,
                                 at::Tensor& dp_all, at::Tensor& dh0) {
  check_mode(mode);
  const auto check = elman::check::leading(d_out, "d_out", 3, "[T, B, D]", {at::kFloat, at::kBFloat16});
  const int64_t T = d_out.size(0), B = d_out.size(1), D = d_out.size(2);
  const int64_t r = checked_rank(check, c, u, v, T, B, D);
  check(h_all, "h_all", {T + 1, B, D});
  check(d_hT, "d_hT", {B, D});
  check(d_pre, "d_pre", {T, B, D});
  check(d_c, "d_c", {T, B, D});
  check(dp_all, "dp_all", {T, B, r});
  check(dh0, "dh0", {B, D});
  check_aux(check, aux, mode, {T, B, D});
  const bool bf16 = d_out.scalar_type() == at::kBFloat16;
  const auto plan = persistent_plan_checked(B, D, r, bf16);
  check_aligned16({{&d_out, "d_out"}, {&c, "c"}, {&h_all, "h_all"},
                   {aux.has_value() ? &*aux : nullptr, "aux"}});
  const c10::cuda::CUDAGuard guard(d_out.device());
  elman::LowRankPersistent args = {};
  args.mode = int(mode); args.steps = int(T); args.batch = int(B); args.dim = int(D); args.rank = int(r);
  args.c = c.data_ptr(); args.u = u.data_ptr(); args.v = v.data_ptr();
  args.h_all = h_all.data_ptr();
  args.aux = mode != elman::kTanhGate ? aux->data_ptr() : nullptr;
  args.d_out = d_out.data_ptr(); args.d_hT = d_hT.data_ptr(); args.d_pre = d_pre.data_ptr();
  args.d_c = d_c.data_ptr(); args.dp_all = dp_all.data_ptr(); args.dh0 = dh0.data_ptr();
  args.stream = at::cuda::getCurrentCUDAStream();
  elman::check::cuda(elman::lowrank_persistent_backward<__nv_bfloat16>(plan, args),
                     "low-rank persistent backward");
}

// ---- E23's persistent kernels -----------------------------------------------------------------
std::tuple<bool, std::string> tape_persistent_supported(int64_t B, int64_t D, int64_t N, bool bf16) {
  if (B < 1 || D < 1 || N < 1) return {false, "B, D and N must be at least 1"};
  if (B * N * D >= (int64_t(1) << 31)) return {false, "too large"};
  const auto plan = elman::tape_persistent_plan(int(B), int(D), int(N), bf16);
  return {plan.ok, std::string(plan.reason)};
}

int64_t tape_persistent_interval(int64_t T, int64_t D, int64_t N) {
  if (T < 1 || D < 1 || N < 1 || T >= (int64_t(1) << 31)) return 0;
  return elman::tape_persistent_interval(int(T), int(D), int(N));
}

// The saved slot weights of the persistent backward: fp32 [T, B, N] on the device of `like`.
void check_slot_weights(const at::Tensor& w, const char* name, const at::Tensor& like, int64_t T,
                        int64_t B, int64_t N) {
  const elman::check::Tensors f32{like.device(), at::kFloat};
  f32(w, name, {T, B, N});
}

void tape_persistent_forward(const at::Tensor& wx, const at::Tensor& z, const at::Tensor& w_h,
                             const at::Tensor& w_wr, const at::Tensor& b, const at::Tensor& h0,
                             const at::Tensor& tape0, at::Tensor& out, at::Tensor& w_all,
                             at::Tensor& tape_T, at::Tensor& ckpt, int64_t interval,
                             const c10::optional<at::Tensor>& u_all,
                             const c10::optional<at::Tensor>& alpha_all,
                             const c10::optional<at::Tensor>& beta_all) {
  const auto check = elman::check::leading(wx, "wx", 3, "[T, B, D]", {at::kFloat, at::kBFloat16});
  const int64_t T = wx.size(0), B = wx.size(1), D = wx.size(2);
  const auto t = tape_sizes(tape0, "tape0");
  const int64_t N = t.N;
  if (interval < 1) value_error("the checkpoint interval must be at least 1, got " + num(interval));
  check(z, "z", {T, B, D});
  check(w_h, "W_h", {D, D});
  check(w_wr, "W_wr", {D, D});
  check(b, "b", {D});
  check(h0, "h0", {B, D});
  check(tape0, "tape0", {B, N, D});
  check(out, "out", {T, B, D});
  check(w_all, "w_all", {T + 1, B, D});
  check(tape_T, "tape_T", {B, N, D});
  check(ckpt, "ckpt", {(T + interval - 1) / interval, B, N, D});
  const bool saves = u_all.has_value();
  if (saves != alpha_all.has_value() || saves != beta_all.has_value())
    value_error("u_all, alpha_all and beta_all are given together or not at all");
  if (saves) {
    check(*u_all, "u_all", {T, B, D});
    check_slot_weights(*alpha_all, "alpha_all", wx, T, B, N);
    check_slot_weights(*beta_all, "beta_all", wx, T, B, N);
  }
  const bool bf16 = wx.scalar_type() == at::kBFloat16;
  const auto plan = elman::tape_persistent_plan(int(B), int(D), int(N), bf16);
  if (!plan.ok)
    value_error("the persistent kernel does not take B = " + num(B) + ", D = " + num(D) + ", N = " +
                num(N) + ": " + plan.reason + "; use path='graph' or 'steps'");
  const c10::cuda::CUDAGuard guard(wx.device());
  elman::TapePersistent a = {};
  a.steps = int(T); a.batch = int(B); a.dim = int(D); a.slots = int(N); a.interval = int(interval);
  a.wx = wx.data_ptr(); a.z = z.data_ptr(); a.w_h = w_h.data_ptr(); a.w_wr = w_wr.data_ptr();
  a.b = b.data_ptr(); a.h0 = h0.data_ptr(); a.tape0 = tape0.data_ptr(); a.out = out.data_ptr();
  a.w_all = w_all.data_ptr(); a.tape_T = tape_T.data_ptr(); a.ckpt = ckpt.data_ptr();
  a.u_all = saves ? u_all->data_ptr() : nullptr;
  a.alpha_all = saves ? alpha_all->data_ptr<float>() : nullptr;
  a.beta_all = saves ? beta_all->data_ptr<float>() : nullptr;
  a.stream = at::cuda::getCurrentCUDAStream();
  elman::check::cuda(elman::tape_persistent_forward<__nv_bfloat16>(plan, a),
                     "tape persistent forward");
}

std::tuple<bool, std::string> tape_persistent_backward_supported(int64_t B, int64_t D, int64_t N,
                                                                 int64_t interval, bool bf16) {
  if (B < 1 || D < 1 || N < 1 || interval < 1) return {false, "B, D, N and K must be at least 1"};
  if (B * N * D >= (int64_t(1) << 31)) return {false, "too large"};
  const auto plan = elman::tape_persistent_backward_plan(int(B), int(D), int(N), int(interval), bf16);
  return {plan.ok, std::string(plan.reason)};
}

void tape_persistent_backward(const at::Tensor& z, const at::Tensor& w_h, const at::Tensor& w_wr,
                              const at::Tensor& w_all, const at::Tensor& u_all,
                              const at::Tensor& alpha_all, const at::Tensor& beta_all,
                              const at::Tensor& ckpt, const at::Tensor& d_out,
                              const at::Tensor& d_hT, const at::Tensor& d_tapeT, at::Tensor& d_pre,
                              at::Tensor& d_u, at::Tensor& d_z, at::Tensor& dh0,
                              at::Tensor& d_tape0, int64_t interval) {
  const auto check = elman::check::leading(d_out, "d_out", 3, "[T, B, D]", {at::kFloat, at::kBFloat16});
  const int64_t T = d_out.size(0), B = d_out.size(1), D = d_out.size(2);
  if (interval < 1) value_error("the checkpoint interval must be at least 1, got " + num(interval));
  const auto t = tape_sizes(d_tapeT, "d_tapeT");
  const int64_t N = t.N;
  for (const auto& [x, name] : {std::pair<const at::Tensor&, const char*>{z, "z"}, {u_all, "u_all"},
                               {d_pre, "d_pre"}, {d_u, "d_u"}, {d_z, "d_z"}})
    check(x, name, {T, B, D});
  check(w_h, "W_h", {D, D});
  check(w_wr, "W_wr", {D, D});
  check(w_all, "w_all", {T + 1, B, D});
  check(ckpt, "ckpt", {(T + interval - 1) / interval, B, N, D});
  check(d_hT, "d_hT", {B, D});
  check(dh0, "dh0", {B, D});
  check_slot_weights(alpha_all, "alpha_all", d_out, T, B, N);
  check_slot_weights(beta_all, "beta_all", d_out, T, B, N);
  check_aligned16({{&z, "z"}, {&u_all, "u_all"}, {&w_all, "w_all"}, {&ckpt, "ckpt"}, {&d_out, "d_out"}});
  check_fp32_tape(d_tapeT, d_out, B, N, D);
  check_fp32_tape(d_tape0, d_out, B, N, D);
  const bool bf16 = d_out.scalar_type() == at::kBFloat16;
  const auto plan = elman::tape_persistent_backward_plan(int(B), int(D), int(N), int(interval), bf16);
  if (!plan.ok)
    value_error("the persistent backward does not take B = " + num(B) + ", D = " + num(D) + ", N = " +
                num(N) + ", K = " + num(interval) + ": " + plan.reason + "; use path='graph' or 'steps'");
  const c10::cuda::CUDAGuard guard(d_out.device());
  elman::TapePersistentBackward a = {};
  a.steps = int(T); a.batch = int(B); a.dim = int(D); a.slots = int(N); a.interval = int(interval);
  a.z = z.data_ptr(); a.w_h = w_h.data_ptr(); a.w_wr = w_wr.data_ptr(); a.w_all = w_all.data_ptr();
  a.u_all = u_all.data_ptr(); a.alpha_all = alpha_all.data_ptr<float>();
  a.beta_all = beta_all.data_ptr<float>(); a.ckpt = ckpt.data_ptr(); a.d_out = d_out.data_ptr();
  a.d_hT = d_hT.data_ptr(); a.d_tapeT = d_tapeT.data_ptr<float>(); a.d_pre = d_pre.data_ptr();
  a.d_u = d_u.data_ptr(); a.d_z = d_z.data_ptr(); a.dh0 = dh0.data_ptr();
  a.d_tape0 = d_tape0.data_ptr<float>();
  a.stream = at::cuda::getCurrentCUDAStream();
  elman::check::cuda(elman::tape_persistent_backward<__nv_bfloat16>(plan, a), "tape persistent backward");
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
  m.def("lowrank_persistent_supported", &lowrank_persistent_supported);
  m.def("lowrank_persistent_forward", &lowrank_persistent_forward, py::arg("mode"), py::arg("a"),
        py::arg("c"), py::arg("u"), py::arg("v"), py::arg("b"), py::arg("h0"), py::arg("out"),
        py::arg("h_all"), py::arg("p_all"), py::arg("aux"), py::arg("trace") = py::none());
  m.attr("lowrank_trace_phases") = elman::kLowRankTracePhases;
  m.def("lowrank_persistent_backward", &lowrank_persistent_backward);
  m.def("tape_persistent_supported", &tape_persistent_supported);
  m.def("tape_persistent_forward", &tape_persistent_forward);
  m.def("tape_persistent_backward_supported", &tape_persistent_backward_supported);
  m.def("tape_persistent_backward", &tape_persistent_backward);
  m.def("tape_persistent_interval", &tape_persistent_interval);
  m.attr("max_slots") = elman::kMaxSlots;
}
