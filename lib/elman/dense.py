"""The dense family's shared CUDA cell: one W_h h per step, an elementwise epilogue.

Cell (time-major, `[T, B, D]`):

    v_t = W_x x_t + W_h h_{t-1} + b,   h_t = tanh(v_t),   out_t = h_t * silu(z_t)

E1 feeds it `z` from its split projection; E0 feeds it `z = W_g x + b_g`. The input
projection `W_x x` for all T*B rows and the weight gradients after the loop are single
large GEMMs (torch/cuBLAS); the compiled op owns only the recurrence:

- forward  `(wx, z, W_h, b, h0) -> (out, h_all)` with `h_all[0] = h0`, `h_all[t+1] = h_t`;
- backward `(W_h, h_all, z, d_out, d_hT) -> (dv, dz, dh0)`.

Two implementations of the op exist: `persistent` (bf16; W_h stays in registers of a
thread-block cluster for the whole sequence; chapter "Kernel engineering") and `steps`
(one cuBLAS GEMM plus one fused elementwise kernel per step; any size, fp32 and bf16).
`path="auto"` takes the persistent kernel where it supports the size. `last_path` says
what ran.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import ops

PATHS = ("auto", "persistent", "steps")
GATE_SILU = 0  # epilogue id in lib/csrc/dense_cell.cuh: out = h * silu(z)
last_path: dict[str, str] = {}


def check_inputs(x: torch.Tensor, z: torch.Tensor, h0: torch.Tensor | None) -> None:
    """Shape checks shared by the reference and the CUDA path (clear errors first)."""
    if x.dim() != 3:
        raise ValueError(f"cell input must be [T, B, D], got shape {tuple(x.shape)}")
    if z.shape != x.shape:
        raise ValueError(f"z must have the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
    if h0 is not None and h0.shape != x.shape[1:]:
        raise ValueError(f"h0 must be [B, D] = {tuple(x.shape[1:])}, got {tuple(h0.shape)}")
    if x.shape[0] < 1:
        raise ValueError("the sequence must have at least one step (T >= 1)")


def plan(B: int, D: int, dtype: torch.dtype, path: str = "auto") -> str:
    """Which implementation runs for this size: 'persistent' or 'steps'."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    ext = ops.load()
    ok, why = ext.dense_persistent_supported(B, D, dtype == torch.bfloat16)
    if path == "persistent" and not ok:
        raise ValueError(f"the persistent kernel does not take B={B}, D={D}, {dtype}: {why}")
    if path == "steps":
        return "steps"
    return "persistent" if ok else "steps"


def paths(B: int, D: int, dtype: torch.dtype) -> list[str]:
    """Every implementation that runs this size (the parity suite checks each)."""
    return ["persistent", "steps"] if plan(B, D, dtype) == "persistent" else ["steps"]


class GatedCell(torch.autograd.Function):
    """Autograd over the compiled dense op (x, z, W_x, W_h, b, h0) -> (out, h_T)."""

    @staticmethod
    def forward(ctx, x, z, w_x, w_h, b, h0, path):
        T, B, D = x.shape
        chosen = plan(B, D, x.dtype, path)
        x, z, w_x, w_h, b, h0 = (t.contiguous() for t in (x, z, w_x, w_h, b, h0))
        wx = (x.reshape(T * B, D) @ w_x.t()).view(T, B, D)
        out = ops.empty((T, B, D), x)
        h_all = ops.empty((T + 1, B, D), x)
        ops.load().dense_forward(wx, z, w_h, b, h0, out, h_all, GATE_SILU, chosen == "persistent")
        ctx.save_for_backward(x, z, w_x, w_h, h_all)
        ctx.path = chosen
        last_path["forward"] = chosen
        return out, h_all[T]

    @staticmethod
    def backward(ctx, d_out, d_hT):
        x, z, w_x, w_h, h_all = ctx.saved_tensors
        T, B, D = x.shape
        d_out = (torch.zeros_like(x) if d_out is None else d_out).to(x.dtype).contiguous()
        d_hT = (torch.zeros_like(h_all[0]) if d_hT is None else d_hT).to(x.dtype).contiguous()
        dv = ops.empty((T, B, D), x)
        dz = ops.empty((T, B, D), x)
        dh0 = ops.empty((B, D), x)
        ops.load().dense_backward(w_h, h_all, z, d_out, d_hT, dv, dz, dh0, GATE_SILU,
                                  ctx.path == "persistent")
        last_path["backward"] = ctx.path
        dv2 = dv.view(T * B, D)
        dw_h = dv2.t() @ h_all[:T].reshape(T * B, D)
        dw_x = dv2.t() @ x.view(T * B, D)
        dx = (dv2 @ w_x).view(T, B, D)
        db = dv2.float().sum(0).to(x.dtype)
        return dx, dz, dw_x, dw_h, db, dh0, None


def gated_cell_cuda(x, z, w_x, w_h, b, h0=None, path: str = "auto"):
    """CUDA implementation of the gated cell; same signature as the references."""
    check_inputs(x, z, h0)
    for name, t in (("x", x), ("z", z), ("W_x", w_x), ("W_h", w_h), ("b", b)):
        if not t.is_cuda:
            raise ValueError(f"backend='cuda' needs CUDA tensors; {name} is on {t.device}")
    if h0 is None:
        h0 = x.new_zeros(x.shape[1:])
    return GatedCell.apply(x, z, w_x, w_h, b, h0, path)



def random_inputs(T: int, B: int, D: int, names: tuple[str, ...], device, generator,
                  radius: float = 0.99) -> dict[str, torch.Tensor]:
    """Fresh fp64 parity inputs for a dense cell (never zeros): activations ~ N(0, 1),
    square weights Xavier-uniform, W_h rescaled to spectral norm `radius` as the layer's
    spectral normalisation would, biases ~ N(0, 0.1), h0 ~ U(-0.5, 0.5)."""
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    a = (6.0 / (2 * D)) ** 0.5
    make = {
        "x": lambda: torch.randn(T, B, D, **kw),
        "z": lambda: torch.randn(T, B, D, **kw),
        "w_x": lambda: (torch.rand(D, D, **kw) * 2 - 1) * a,
        "w_g": lambda: (torch.rand(D, D, **kw) * 2 - 1) * a,
        "b": lambda: 0.1 * torch.randn(D, **kw),
        "b_g": lambda: 0.1 * torch.randn(D, **kw),
        "h0": lambda: torch.rand(B, D, **kw) - 0.5,
    }
    out = {}
    for n in names:
        if n == "w_h":
            w = torch.randn(D, D, **kw)
            out[n] = w * (radius / torch.linalg.matrix_norm(w, ord=2))
        else:
            out[n] = make[n]()
    return {k: v.requires_grad_() for k, v in out.items()}
