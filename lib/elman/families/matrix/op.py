"""The matrix family's CUDA op: the recurrence of `reference.recurrence`, the whole sequence in
one launch per direction (lib/csrc/matrix/).

forward  (q, k, v, decay, beta | None, h0, step, K) -> (o, S_T, ckpt)
backward (q, k, v, decay, beta | None, ckpt, d_o, d_S_T, step, K) -> (dq, dk, dv, d_decay, d_beta, dh0)

(`forward` and `backward` below allocate the outputs and call the extension, which writes them.)

q, k [T, B, H, n] and v [T, B, H, v] are float32 or bfloat16 (o and dq, dk, dv take their
dtype); decay ([T, B, H] or [T, B, H, v]), beta [T, B, H], h0 [B, H, n, v], S_T and the
checkpoints are float32 (`recurrence` casts them, so the decay is never rounded to bf16). Three
thread layouts (`group`; 0 takes the first that runs): the warp kernels (square n = v <= 32) give
each head one warp, a lane a block of n / 4 rows x n / 8 columns, inputs read one step ahead into
registers, no CTA barrier; the backward recomputes up to `slots` states of a chunk into the warp's
shared memory (as many as keep the whole grid resident) and walks them back with S_t and dS in
registers. The tiled kernels (n, v <= 64) give a head several warps that own whole state columns,
stage each chunk's inputs in shared memory one chunk ahead and sum columns through shared memory
once a step. RING (group 3) runs the warp kernels with their inputs copied by cp.async seven
steps ahead into a ring of rows in the warp's shared memory (the same arithmetic, so the same
results as WARP; the backward's ring follows its recompute-then-walk order). The column-group
kernels (every size) give a value column 4 threads of n / 4 rows
and replay each chunk into a global scratch. All store the state every K steps and read the same
checkpoints (`schedule.py` is the schedule in PyTorch, sub-chunks of `slots` included). With
bf16 tensors the tanh step runs the hardware's tanh.approx (relative error 2^-11, far inside the
bf16 tolerance; the backward differentiates the states it recomputes the same way), with fp32
tensors tanhf. Every input goes
through elman.core.validate before the extension is loaded.
"""
from __future__ import annotations

import torch

from ...core import extension as ops
from ...core import validate
from .reference import STEPS, decay_of

CHECKPOINT = 16                                   # K: steps between stored states
SIZES = (8, 16, 24, 32, 48, 64, 96, 128)          # n and v the kernels take (every pair)
DTYPES = (torch.float32, torch.bfloat16)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
GROUPS = (0, 4)  # 0: the fastest layout that runs; 4: threads a value column (every size)
WARP, TILED, RING, COLUMNS = 1, 2, 3, 4          # the explicit layouts (matrix.h)
WARP_SIZES = (8, 16, 24, 32)                      # square n = v the warp kernels take
TILED_MAX = 64
# The layout ('warp', 'ring', 'tiled', 'G4') of this module's last forward and backward call
# (`elman train` records it for every layer: training/paths.py).
last_path: dict[str, str] = {}


def groups(v: int) -> tuple[int, ...]:
    """The kernel layouts every (n, v) takes at this v (0 = default first); the parity cases
    run each."""
    return GROUPS


def layouts(n: int, v: int) -> tuple[int, ...]:
    """Every `group` the op takes at (n, v): 0, WARP and RING where the warp kernels fit, TILED
    where the tiled ones do, COLUMNS."""
    return ((0,) + ((WARP, RING) if warp(n, v) else ()) + ((TILED,) if n <= TILED_MAX and v <= TILED_MAX else ())
            + (COLUMNS,))


def warp(n: int, v: int, group: int = 0) -> bool:
    """Whether group `group` runs the warp kernels at (n, v) (16-byte aligned tensors, as the op
    allocates and `validate.aligned` makes them)."""
    return group in (0, WARP, RING) and n == v and n in WARP_SIZES


def tiled(n: int, v: int, group: int = 0) -> bool:
    """Whether group `group` runs the tiled kernels at this (n, v)."""
    return group in (0, TILED) and not warp(n, v, group) and n <= TILED_MAX and v <= TILED_MAX


def layout_name(n: int, v: int, group: int = 0) -> str:
    """'warp', 'ring' (the warp kernels fed by the cp.async ring), 'tiled' or 'G4': the layout
    group `group` runs at (n, v)."""
    if warp(n, v, group):
        return "ring" if group == RING else "warp"
    return "tiled" if tiled(n, v, group) else "G4"


def f32_input(t: torch.Tensor | None) -> torch.Tensor | None:
    """A float32 input as the kernels take it: contiguous and 16-byte aligned (a copy where it
    is not), so that the warp kernels never give way to the tiled ones (matrix_warp_runs in
    warp.cu) and `layout_name` is the layout that runs."""
    return None if t is None else validate.aligned(t.float().contiguous())


def supported(n: int, v: int) -> bool:
    return n in SIZES and v in SIZES


def _ext():
    return ops.load("matrix")


def validate_call(q, k, v, decay, beta, h0, step: str, K: int, group: int = 0) -> tuple[int, ...]:
    """Every check that needs no GPU, then devices; returns (T, B, H, n, v)."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"the checkpoint interval K must be a positive integer, got {K!r}")
    T, B, H, n = validate.sequence("k", k, "[T, B, H, n]")
    vd = validate.sequence("v", v, "[T, B, H, v]")[3]
    validate.shapes({"q": (q, (T, B, H, n)), "v": (v, (T, B, H, vd)), "h0": (h0, (B, H, n, vd)),
                     "beta": (beta, (T, B, H))})
    validate.sequence("decay", decay, "[T, B, H" + (", v]" if decay.dim() == 4 else "]"))
    if tuple(decay.shape[:2]) != (T, B):
        raise ValueError(f"decay has shape {list(decay.shape)}; expected [T={T}, B={B}, H={H}(, v={vd})]")
    decay_of(decay, H, vd)
    if not supported(n, vd):
        raise ValueError(f"the matrix kernels take n and v in {SIZES}, got n={n}, v={vd}; "
                         "use backend='reference' for other sizes")
    if group not in layouts(n, vd):
        raise ValueError(f"group must be one of {layouts(n, vd)} at n={n}, v={vd} (0: the fastest layout "
                         f"that runs, {WARP}: one warp a head, square n = v in {WARP_SIZES}, {RING}: the same fed by a "
                         f"cp.async input ring, {TILED}: tiled, "
                         f"n, v <= {TILED_MAX}, {COLUMNS}: threads a value column), got {group!r}")
    validate.size_limit("T * B * H * v", T * B * H * vd)
    validate.dtypes({"q": q, "k": k, "v": v}, DTYPES)
    validate.dtypes({"decay": decay}, STATE_DTYPES)
    if beta is not None:
        validate.dtypes({"beta": beta}, STATE_DTYPES)
    validate.dtypes({"h0": h0}, STATE_DTYPES)
    validate.devices({"q": q, "k": k, "v": v, "decay": decay, "beta": beta, "h0": h0})
    return T, B, H, n, vd


def checkpoints(T: int, K: int) -> int:
    return -(-T // K)


def forward(q, k, v, decay, beta, h0, step: str, K: int, group: int = 0):
    """The raw forward on validated, contiguous inputs (decay, beta, h0 float32):
    (o, S_T, ckpt), allocated by `extension.empty` (NaN inside `extension.poisoned()`)."""
    T, B, H, n = k.shape
    vd = v.shape[-1]
    o = ops.empty((T, B, H, vd), v)
    S_T = ops.empty((B, H, n, vd), h0)
    ckpt = ops.empty((checkpoints(T, K), B, H, n, vd), h0)
    _ext().forward(q, k, v, decay, beta, h0, o, S_T, ckpt, STEPS.index(step), K, group)
    return o, S_T, ckpt


def backward(q, k, v, decay, beta, ckpt, d_o, d_ST, step: str, K: int, group: int = 0, slots: int = 0):
    """The raw backward: (dq, dk, dv, d_decay, d_beta or None, dh0). `slots`: states the warp or
    tiled backward keeps in shared memory per sub-chunk (0: the most within its budget; fewer
    than K recomputes the chunk's head once more per sub-chunk)."""
    dq, dk, dv = ops.empty(q.shape, q), ops.empty(k.shape, k), ops.empty(v.shape, v)
    dd, dh0 = ops.empty(decay.shape, decay), ops.empty(d_ST.shape, d_ST)
    db = None if beta is None else ops.empty(beta.shape, beta)
    _ext().backward(q, k, v, decay, beta, ckpt, d_o, d_ST, dq, dk, dv, dd, db, dh0,
                    STEPS.index(step), K, group, slots)
    return dq, dk, dv, dd, db, dh0


class _Recurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, decay, beta, h0, step, K, group):
        q, k, v = (validate.aligned(validate.contiguous(t)) for t in (q, k, v))
        o, S_T, ckpt = forward(q, k, v, decay, beta, h0, step, K, group)
        last_path["forward"] = layout_name(k.shape[-1], v.shape[-1], group)
        ctx.save_for_backward(q, k, v, decay, beta, ckpt)
        ctx.step, ctx.K, ctx.group = step, K, group
        return o, S_T

    @staticmethod
    def backward(ctx, d_o, d_ST):
        q, k, v, decay, beta, ckpt = ctx.saved_tensors
        d_o = torch.zeros_like(v) if d_o is None else validate.aligned(d_o.to(v.dtype).contiguous())
        d_ST = torch.zeros_like(ckpt[0]) if d_ST is None else f32_input(d_ST)
        dq, dk, dv, dd, db, dh0 = backward(q, k, v, decay, beta, ckpt, d_o, d_ST, ctx.step, ctx.K,
                                           ctx.group)
        last_path["backward"] = layout_name(k.shape[-1], v.shape[-1], ctx.group)
        return dq, dk, dv, dd, db, dh0, None, None, None


def recurrence(q, k, v, decay, beta, h0, step: str = "tanh", K: int = CHECKPOINT, group: int = 0):
    """The CUDA recurrence: (o [T, B, H, v] in q's dtype, S_T [B, H, n, v] float32). decay,
    beta and h0 are computed with in float32 (cast here, differentiably). `group` picks the
    thread layout (`layouts(n, v)`; 0 = the default)."""
    validate_call(q, k, v, decay, beta, h0, step, K, group)
    return _Recurrence.apply(q, k, v, f32_input(decay), f32_input(beta), f32_input(h0), step, K, group)
