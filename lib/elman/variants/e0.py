"""E0, the stock Elman with a learned output gate. Chapter: book/chapters/e00_stock_elman.ipynb.

    x_t = W_in y_t  (no pre-activation; conv + silu only with use_conv)
    h_t = tanh(W_x x_t + W_h h_{t-1} + b),  c_t = h_t * silu(W_g x_t + b_g),  output W_out c_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..families.dense import inputs, op as dense
from ..core.entry import Entry, ParityCase, Shape, Tolerance
from ..core.spectral import RecurrentWeight
from ..core.layer import CausalConv, autocast_dtype, check_backend


def reference(x, w_x, w_h, w_g, b, b_g, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    dense.check_inputs(x, x, h0)
    T, B, D = x.shape
    h = x.new_zeros(B, D) if h0 is None else h0
    outs = []
    for t in range(T):
        h = torch.tanh(x[t] @ w_x.t() + h @ w_h.t() + b)
        outs.append(h * F.silu(x[t] @ w_g.t() + b_g))
    return torch.stack(outs), h


def cell(x, w_x, w_h, w_g, b, b_g, h0=None, backend: str = "cuda", path: str = "auto"):
    """E0's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the gate
    pre-activation W_g x + b_g is one GEMM for all steps; the recurrence is the dense op."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_x, w_h, w_g, b, b_g, h0)
    T, B, D = x.shape
    z = torch.addmm(b_g, x.reshape(T * B, D), w_g.t()).view(T, B, D)
    return dense.gated_cell_cuda(x, z, w_x, w_h, b, h0, path)


class E0(nn.Module):
    """E0 layer: `forward(y [B, T, d], h0=None) -> (out [B, T, d], h_T [B, D])`."""

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda",
                 r_h_mode: str = "spectral_norm", spectral_radius: float = 0.99,
                 r_h_init_gain: float = 0.1, use_conv: bool = False, d_conv: int = 4,
                 dropout: float = 0.0, path: str = "auto"):
        super().__init__()
        check_backend(backend)
        self.dim, self.inner = dim, int(dim * expansion)
        self.backend, self.path = backend, path
        D = self.inner
        self.w_in = nn.Parameter(torch.empty(D, dim))
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_h = RecurrentWeight(D, r_h_mode, spectral_radius, r_h_init_gain)
        self.w_g = nn.Parameter(torch.empty(D, D))
        self.b = nn.Parameter(torch.zeros(D))
        self.b_g = nn.Parameter(torch.zeros(D))
        self.w_out = nn.Parameter(torch.empty(dim, D))
        self.conv = CausalConv(D, d_conv) if use_conv else None
        self.dropout = nn.Dropout(dropout)
        for w in (self.w_in, self.w_x, self.w_g, self.w_out):
            nn.init.xavier_uniform_(w)

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        dt = autocast_dtype(y)
        x = y.transpose(0, 1).to(dt) @ self.w_in.to(dt).t()  # [T, B, D]
        if self.conv is not None:
            x = F.silu(self.conv(x))
        h0 = None if h0 is None else h0.to(dt)
        c, h = cell(x, self.w_x.to(dt), self.w_h().to(dt), self.w_g.to(dt), self.b.to(dt),
                    self.b_g.to(dt), h0, self.backend, self.path)
        out = self.dropout(c) @ self.w_out.to(dt).t()
        return out.transpose(0, 1), h


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 3 * D * D + 2 * D


def parity(shape: Shape, dtype, device, generator) -> list[ParityCase]:
    """One case per CUDA path that takes this size, on the same fresh inputs."""
    T, B, D = shape.T, shape.B, shape.D
    names = ("x", "w_x", "w_h", "w_g", "b", "b_g", "h0")
    inputs = inputs.random_inputs(T, B, D, names, device, generator)
    return [ParityCase(inputs, lambda p=p, **kw: cell(**kw, backend="cuda", path=p), reference,
                       ("out", "h_T"), "cuda:" + p) for p in dense.paths(B, D, dtype)]


ENTRIES = (Entry(
    family="dense", name="E0", kind="variant", aliases=("0",), layer=E0,
    title="Stock Elman: tanh recurrence, output h * silu(W_g x + b_g)",
    chapter="book/chapters/e00_stock_elman.ipynb",
    layer_params=layer_params, parity=parity, test_shapes=inputs.TEST_SHAPES,
    tolerance={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(1e-2, 2e-2)},
    cuda_op="dense_forward/dense_backward",
),)
