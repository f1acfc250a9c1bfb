"""The nonlinear-delta op of the dense family (E63 a/b/c/d; chapter
book/chapters/e63_nonlinear_delta.ipynb): a gated blend of the state with a tanh candidate
that itself reads the state.

Time-major, with the input side precomputed for all T*B rows in one GEMM (outside the op):

    pre_t = [W_x x_t + b; W_alpha x_t + b_alpha; (W_beta x_t + b_beta)]    G = 2 or 3 blocks of D
    q_t   = W_rec h_{t-1},  W_rec = [W_h; (U_alpha; U_beta)]                R = 1 or 3 blocks
    v = tanh(pre_v + q_v),  alpha = sigmoid(pre_alpha [+ q_alpha]),  beta = sigmoid(pre_beta [+ q_beta])
    mode "a": h = alpha h_{t-1} + (1 - alpha) v       mode "b": h = alpha h_{t-1} + beta v
    mode "c": "b" with the U terms (R = 3)           mode "d": h = h_{t-1} + alpha v
    out = h * silu(h)

The compiled op (lib/csrc/dense/delta.*) owns the recurrence:
- forward  `(mode, pre, W_rec, h0) -> (out, h_all, act)`: per step one cuBLAS GEMM (E63c's three
  blocks in the same GEMM) and one fused elementwise kernel; `act` keeps the pre-activations
  (z_v, z_alpha, z_beta), from which the backward recomputes the activations in fp32 (a bf16
  copy of a saturated tanh or sigmoid would lose 1 - v^2 and alpha (1 - alpha) to rounding);
  the elementwise chain h_{t-1} -> h_t runs on an fp32 copy of the state (h_all, in the
  tensors' dtype, feeds the GEMM and the backward), so the bf16 state of E63d, which no gate
  contracts, does not accumulate a rounding per step;
- backward `(mode, W_rec, h_all, act, d_out, d_hT) -> (d_pre, dh0)`: per step one fused kernel
  (dh = carry + d_out * out'(h); every gate gradient of the step; carry = dh * dh_t/dh_{t-1})
  and one GEMM adding W_rec^T d_pre_rec to the carry. dW_rec is one GEMM after the loop.

Paths: `steps` (launched from the stream), `graph` (the same loop captured once per shape
in a CUDA graph and replayed) and, for modes a, b and d in bf16, `persistent`: the dense
family's persistent kernels (the sizes of op.persistent_size: cluster design at D = 256, 512,
768, 1024, wide cluster design at D = 1280, grid design at the other multiples of 128 up to
2048 with B <= 64)
with the epilogues `delta_complementary`, `delta_independent`, `delta_additive` of
lib/csrc/dense/epilogues.cuh. There W_h stays on chip for the whole sequence; the thread
that finishes an element of h_t keeps h_{t-1} (fp32) and, backward, the direct gradient term
dh_t * dh_t/dh_{t-1} in registers; the forward stores v_t (bf16) for the backward, which
produces the gate gradients after the product (dh q_i). The input side arrives as contiguous
planes [G, T, B, D] (wx = W_x x + b, then the gates' pre-activations). E63c has no persistent
path (`NO_PERSISTENT_63C` says why). `auto` takes `persistent` where it runs the size, else
`graph` (`steps` while the stream is itself being captured); `last_path` says what ran.
`emulate_forward` / `emulate_backward` state the per-step kernels' schedule in PyTorch and
`emulate_persistent_backward` the persistent epilogue's (CPU tests).
"""
from __future__ import annotations

import torch

from ...core import extension as ops
from ...core import validate
from .op import DTYPES, persistent_size, replay

MODES = {"a": 0, "b": 1, "c": 2, "d": 3}
CHANNELS = {"a": 2, "b": 3, "c": 3, "d": 2}   # G: input-side blocks (v, alpha[, beta])
RECURRENT = {"a": 1, "b": 1, "c": 3, "d": 1}  # R: blocks of W_rec (W_h[, U_alpha, U_beta])
PATHS = ("auto", "persistent", "graph", "steps")
RAW_PATHS = ("graph", "steps")
PERSISTENT_EPILOGUE = {"a": "delta_complementary", "b": "delta_independent", "d": "delta_additive"}
NO_PERSISTENT_63C = (
    "E63c has no persistent path (the persistent kernels do not support its gates): its gates "
    "read U_alpha h_{t-1} and U_beta h_{t-1}, so its "
    "recurrent matrix [W_h; U_alpha; U_beta] is 3D x D, and element r of h_t needs rows r, D + r "
    "and 2D + r. The persistent designs keep 64 rows of the matrix per CTA in registers (the "
    "cluster design: D / 16 registers a thread, 64 of the 128 a thread has at D = 1024; the "
    "grid design: a 64 x 512 tile) and finish exactly those rows' elements; three times the "
    "rows is 3 D / 16 registers a thread (192 at D = 1024) or three times the CTAs (48 at "
    "D = 1024, a cluster holds 16). Use path='graph' or 'steps' (path='auto' takes 'graph')")
last_path: dict[str, str] = {}


def _ext():
    return ops.load("dense")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"nonlinear-delta mode must be one of {tuple(MODES)}, got {mode!r}")


def check_path(path: str, mode: str = "a") -> None:
    """A clear error for a path this op does not run (E63c: no persistent path)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "persistent" and mode == "c":
        raise ValueError(NO_PERSISTENT_63C)


def persistent_supported(mode: str, B: int, D: int, dtype: torch.dtype) -> tuple[bool, str]:
    """(ok, reason): whether the persistent kernels run this mode and size (bf16 only; modes
    a, b, d; the sizes of the dense family's op.persistent_size, as the GPU holds them)."""
    check_mode(mode)
    if mode == "c":
        return False, NO_PERSISTENT_63C
    if dtype != torch.bfloat16:
        return False, "the persistent kernels are bf16 only"
    ok, why = persistent_size(B, D)
    if not ok:
        return False, why
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    eid = _ext().epilogues()[PERSISTENT_EPILOGUE[mode]]["id"]
    ok, why = _ext().persistent_supported(B, D, True, eid)
    return bool(ok), str(why)


def plan(mode: str, B: int, D: int, dtype: torch.dtype, path: str = "auto") -> str:
    """Which implementation runs this call: 'persistent', 'graph' or 'steps'."""
    check_mode(mode)
    check_path(path, mode)
    validate.nonempty("(B, D)", (B, D), "B and D")
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if path == "graph" and capturing:
        raise ValueError("path='graph' cannot run while the stream is being captured; use 'steps'")
    if path in ("auto", "persistent"):
        ok, why = persistent_supported(mode, B, D, dtype)
        if path == "persistent" and not ok:
            raise ValueError(f"the persistent kernel does not take E63{mode} at B={B}, D={D}, "
                             f"{dtype}: {why}")
        if ok:
            return "persistent"
    if path != "auto":
        return path
    return "steps" if capturing else "graph"


def paths(mode: str, B: int, D: int, dtype: torch.dtype) -> list[str]:
    """Every implementation that runs this mode and size (the parity suite checks each)."""
    check_mode(mode)
    validate.nonempty("(B, D)", (B, D), "B and D")
    persistent = persistent_supported(mode, B, D, dtype)[0]
    return (["persistent"] if persistent else []) + list(RAW_PATHS)


def validate_cell(mode: str, pre, w_rec, h0, path: str) -> None:
    """Everything about a call that needs no GPU: mode, path, ranks, empty dimensions, exact
    shapes, dtypes (float32 or bfloat16, all equal), then devices (all CUDA, one device)."""
    check_mode(mode)
    check_path(path, mode)
    T, B, GD = validate.sequence("pre", pre, "[T, B, G D]")
    G, R = CHANNELS[mode], RECURRENT[mode]
    if GD % G:
        raise ValueError(f"pre has last dimension {GD}; mode {mode!r} stacks {G} blocks of D")
    D = GD // G
    validate.size_limit("B * G * D", B * GD)
    validate.shapes({"W_rec": (w_rec, (R * D, D)), "h0": (h0, (B, D))})
    tensors = {"pre": pre, "W_rec": w_rec, "h0": h0}
    validate.dtypes(tensors, DTYPES)
    validate.devices(tensors)


# ---- the raw op on preallocated buffers ---------------------------------------------------
def _replayed(direction: str, args: dict, outs: dict) -> None:
    """`delta_forward` or `delta_backward` of the extension from a CUDA graph captured once per
    mode and shape (the dense family's graph cache, op.replay)."""
    mode = args.pop("mode")
    like = args["w_rec"]
    key = ("delta_" + direction, mode, *(tuple(v.shape) for v in args.values()), like.dtype,
           like.device)
    replay(key, lambda **static: getattr(_ext(), "delta_" + direction)(mode, **static), args, outs)


def forward_into(path: str, mode: str, pre, w_rec, h0, out, h_all, act) -> None:
    """The raw forward on preallocated buffers (`path` in graph, steps)."""
    if path not in RAW_PATHS:
        raise ValueError(f"path must be one of {RAW_PATHS}, got {path!r}")
    args = dict(pre=pre, w_rec=w_rec, h0=h0)
    outs = dict(out=out, h_all=h_all, act=act)
    if path == "graph":
        _replayed("forward", dict(mode=MODES[mode], **args), outs)
    else:
        _ext().delta_forward(MODES[mode], **args, **outs)


def backward_into(path: str, mode: str, w_rec, h_all, act, d_out, d_hT, d_pre, dh0) -> None:
    """The raw backward on preallocated buffers (`path` in graph, steps)."""
    if path not in RAW_PATHS:
        raise ValueError(f"path must be one of {RAW_PATHS}, got {path!r}")
    args = dict(w_rec=w_rec, h_all=h_all, act=act, d_out=d_out, d_hT=d_hT)
    outs = dict(d_pre=d_pre, dh0=dh0)
    if path == "graph":
        _replayed("backward", dict(mode=MODES[mode], **args), outs)
    else:
        _ext().delta_backward(MODES[mode], **args, **outs)


def persistent_forward_into(mode: str, planes, w_h, h0, out, h_all, v_all) -> None:
    """The persistent forward on preallocated buffers: `planes` [G, T, B, D] contiguous
    (wx = W_x x + b, then the gate pre-activations), `v_all` receives the candidate v."""
    eid = _ext().epilogues()[PERSISTENT_EPILOGUE[mode]]["id"]
    _ext().forward(eid, planes[0], list(planes[1:]), w_h, None, h0, out, h_all, True, v_all)


def persistent_backward_into(mode: str, w_h, h_all, v_all, planes, d_out, d_hT, dv, d_gates,
                             dh0) -> None:
    """The persistent backward on preallocated buffers: dv (of v's argument), the gates'
    pre-activation gradients and dh0."""
    eid = _ext().epilogues()[PERSISTENT_EPILOGUE[mode]]["id"]
    _ext().backward(eid, w_h, h_all, list(planes[1:]), d_out, d_hT, dv, list(d_gates), dh0, True,
                    v_all)


# ---- autograd -------------------------------------------------------------------------------
class DeltaCell(torch.autograd.Function):
    """Autograd over the compiled op (pre, W_rec, h0) -> (out, h_T)."""

    @staticmethod
    def forward(ctx, mode, path, pre, w_rec, h0):
        T, B, GD = pre.shape
        G = CHANNELS[mode]
        D = GD // G
        chosen = plan(mode, B, D, pre.dtype, path)
        pre, w_rec, h0 = (validate.contiguous(t) for t in (pre, w_rec, h0))
        out = ops.empty((T, B, D), pre)
        h_all = ops.empty((T + 1, B, D), pre)
        if chosen == "persistent":
            planes = pre.view(T, B, G, D).permute(2, 0, 1, 3).contiguous()
            v_all = ops.empty((T, B, D), pre)
            persistent_forward_into(mode, planes, w_rec, h0, out, h_all, v_all)
            ctx.save_for_backward(w_rec, h_all, v_all, planes)
        else:
            act = ops.empty((T, B, GD), pre)
            forward_into(chosen, mode, pre, w_rec, h0, out, h_all, act)
            ctx.save_for_backward(w_rec, h_all, act)
        ctx.mode, ctx.path = mode, chosen
        last_path["forward"] = chosen
        return out, h_all[T]

    @staticmethod
    def backward(ctx, d_out, d_hT):
        if ctx.path == "persistent":
            return DeltaCell._persistent_backward(ctx, d_out, d_hT)
        w_rec, h_all, act = ctx.saved_tensors
        T, B, GD = act.shape
        D = h_all.shape[2]
        RD = w_rec.shape[0]
        d_out = (act.new_zeros(T, B, D) if d_out is None else d_out).to(act.dtype).contiguous()
        d_hT = (act.new_zeros(B, D) if d_hT is None else d_hT).to(act.dtype).contiguous()
        d_pre = ops.empty((T, B, GD), act)
        dh0 = ops.empty((B, D), act)
        chosen = "steps" if ctx.path == "graph" and torch.cuda.is_current_stream_capturing() \
            else ctx.path
        backward_into(chosen, ctx.mode, w_rec, h_all, act, d_out, d_hT, d_pre, dh0)
        last_path["backward"] = chosen
        d_rec = d_pre.view(T * B, GD)[:, :RD]
        dw_rec = d_rec.t() @ h_all[:T].reshape(T * B, D)
        return None, None, d_pre, dw_rec, dh0

    @staticmethod
    def _persistent_backward(ctx, d_out, d_hT):
        w_h, h_all, v_all, planes = ctx.saved_tensors
        G, T, B, D = planes.shape
        d_out = (v_all.new_zeros(T, B, D) if d_out is None else d_out).to(v_all.dtype).contiguous()
        d_out = validate.aligned(d_out)
        d_hT = (v_all.new_zeros(B, D) if d_hT is None else d_hT).to(v_all.dtype).contiguous()
        dv = ops.empty((T, B, D), v_all)
        d_gates = [ops.empty((T, B, D), v_all) for _ in range(G - 1)]
        dh0 = ops.empty((B, D), v_all)
        persistent_backward_into(ctx.mode, w_h, h_all, v_all, planes, d_out, d_hT, dv, d_gates, dh0)
        last_path["backward"] = "persistent"
        d_pre = torch.stack([dv, *d_gates], 2).view(T, B, G * D)
        dw_h = dv.view(T * B, D).t() @ h_all[:T].reshape(T * B, D)
        return None, None, d_pre, dw_h, dh0


def cell(mode: str, pre: torch.Tensor, w_rec: torch.Tensor, h0: torch.Tensor | None = None,
         path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The nonlinear-delta cell on the GPU: returns (out [T, B, D], h_T [B, D]),
    differentiable in pre, W_rec and h0. Inputs are validated before the extension loads;
    unsupported input raises, never falls back."""
    validate_cell(mode, pre, w_rec, h0, path)
    if h0 is None:
        h0 = pre.new_zeros(pre.shape[1], pre.shape[2] // CHANNELS[mode])
    return DeltaCell.apply(mode, path, pre, w_rec, h0)


# ---- the kernels' schedule in PyTorch ------------------------------------------------------
def emulate_forward(mode: str, pre: torch.Tensor, w_rec: torch.Tensor, h0: torch.Tensor):
    """The forward loop as the kernels run it: one GEMM into q [B, R D] per step, then the
    elementwise step on the channel blocks. Returns (out, h_all, act), `act` holding the
    pre-activations (z_v, z_alpha[, z_beta]) the backward differentiates through."""
    T, B, GD = pre.shape
    G, R = CHANNELS[mode], RECURRENT[mode]
    D = GD // G
    h_all, outs, acts = [h0], [], []
    for t in range(T):
        hp = h_all[-1]
        q = hp @ w_rec.t()
        p = pre[t]
        z = [p[:, :D] + q[:, :D], p[:, D:2 * D] + (q[:, D:2 * D] if R == 3 else 0)]
        if G == 3:
            z.append(p[:, 2 * D:] + (q[:, 2 * D:] if R == 3 else 0))
        h = _update(mode, hp, *_activations(z))
        h_all.append(h)
        outs.append(h * h * torch.sigmoid(h))
        acts.append(torch.cat(z, 1))
    return torch.stack(outs), torch.stack(h_all), torch.stack(acts)


def _activations(z: list[torch.Tensor]) -> list[torch.Tensor]:
    """(v, alpha[, beta]) of the pre-activations (z_v, z_alpha[, z_beta])."""
    return [torch.tanh(z[0]), *(torch.sigmoid(zk) for zk in z[1:])]


def _update(mode: str, hp, v, alpha, beta=None):
    if mode == "a":
        return alpha * hp + (1 - alpha) * v
    if mode == "d":
        return hp + alpha * v
    return alpha * hp + beta * v


def emulate_backward(mode: str, w_rec, h_all, act, d_out, d_hT):
    """The backward loop as the kernels run it: per step the fused elementwise kernel (the
    activations recomputed from the stored pre-activations, dh, the step's pre-activation
    gradients, the elementwise carry) then carry += d_pre_rec W_rec. Returns (d_pre, dh0,
    dW_rec)."""
    T, B, GD = act.shape
    D = h_all.shape[2]
    G, RD = CHANNELS[mode], w_rec.shape[0]
    carry = d_hT.clone()
    d_pre = torch.empty_like(act)
    for t in range(T - 1, -1, -1):
        h, hp = h_all[t + 1], h_all[t]
        v, alpha, *beta = _activations([act[t, :, k * D:(k + 1) * D] for k in range(G)])
        s = torch.sigmoid(h)
        dh = carry + d_out[t] * s * (2 * h + h * h * (1 - s))
        parts = []
        if mode == "a":
            dv, d_alpha, carry = dh * (1 - alpha), dh * (hp - v), dh * alpha
        elif mode == "d":
            dv, d_alpha, carry = dh * alpha, dh * v, dh
        else:
            dv, d_alpha, carry = dh * beta[0], dh * hp, dh * alpha
            parts = [dh * v * beta[0] * (1 - beta[0])]
        d_pre[t] = torch.cat([dv * (1 - v * v), d_alpha * alpha * (1 - alpha)] + parts, 1)
        carry = carry + d_pre[t, :, :RD] @ w_rec
    dw_rec = d_pre.reshape(T * B, GD)[:, :RD].t() @ h_all[:T].reshape(T * B, D)
    return d_pre, carry, dw_rec


def emulate_persistent_forward(mode: str, pre: torch.Tensor, w_h: torch.Tensor, h0: torch.Tensor):
    """The persistent forward as its epilogue runs it (modes a, b, d): per element
    v = tanh(acc + wx), h = blend(v, h_{t-1}, alpha[, beta]) with h_{t-1} carried.
    Returns (out, h_all, v_all)."""
    T, B, GD = pre.shape
    G = CHANNELS[mode]
    D = GD // G
    h_all, outs, vs = [h0], [], []
    for t in range(T):
        hp = h_all[-1]
        p = [pre[t, :, k * D:(k + 1) * D] for k in range(G)]
        v = torch.tanh(hp @ w_h.t() + p[0])
        h = _update(mode, hp, v, *(torch.sigmoid(g) for g in p[1:]))
        h_all.append(h)
        vs.append(v)
        outs.append(h * h * torch.sigmoid(h))
    return torch.stack(outs), torch.stack(h_all), torch.stack(vs)


def _backward_factors(mode: str, d_out, h, hp, v, gates):
    """The persistent epilogue's factors before the product (epilogues.cuh DeltaBlend::
    backward_prev): c = d_out dout/dh, f, q_i and a such that dv = dh f, dg_i = dh q_i and the
    direct term to h_{t-1} is dh a."""
    s = torch.sigmoid(h)
    c = d_out * h * s * (2 + h * (1 - s))
    alpha = torch.sigmoid(gates[0])
    da, dt = alpha * (1 - alpha), 1 - v * v
    if mode == "a":
        return c, (1 - alpha) * dt, [(hp - v) * da], alpha
    if mode == "d":
        return c, alpha * dt, [v * da], torch.ones_like(alpha)
    beta = torch.sigmoid(gates[1])
    return c, beta * dt, [hp * da, v * beta * (1 - beta)], alpha


def emulate_persistent_backward(mode: str, w_h, h_all, v_all, pre, d_out, d_hT):
    """The persistent backward as its kernels run it: per step the factors before the product,
    then dh = acc + c + carry (acc = W_h^T dv_{t+1}, or d_hT at the last step), dv = dh f,
    dg_i = dh q_i, carry = dh a; finally dh0 = W_h^T dv_0 + carry. Returns (d_pre, dh0)."""
    T, B, GD = pre.shape
    G = CHANNELS[mode]
    D = GD // G
    carry = torch.zeros_like(d_hT)
    acc = d_hT
    d_pre = torch.empty_like(pre)
    for t in range(T - 1, -1, -1):
        gates = [pre[t, :, k * D:(k + 1) * D] for k in range(1, G)]
        c, f, q, a = _backward_factors(mode, d_out[t], h_all[t + 1], h_all[t], v_all[t], gates)
        dh = acc + c + carry
        dv = dh * f
        d_pre[t] = torch.cat([dv] + [dh * qi for qi in q], 1)
        carry = dh * a
        acc = dv @ w_h
    return d_pre, acc + carry
