"""The diagonal family's CUDA op: an elementwise recurrence scanned over the whole sequence.

A step of the table in lib/csrc/diagonal/steps.cuh takes k per-step inputs u_1..u_k (the
pre-activations the variant's input GEMMs produce, [T, B, D] each) and p per-channel vectors
q_1..q_p ([D], fp32 inside the kernel), and maps the previous state to the next one, per
element:

    h_t = step(h_{t-1}, u_1[t], .., u_k[t]; q_1, .., q_p),   out_t = h_t * silu(h_t)

The input projections u_i = W_i x + b_i for all T*B rows are single GEMMs (torch/cuBLAS)
outside the op; the op owns only the recurrence:

- forward  `(step, inputs, params, h0) -> (out, h_all)` with `h_all[0] = h0`, `h_all[t+1] = h_t`;
- backward `(step, inputs, params, h_all, d_out, d_hT) -> (d_inputs, dh0, d_params)` where
  d_params holds per-sequence partial sums [p, B, D] (fp32) that `scan` sums over B.

One kernel launch walks all T steps for a block of channels of the flattened [B*D] step, the
state in registers, each step's inputs read once (16-byte accesses when B*D and the pointers
allow) and copied (cp.async) into a per-thread ring in shared memory several steps ahead of
their use, so that the loads stay in flight while earlier steps compute; the backward walks T
in reverse with the same layout, reading h_{t-1} from h_all once (h_t is the previous
iteration's h_{t-1}). `forward_bytes` and
`backward_bytes` state what each launch must move (the benchmark's bandwidth numerator).
Every input goes through elman.core.validate first; nothing falls back to the reference.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ...core import extension as ops
from ...core import validate

DTYPES = (torch.float32, torch.bfloat16)
last_path: dict[str, str] = {}


def _ext():
    return ops.load("diagonal")


def steps() -> dict[str, dict[str, int]]:
    """{name: {"id", "inputs", "params"}} of the compiled step table."""
    return {k: dict(v) for k, v in _ext().steps().items()}


def step_info(name: str) -> dict[str, int]:
    table = steps()
    if name not in table:
        raise ValueError(f"unknown diagonal step {name!r}; the table has {sorted(table)}")
    return table[name]


def validate_scan(inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                  h0: torch.Tensor | None) -> tuple[int, int, int]:
    """Everything about a scan call that needs no GPU: ranks, empty dimensions, exact shapes,
    dtypes (inputs and h0 share float32 or bfloat16; params float32 or bfloat16), devices
    (all CUDA, one device). Returns (T, B, D)."""
    for what, seq in (("inputs", inputs), ("params", params)):
        if not isinstance(seq, (tuple, list)):
            raise TypeError(f"{what} must be a tuple of tensors, got {type(seq).__name__}")
    if not inputs:
        raise ValueError("a diagonal step takes at least one [T, B, D] input")
    T, B, D = validate.sequence("inputs[0]", inputs[0])
    validate.size_limit("B * D", B * D)
    named_in = {f"inputs[{i}]": u for i, u in enumerate(inputs)}
    named_p = {f"params[{i}]": q for i, q in enumerate(params)}
    validate.shapes({**{n: (u, (T, B, D)) for n, u in named_in.items()},
                     **{n: (q, (D,)) for n, q in named_p.items()}, "h0": (h0, (B, D))})
    validate.dtypes({**named_in, "h0": h0}, DTYPES)
    if named_p:
        validate.dtypes(named_p, DTYPES)
    validate.devices({**named_in, **named_p, "h0": h0})
    return T, B, D


def plan(step: str, B: int, D: int, dtype: torch.dtype, vec: int = 0) -> dict[str, dict[str, int]]:
    """The launches of a scan at this size on fresh (aligned) tensors: {"fwd" | "bwd":
    {"vec": elements per thread, "threads": per block, "blocks"}}. `vec` 0: the launcher's
    choice; 1, 2, 4 or 8 forces that width (ValueError if B*D or 16 bytes do not allow it)."""
    validate.nonempty("(B, D)", (B, D), "B and D")
    sid, bf16 = step_info(step)["id"], dtype == torch.bfloat16
    return {d: dict(_ext().plan(sid, B, D, bf16, d == "bwd", vec)) for d in ("fwd", "bwd")}


def forward_bytes(k: int, p: int, T: int, B: int, D: int, itemsize: int) -> int:
    """Bytes the forward must move: k inputs read once, h0 read, out written, h_all (T + 1
    slices, h0 copied into slice 0) written, p fp32 vectors read."""
    return itemsize * (k * T * B * D + B * D + T * B * D + (T + 1) * B * D) + 4 * p * D


def backward_bytes(k: int, p: int, T: int, B: int, D: int, itemsize: int) -> int:
    """Bytes the backward must move: k inputs, d_out and h_all (T + 1 slices) read once, d_hT
    read, k input gradients and dh0 written, p fp32 vectors read, p fp32 partial sums [B, D]
    written."""
    return (itemsize * (k * T * B * D + T * B * D + (T + 1) * B * D + B * D
                        + k * T * B * D + B * D) + 4 * p * D + 4 * p * B * D)


def forward_into(step_id: int, inputs, params, h0, out, h_all, vec: int = 0) -> None:
    """The raw forward on preallocated buffers (params fp32, contiguous); `vec` as in `plan`."""
    _ext().forward(step_id, list(inputs), list(params), h0, out, h_all, vec)


def backward_into(step_id: int, inputs, params, h_all, d_out, d_hT, d_inputs, dh0, d_params,
                  vec: int = 0) -> None:
    """The raw backward on preallocated buffers; d_params is fp32 [p, B, D] (partial sums)."""
    _ext().backward(step_id, list(inputs), list(params), h_all, d_out, d_hT, list(d_inputs), dh0,
                    d_params, vec)


class DiagonalScan(torch.autograd.Function):
    """Autograd over the compiled scan (h0, *inputs, *params) -> (out, h_T)."""

    @staticmethod
    def forward(ctx, step_id, k, h0, *tensors):
        inputs = [validate.contiguous(u) for u in tensors[:k]]
        params = [q.detach().float().contiguous() for q in tensors[k:]]
        h0 = validate.contiguous(h0)
        T, B, D = inputs[0].shape
        out = ops.empty((T, B, D), inputs[0])
        h_all = ops.empty((T + 1, B, D), inputs[0])
        forward_into(step_id, inputs, params, h0, out, h_all)
        ctx.save_for_backward(h_all, *inputs, *params)
        ctx.step_id, ctx.k = step_id, k
        ctx.param_dtypes = [q.dtype for q in tensors[k:]]
        last_path["forward"] = "scan"
        return out, h_all[T]

    @staticmethod
    def backward(ctx, d_out, d_hT):
        h_all, *rest = ctx.saved_tensors
        inputs, params = rest[:ctx.k], rest[ctx.k:]
        T1, B, D = h_all.shape
        like = inputs[0]
        d_out = (torch.zeros_like(like) if d_out is None else d_out).to(like.dtype).contiguous()
        d_hT = (torch.zeros_like(h_all[0]) if d_hT is None else d_hT).to(like.dtype).contiguous()
        d_inputs = [ops.empty((T1 - 1, B, D), like) for _ in inputs]
        dh0 = ops.empty((B, D), like)
        d_params = ops.empty((len(params), B, D), like, torch.float32)
        backward_into(ctx.step_id, inputs, params, h_all, d_out, d_hT, d_inputs, dh0, d_params)
        last_path["backward"] = "scan"
        dq = [d_params[i].sum(0).to(dt) for i, dt in enumerate(ctx.param_dtypes)]
        return None, None, dh0, *d_inputs, *dq


def scan(step: str, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor] = (),
         h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The diagonal recurrence `step` (a name of `steps()`) on the GPU: returns (out [T, B, D],
    h_T [B, D]), differentiable in every input, every param and h0. Inputs are validated
    before the extension is loaded."""
    validate_scan(inputs, params, h0)
    info = step_info(step)
    if len(inputs) != info["inputs"] or len(params) != info["params"]:
        raise ValueError(f"step {step!r} takes {info['inputs']} input(s) and {info['params']} "
                         f"param(s), got {len(inputs)} and {len(params)}")
    if h0 is None:
        h0 = inputs[0].new_zeros(inputs[0].shape[1:])
    return DiagonalScan.apply(info["id"], len(inputs), h0, *inputs, *params)


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """W x + b for all T * B rows of x [T, B, D] in one GEMM: [T, B, D_out], contiguous."""
    T, B, D = x.shape
    x2 = x.reshape(T * B, D)
    y = x2 @ w.t() if b is None else torch.addmm(b, x2, w.t())
    return y.view(T, B, w.shape[0])


def cell(step: str, x: torch.Tensor, projections: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
         params: Sequence[torch.Tensor] = (), h0: torch.Tensor | None = None):
    """A diagonal variant's cell on the GPU: the projections (W_i, b_i) of x [T, B, D] as one
    GEMM each, then the scan of `step` over them. Shapes, dtypes and devices of every tensor
    are checked before any GEMM."""
    T, B, D = validate.sequence("x", x)
    weights = {}
    for i, (w, b) in enumerate(projections):
        weights[f"W[{i}]"], weights[f"b[{i}]"] = w, b
        validate.shapes({f"W[{i}]": (w, (D, D)), f"b[{i}]": (b, (D,))})
    named_p = {f"params[{i}]": q for i, q in enumerate(params)}
    validate.shapes({**{n: (q, (D,)) for n, q in named_p.items()}, "h0": (h0, (B, D))})
    validate.dtypes({"x": x, **weights, "h0": h0}, DTYPES)
    if named_p:
        validate.dtypes(named_p, DTYPES)
    validate.devices({"x": x, **weights, **named_p, "h0": h0})
    inputs = [project(x, w, b) for w, b in projections]
    return scan(step, inputs, params, h0)
