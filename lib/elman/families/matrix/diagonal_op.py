"""E74's diagonal state on CUDA (lib/csrc/matrix/diagonal.cu): a vector s [n] per head, updated
elementwise, the whole sequence in one launch per direction.

Per step and channel, with c the per-step coefficient (unused by 'delta'):
    delta   p = s (1 - k^2) + v k
    simple  p = c s + v k
    ema     p = c s + (1 - c) v k
    s = act(p) (tanh or identity),  o = s q

One thread per channel; the forward stores the state after every step (one float per channel
and step, the size of the output, so nothing is recomputed) and the backward walks them in
reverse. `engine="schedule"` runs the same forward and hand-derived backward in PyTorch (the CPU
tests compare it with autograd of E74's reference).
"""
from __future__ import annotations

import torch

from ...core import extension as ops
from ...core import validate
from .op import DTYPES
from .reference import STEPS

RULES = ("delta", "simple", "ema")
ENGINES = ("cuda", "schedule")
# The engine of this module's last forward and backward call (`elman train` records it for
# every layer: training/paths.py).
last_path: dict[str, str] = {}


def coefficients(rule: str, c, v, k):
    """(A, W) with p = A s + W."""
    if rule == "delta":
        return 1 - k * k, v * k
    if rule == "simple":
        return c, v * k
    return c, (1 - c) * v * k


def schedule_forward(q, k, v, c, h0, rule: str, step: str):
    """(o, S_T, states [T, B, H, n]: the state after every step)."""
    s, outs, states = h0, [], []
    for t in range(k.shape[0]):
        A, W = coefficients(rule, c[t], v[t], k[t])
        p = A * s + W
        s = torch.tanh(p) if step == "tanh" else p
        states.append(s)
        outs.append(s * q[t])
    return torch.stack(outs), s, torch.stack(states)


def schedule_backward(q, k, v, c, h0, states, d_o, d_ST, rule: str, step: str):
    """Per step, from the gradient ds of s_t: ds += q do; dq = s_t do; dp = ds act'(s_t);
    dA = dp s_{t-1}; delta: dk = -2 k dA + dp v, dv = dp k; simple: dc = dA, dk = dp v, dv = dp k;
    ema: dc = dA - dp v k, dk = dp (1 - c) v, dv = dp (1 - c) k; ds_{t-1} = dp A.
    Returns (dq, dk, dv, dc, dh0)."""
    dq, dk, dv, dc = (torch.zeros_like(x) for x in (q, k, v, c))
    ds = d_ST.clone()
    for t in reversed(range(k.shape[0])):
        s_new, s_old = states[t], (states[t - 1] if t > 0 else h0)
        ds = ds + q[t] * d_o[t]
        dq[t] = s_new * d_o[t]
        dp = ds * (1 - s_new * s_new) if step == "tanh" else ds
        A, _ = coefficients(rule, c[t], v[t], k[t])
        dA = dp * s_old
        if rule == "delta":
            dk[t], dv[t] = -2 * k[t] * dA + dp * v[t], dp * k[t]
        elif rule == "simple":
            dc[t], dk[t], dv[t] = dA, dp * v[t], dp * k[t]
        else:
            dc[t], dk[t], dv[t] = dA - dp * v[t] * k[t], dp * (1 - c[t]) * v[t], dp * (1 - c[t]) * k[t]
        ds = dp * A
    return dq, dk, dv, dc, ds


def validate_call(q, k, v, c, h0, rule: str, step: str, engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if rule not in RULES:
        raise ValueError(f"the diagonal state's rule must be one of {RULES}, got {rule!r}")
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    T, B, H, n = validate.sequence("k", k, "[T, B, H, n]")
    validate.shapes({"q": (q, (T, B, H, n)), "v": (v, (T, B, H, n)), "c": (c, (T, B, H, n)),
                     "h0": (h0, (B, H, n))})
    validate.size_limit("T * B * H * n", T * B * H * n)
    validate.dtypes({"q": q, "k": k, "v": v}, DTYPES + ((torch.float64,) if engine == "schedule" else ()))
    for name, t in (("c", c), ("h0", h0)):
        validate.dtypes({name: t}, (torch.float32, torch.bfloat16, torch.float64))
    validate.devices({"q": q, "k": k, "v": v, "c": c, "h0": h0}, cuda=engine == "cuda")


class _Diagonal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c, h0, rule, step, engine):
        if engine == "cuda":
            q, k, v = (validate.contiguous(t) for t in (q, k, v))
            o, S_T = ops.empty(v.shape, v), ops.empty(h0.shape, h0)
            states = ops.empty(v.shape, h0)
            ops.load("matrix").diagonal_forward(q, k, v, c, h0, o, S_T, states, RULES.index(rule),
                                                STEPS.index(step))
        else:
            o, S_T, states = schedule_forward(q, k, v, c, h0, rule, step)
        ctx.save_for_backward(q, k, v, c, h0, states)
        ctx.rule, ctx.step, ctx.engine = rule, step, engine
        last_path["forward"] = engine
        return o, S_T

    @staticmethod
    def backward(ctx, d_o, d_ST):
        q, k, v, c, h0, states = ctx.saved_tensors
        d_o = torch.zeros_like(v) if d_o is None else d_o.to(v.dtype).contiguous()
        d_ST = torch.zeros_like(h0) if d_ST is None else d_ST.to(h0.dtype).contiguous()
        if ctx.engine == "cuda":
            dq, dk, dv = ops.empty(q.shape, q), ops.empty(k.shape, k), ops.empty(v.shape, v)
            dc, dh0 = ops.empty(c.shape, c), ops.empty(h0.shape, h0)
            ops.load("matrix").diagonal_backward(q, k, v, c, h0, states, d_o, d_ST, dq, dk, dv, dc, dh0,
                                                 RULES.index(ctx.rule), STEPS.index(ctx.step))
        else:
            dq, dk, dv, dc, dh0 = schedule_backward(q, k, v, c, h0, states, d_o, d_ST, ctx.rule, ctx.step)
        last_path["backward"] = ctx.engine
        return dq, dk, dv, dc, dh0, None, None, None


def recurrence(q, k, v, c, h0, rule: str, step: str = "tanh", engine: str = "cuda"):
    """The diagonal state on the CUDA op (or its PyTorch schedule): (o [T, B, H, n] in q's dtype,
    S_T [B, H, n] float32). c and h0 are computed with in float32."""
    validate_call(q, k, v, c, h0, rule, step, engine)
    acc = torch.float64 if h0.dtype == torch.float64 and engine == "schedule" else torch.float32
    return _Diagonal.apply(q, k, v, c.to(acc).contiguous(), h0.to(acc).contiguous(), rule, step, engine)
