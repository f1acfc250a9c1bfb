"""E1, the Mamba-gated Elman. Chapter: book/chapters/e01_gated_elman.ipynb.

    [a_t; z_t] = W_in y_t,  x_t = silu(a_t)
    h_t = tanh(W_x x_t + W_h h_{t-1} + b),  c_t = h_t * silu(z_t),  output W_out c_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..families.dense import inputs, op as dense
from ..core.entry import Entry, ParityCase, Shape, Tolerance
from ..core.spectral import RecurrentWeight
from ..core.layer import CausalConv, autocast_dtype, check_backend


def reference(x, z, w_x, w_h, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    dense.check_inputs(x, z, h0)
    T, B, D = x.shape
    h = x.new_zeros(B, D) if h0 is None else h0
    outs = []
    for t in range(T):
        h = torch.tanh(x[t] @ w_x.t() + h @ w_h.t() + b)
        outs.append(h * F.silu(z[t]))
    return torch.stack(outs), h


def cell(x, z, w_x, w_h, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E1's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, z, w_x, w_h, b, h0)
    return dense.gated_cell_cuda(x, z, w_x, w_h, b, h0, path)


class E1(nn.Module):
    """E1 layer: `forward(y [B, T, d], h0=None) -> (out [B, T, d], h_T [B, D])`."""

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda",
                 r_h_mode: str = "spectral_norm", spectral_radius: float = 0.99,
                 r_h_init_gain: float = 0.1, use_conv: bool = False, d_conv: int = 4,
                 dropout: float = 0.0, path: str = "auto"):
        super().__init__()
        check_backend(backend)
        self.dim, self.inner = dim, int(dim * expansion)
        self.backend, self.path = backend, path
        D = self.inner
        self.w_in = nn.Parameter(torch.empty(2 * D, dim))
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_h = RecurrentWeight(D, r_h_mode, spectral_radius, r_h_init_gain)
        self.b = nn.Parameter(torch.zeros(D))
        self.w_out = nn.Parameter(torch.empty(dim, D))
        self.conv = CausalConv(D, d_conv) if use_conv else None
        self.dropout = nn.Dropout(dropout)
        for w in (self.w_in, self.w_x, self.w_out):
            nn.init.xavier_uniform_(w)

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        dt = autocast_dtype(y)
        yt = y.transpose(0, 1).to(dt)                       # [T, B, d]
        D = self.inner
        w_in = self.w_in.to(dt)
        a = yt @ w_in[:D].t()
        z = yt @ w_in[D:].t()
        if self.conv is not None:
            a = self.conv(a)
        x = F.silu(a)
        h0 = None if h0 is None else h0.to(dt)
        c, h = cell(x, z, self.w_x.to(dt), self.w_h().to(dt), self.b.to(dt), h0,
                    self.backend, self.path)
        out = self.dropout(c) @ self.w_out.to(dt).t()       # [T, B, d]
        return out.transpose(0, 1), h


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 3 * dim * D + 2 * D * D + D


def parity(shape: Shape, dtype, device, generator) -> list[ParityCase]:
    """One case per CUDA path that takes this size, on the same fresh inputs."""
    T, B, D = shape.T, shape.B, shape.D
    inputs = inputs.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), device, generator)
    return [ParityCase(inputs, lambda p=p, **kw: cell(**kw, backend="cuda", path=p), reference,
                       ("out", "h_T"), "cuda:" + p) for p in dense.paths(B, D, dtype)]


ENTRIES = (Entry(
    family="dense", name="E1", kind="variant", aliases=("1",), layer=E1,
    title="Mamba-gated Elman: tanh recurrence on silu(x), output h * silu(z)",
    chapter="book/chapters/e01_gated_elman.ipynb",
    layer_params=layer_params, parity=parity, test_shapes=inputs.TEST_SHAPES,
    tolerance={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(1e-2, 2e-2)},
    cuda_op="dense_forward/dense_backward",
),)
