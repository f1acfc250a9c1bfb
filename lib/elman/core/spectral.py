"""Parametrisations of the recurrent matrix W_h (VARIANTS.md section 1, "Spectral
normalisation", and E0's `r_h_mode`).

`spectral_norm` (the default for every variant that lists a radius): three power
iterations without gradient on a persistent fp32 vector u (a registered buffer, so it is
checkpointed), then sigma = |u^T W v| with gradient through W, and W * rho / (sigma + 1e-8).
This normalises the largest singular value. `none` returns W itself.
`scaled_orthogonal` returns sigmoid(s) * Q with Q a fixed random orthogonal buffer and a
learned scalar s (initialised to -0.01).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("spectral_norm", "none", "scaled_orthogonal")


class RecurrentWeight(nn.Module):
    """Holds the raw D x D recurrent matrix and returns its constrained form."""

    def __init__(self, dim: int, mode: str = "spectral_norm", radius: float = 0.99,
                 init_gain: float = 0.1, power_iterations: int = 3):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"r_h_mode must be one of {MODES}, got {mode!r}")
        self.mode, self.radius, self.iters = mode, float(radius), int(power_iterations)
        if mode == "scaled_orthogonal":
            q, _ = torch.linalg.qr(torch.randn(dim, dim))
            self.register_buffer("q", q)
            self.s = nn.Parameter(torch.tensor(-0.01))
        else:
            self.weight = nn.Parameter(torch.empty(dim, dim))
            nn.init.xavier_uniform_(self.weight, gain=init_gain)
        if mode == "spectral_norm":
            self.register_buffer("u", F.normalize(torch.randn(dim), dim=0))

    def forward(self) -> torch.Tensor:
        if self.mode == "scaled_orthogonal":
            return torch.sigmoid(self.s) * self.q
        w = self.weight
        if self.mode == "none":
            return w
        w32 = w.float()
        with torch.no_grad():
            u = self.u
            for _ in range(self.iters):
                v = w32.t() @ u
                v = v / (v.norm() + 1e-8)
                u = w32 @ v
                u = u / (u.norm() + 1e-8)
            if self.training:
                self.u.copy_(u)
        sigma = (u @ (w32 @ v)).abs()
        return (w32 * (self.radius / (sigma + 1e-8))).to(w.dtype)

    def extra_repr(self) -> str:
        return f"mode={self.mode}, radius={self.radius}"
