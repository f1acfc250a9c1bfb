"""E4, the low-rank Elman with a spectrally normalised product. Chapter:
book/chapters/e04_low_rank_elman.ipynb.

    [a_t; z_t] = W_in y_t,  x_t = silu(a_t)                                  (Template S)
    h_t = tanh(W_x x_t + U~ (V~ h_{t-1}) + b),  c_t = h_t * silu(z_t),  output W_out c_t
    (U~, V~) = (U sqrt(s), V sqrt(s)),  s = 0.95 / sigma(U V)

sigma(U V) is the largest singular value of the materialised D x D product, from three power
iterations on a persistent fp32 vector (a buffer); the gradient flows through s into U and V.
The normalisation is always on. Default rank r = max(16, int(dim / (2 expansion))), so that
2 D r is about dim^2.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.layer import RecurrentLayer, check_backend
from ..core.spectral import power_iteration
from ..families.twogemm import inputs, op as twogemm
from ..families.twogemm.layers import factors

MODE = "tanh_gate"  # the low-rank op's stage: h = tanh(pre), out = h * silu(z)
RADIUS = 0.95


def reference(x, z, w_x, u, v, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors, with the
    (already normalised) factors U [D, r] and V [r, D]."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w_x.t() + (h @ v.t()) @ u.t() + b)
        outs.append(h * F.silu(z[t]))
    return torch.stack(outs), h


def cell(x, z, w_x, u, v, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E4's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, z, w_x, u, v, b, h0)
    T, B, D = twogemm.validate.sequence("x", x)
    twogemm.validate.shapes({"W_x": (w_x, (D, D))})
    wx = (x.reshape(T * B, D) @ w_x.t()).view(T, B, D)
    return twogemm.lowrank_cell(MODE, wx, z, u, v, b, h0, path)


def default_rank(dim: int, expansion: float) -> int:
    return max(16, int(dim / (2 * expansion)))


class ProductNorm(nn.Module):
    """The spectral normalisation of a product U V: returns (U sqrt(s), V sqrt(s)) with
    s = radius / (sigma + 1e-8), sigma = |u^T (U V) w| after three power iterations without
    gradient on the persistent unit vector u (a buffer), with gradient through sigma."""

    def __init__(self, dim: int, radius: float = RADIUS, power_iterations: int = 3):
        super().__init__()
        self.radius, self.iters = float(radius), int(power_iterations)
        self.register_buffer("u", F.normalize(torch.randn(dim), dim=0))

    def forward(self, u_f: torch.Tensor, v_f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ct = torch.promote_types(u_f.dtype, torch.float32)
        prod = u_f.to(ct) @ v_f.to(ct)
        with torch.no_grad():
            u, w = power_iteration(prod, self.u.to(ct), self.iters)
            if self.training:
                self.u.copy_(u)
        sigma = (u @ (prod @ w)).abs()
        root = (self.radius / (sigma + 1e-8)).sqrt()
        return (u_f.to(ct) * root).to(u_f.dtype), (v_f.to(ct) * root).to(v_f.dtype)


class E4(RecurrentLayer):
    """E4 layer on Template S: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W_x, U [D, r], V [r, D] (orthogonal x 0.3), b; option `rank` (default
    max(16, int(dim / (2 expansion))))."""

    paths, template = twogemm.PATHS, "S"

    def __init__(self, dim: int, expansion: float = 1.0, **options):
        object.__setattr__(self, "expansion", expansion)  # the default rank reads it in build
        super().__init__(dim, expansion, **options)

    def build(self, D: int, rank: int | None = None):
        r = default_rank(self.dim, self.expansion) if rank is None else int(rank)
        self.rank = r
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.u, self.v = factors(D, r, 0.3)
        self.b = nn.Parameter(torch.zeros(D))
        self.norm = ProductNorm(D)
        return (self.w_x,)

    def cell(self, x, z, h0):
        dt = x.dtype
        u, v = self.norm(self.u, self.v)
        return cell(x, z, self.w_x.to(dt), u.to(dt), v.to(dt), self.b.to(dt), h0,
                    self.backend, self.path)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    r = default_rank(dim, expansion)
    return 3 * dim * D + D * D + 2 * D * r + D


ENTRIES = (inputs.entry(
    name="E4", aliases=("4",), layer=E4, reference=reference, cell=cell,
    title="Low-rank Elman: tanh(W_x x + U V h + b) with the product U V spectrally normalised",
    chapter="book/chapters/e04_low_rank_elman.ipynb",
    layer_params=layer_params,
),)
