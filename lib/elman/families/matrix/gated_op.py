"""The gated recurrence's CUDA op (lib/csrc/matrix/gated.cu): `gated.recurrence`, the whole
sequence in one launch per direction, the state checkpointed every K steps.

forward  (q, k, v, c, m, e, f, x, h0, rule, step, K) -> (o, S_T, ckpt)
backward (q, k, v, c, m, e, f, x, ckpt, d_o, d_S_T, rule, step, K) -> (dq, dk, dv, dc, dm, de, df, dx, dh0)

q, k [T, B, H, n] and v [T, B, H, v] are float32 or bfloat16 (o, dq, dk, dv take their dtype);
the column inputs c, e, f, x [T, B, H, v], the row modulation m [T, B, H, n], h0, S_T and the
checkpoints are float32 (`recurrence` casts them). One CTA per (batch, head), G threads per value
column each owning n / G rows of the state in registers (G = 8 up to v = 64, else 4), as the
matrix family's delta-rule kernels. The backward replays each chunk from its checkpoint into a
per-CTA scratch and walks it in reverse. K = 1 stores every state (the memory of an
uncheckpointed kernel); K = 16 stores one state in 16.

`engine="schedule"` runs the same schedule in PyTorch (`gated.schedule_forward/backward`): the
CPU tests check the mapping of every variant onto this op with it.
"""
from __future__ import annotations

import torch

from ...core import extension as ops
from ...core import validate
from . import gated
from .op import DTYPES, checkpoints

SIZES = (8, 16, 32, 48, 64, 96, 128)  # n and v the gated kernels take (every pair)
CHECKPOINT = 16
ENGINES = ("cuda", "schedule")
# The engine of this module's last forward and backward call (`elman train` records it for
# every layer: training/paths.py).
last_path: dict[str, str] = {}


def supported(n: int, v: int) -> bool:
    return n in SIZES and v in SIZES


def validate_call(q, k, v, c, m, e, f, h0, rule: str, step: str, K: int, engine: str = "cuda", x=None):
    """Every check that needs no GPU, then devices (CUDA for engine 'cuda'); (T, B, H, n, v)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    gated.check_rule(rule, step, e, f)
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"the checkpoint interval K must be a positive integer, got {K!r}")
    T, B, H, n = validate.sequence("k", k, "[T, B, H, n]")
    vd = validate.sequence("v", v, "[T, B, H, v]")[3]
    validate.shapes({"q": (q, (T, B, H, n)), "v": (v, (T, B, H, vd)), "c": (c, (T, B, H, vd)),
                     "m": (m, (T, B, H, n)), "e": (e, (T, B, H, vd)), "f": (f, (T, B, H, vd)),
                     "x": (x, (T, B, H, vd)),
                     "h0": (h0, (B, H, n, vd))})
    if engine == "cuda" and not supported(n, vd):
        raise ValueError(f"the gated matrix kernels take n and v in {SIZES}, got n={n}, v={vd}; "
                         "use backend='reference' for other sizes")
    validate.size_limit("T * B * H * max(n, v)", T * B * H * max(n, vd))
    validate.dtypes({"q": q, "k": k, "v": v}, DTYPES + ((torch.float64,) if engine == "schedule" else ()))
    for name, t in (("c", c), ("m", m), ("e", e), ("f", f), ("x", x), ("h0", h0)):
        if t is not None:
            validate.dtypes({name: t}, (torch.float32, torch.bfloat16, torch.float64))
    validate.devices({"q": q, "k": k, "v": v, "c": c, "m": m, "e": e, "f": f, "x": x, "h0": h0},
                     cuda=engine == "cuda")
    return T, B, H, n, vd


def _ext():
    return ops.load("matrix")


def forward(q, k, v, c, m, e, f, x, h0, rule: str, step: str, K: int):
    """The raw forward on validated, contiguous inputs: (o, S_T, ckpt)."""
    T, B, H, n = k.shape
    vd = v.shape[-1]
    o = ops.empty((T, B, H, vd), v)
    S_T = ops.empty((B, H, n, vd), h0)
    ckpt = ops.empty((checkpoints(T, K), B, H, n, vd), h0)
    _ext().gated_forward(q, k, v, c, m, e, f, h0, o, S_T, ckpt, gated.RULES.index(rule),
                         gated.STEPS.index(step), K, x)
    return o, S_T, ckpt


def backward(q, k, v, c, m, e, f, x, ckpt, d_o, d_ST, rule: str, step: str, K: int):
    """The raw backward: (dq, dk, dv, dc, dm, de, df, dh0, dx) (None for absent inputs)."""
    dq, dk, dv = ops.empty(q.shape, q), ops.empty(k.shape, k), ops.empty(v.shape, v)
    dc, dh0 = ops.empty(c.shape, c), ops.empty(d_ST.shape, d_ST)
    dm, de, df, dx = (None if t is None else ops.empty(t.shape, t) for t in (m, e, f, x))
    _ext().gated_backward(q, k, v, c, m, e, f, ckpt, d_o, d_ST, dq, dk, dv, dc, dm, de, df, dh0,
                          gated.RULES.index(rule), gated.STEPS.index(step), K, x, dx)
    return dq, dk, dv, dc, dm, de, df, dh0, dx


class _Gated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c, m, e, f, x, h0, rule, step, K, engine):
        if engine == "cuda":
            q, k, v = (validate.aligned(validate.contiguous(t)) for t in (q, k, v))
            o, S_T, ckpt = forward(q, k, v, c, m, e, f, x, h0, rule, step, K)
        else:
            o, S_T, ckpt = gated.schedule_forward(q, k, v, c, h0, rule, step, m, e, f, K, x)
        ctx.save_for_backward(q, k, v, c, m, e, f, x, ckpt)
        ctx.rule, ctx.step, ctx.K, ctx.engine = rule, step, K, engine
        last_path["forward"] = engine
        return o, S_T

    @staticmethod
    def backward(ctx, d_o, d_ST):
        q, k, v, c, m, e, f, x, ckpt = ctx.saved_tensors
        d_o = torch.zeros_like(v) if d_o is None else d_o.to(v.dtype).contiguous()
        d_ST = torch.zeros_like(ckpt[0]) if d_ST is None else d_ST.to(ckpt.dtype).contiguous()
        if ctx.engine == "cuda":
            grads = backward(q, k, v, c, m, e, f, x, ckpt, d_o, d_ST, ctx.rule, ctx.step, ctx.K)
        else:
            grads = gated.schedule_backward(q, k, v, c, ckpt, d_o, d_ST, ctx.rule, ctx.step, m, e, f, ctx.K, x)
        dq, dk, dv, dc, dm, de, df, dh0, dx = grads
        last_path["backward"] = ctx.engine
        return dq, dk, dv, dc, dm, de, df, dx, dh0, None, None, None, None


def recurrence(q, k, v, c, h0, rule: str, step: str = "tanh", m=None, e=None, f=None,
               K: int = CHECKPOINT, engine: str = "cuda", x=None):
    """The gated recurrence on the CUDA op (or its PyTorch schedule): (o [T, B, H, v] in q's
    dtype, S_T [B, H, n, v] float32). c, m, e, f, x (the erase) and h0 are computed with in
    float32."""
    validate_call(q, k, v, c, m, e, f, h0, rule, step, K, engine, x)
    acc = torch.float64 if h0.dtype == torch.float64 and engine == "schedule" else torch.float32
    cast = lambda t: None if t is None else t.to(acc).contiguous()  # noqa: E731
    return _Gated.apply(q, k, v, cast(c), cast(m), cast(e), cast(f), cast(x), cast(h0), rule, step, K, engine)
