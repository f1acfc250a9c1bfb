"""E5, the pure low-rank Elman: no input or output projection. Chapter:
book/chapters/e05_pure_low_rank_elman.ipynb.

    h_t = tanh(U_h (V_h h_{t-1}) + U_x (V_x y_t) + b),   out_t = h_t * silu(U_z (V_z y_t))

The state is as wide as the model (d); every factor is [d, r] or [r, d] with default
r = max(16, d // 8); no spectral normalisation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.layer import autocast_dtype, check_backend, check_sequence, inner_width
from ..families.twogemm import inputs, op as twogemm
from ..families.twogemm.layers import factors

MODE = "tanh_gate"  # the low-rank op's stage: h = tanh(pre), out = h * silu(z)


def reference(y, u_h, v_h, u_x, v_x, u_z, v_z, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, d] tensors."""
    h = y.new_zeros(y.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(y.shape[0]):
        h = torch.tanh((h @ v_h.t()) @ u_h.t() + (y[t] @ v_x.t()) @ u_x.t() + b)
        outs.append(h * F.silu((y[t] @ v_z.t()) @ u_z.t()))
    return torch.stack(outs), h


def cell(y, u_h, v_h, u_x, v_x, u_z, v_z, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E5's cell on [T, B, d]: returns (out [T, B, d], h_T [B, d]). On CUDA the input and
    gate projections are two low-rank GEMM pairs over all steps; the recurrence is the
    low-rank op."""
    check_backend(backend)
    if backend == "reference":
        return reference(y, u_h, v_h, u_x, v_x, u_z, v_z, b, h0)
    T, B, D = twogemm.validate.sequence("y", y)
    r = u_x.shape[-1] if u_x.dim() == 2 else None
    twogemm.validate.shapes({"U_x": (u_x, (D, None)), "V_x": (v_x, (r, D)),
                             "U_z": (u_z, (D, None)), "V_z": (v_z, (u_z.shape[-1], D))})
    y2 = y.reshape(T * B, D)
    a = ((y2 @ v_x.t()) @ u_x.t()).view(T, B, D)
    z = ((y2 @ v_z.t()) @ u_z.t()).view(T, B, D)
    return twogemm.lowrank_cell(MODE, a, z, u_h, v_h, b, h0, path)


def default_rank(dim: int) -> int:
    return max(16, dim // 8)


class E5(nn.Module):
    """E5 layer: `forward(y [B, T, d], h0=None) -> (out [B, T, d], h_T [B, d])`, with no
    projections (the expansion is ignored: the state is d wide). Parameters: U_h, U_x, U_z
    [d, r], V_h, V_x, V_z [r, d] (orthogonal x 0.5), b; option `rank`."""

    paths = twogemm.PATHS

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda",
                 path: str = "auto", rank: int | None = None, **unused):
        super().__init__()
        check_backend(backend)
        if path not in self.paths:
            raise ValueError(f"path must be one of {self.paths}, got {path!r}")
        inner_width(dim, 1.0)
        r = default_rank(dim) if rank is None else int(rank)
        self.dim, self.inner, self.rank = dim, dim, r
        self.backend, self.path = backend, path
        self.u_h, self.v_h = factors(dim, r, 0.5)
        self.u_x, self.v_x = factors(dim, r, 0.5)
        self.u_z, self.v_z = factors(dim, r, 0.5)
        self.b = nn.Parameter(torch.zeros(dim))
        self._shapes = {n: p.shape for n, p in self.named_parameters()}

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        check_sequence(type(self).__name__, y, self.dim)
        if h0 is not None and tuple(h0.shape) != (y.shape[0], self.dim):
            raise ValueError(f"h0 must be [B, D] = {(y.shape[0], self.dim)}, got {tuple(h0.shape)}")
        for name, p in self.named_parameters():
            if p.shape != self._shapes[name]:
                raise ValueError(f"parameter {name} has shape {tuple(p.shape)}; the layer was "
                                 f"built with {tuple(self._shapes[name])}")
        dt = autocast_dtype(y)
        w = [p.to(dt) for p in (self.u_h, self.v_h, self.u_x, self.v_x, self.u_z, self.v_z, self.b)]
        out, h = cell(y.transpose(0, 1).to(dt), *w, None if h0 is None else h0.to(dt),
                      self.backend, self.path)
        return out.transpose(0, 1), h


def layer_params(dim: int, expansion: float = 1.0) -> int:
    return 6 * dim * default_rank(dim) + dim


ENTRIES = (inputs.entry(
    name="E5", aliases=("5",), layer=E5, reference=reference, cell=cell,
    title="Pure low-rank Elman: no projections, low-rank recurrence, input and gate",
    chapter="book/chapters/e05_pure_low_rank_elman.ipynb",
    layer_params=layer_params,
),)
