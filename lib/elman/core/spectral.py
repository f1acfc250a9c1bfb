"""Parametrisations of the recurrent matrix W_h (VARIANTS.md section 1, "Spectral
normalisation", and E0's `r_h_mode`).

`spectral_norm` (the default for every variant that lists a radius) returns
W * rho / (sigma + 1e-8) with sigma = |u^T W v|, gradient through W: u is a persistent fp32
unit vector (a registered buffer, so it is checkpointed) and v = W^T u / |W^T u|, both from
power iterations without gradient. This normalises the largest singular value. `none` returns
W itself. `scaled_orthogonal` returns sigmoid(s) * Q with Q a fixed random orthogonal buffer
and a learned scalar s (initialised to -0.01).

The power iterations, sigma and the scaled matrix are computed in fp32 (fp64 for an fp64 W)
with autocast off (a bf16 sigma would carry three significant digits), and the result is W's
dtype; the layer casts it to its compute dtype once.

How many iterations a call runs. The specification: three per forward call, from the stored
u, storing the new u in training mode. Every call does that unless `step_iterations` is set
(`per_step`): a training-mode call then runs that many (the trainer sets 1 on the CUDA
backend) and stores u, so that u keeps converging across steps while each step pays for one
iteration (torch.nn.utils.parametrizations.spectral_norm does the same). Evaluation always
runs the specification's three from the stored u, and the reference backend keeps them in
training too. From a random u the estimate converges slowly: for a 1280 x 1280 Xavier matrix,
1, 3, 6, 12 and 30 iterations estimate sigma at 0.73, 0.90, 0.95, 0.98 and 0.996 of the
largest singular value (an underestimate makes the normalised matrix's spectral norm
rho / estimate, above rho). So `per_step` first converges u on the matrix as it is
(WARM_ITERATIONS), and a training step's one iteration then follows W as it moves: from the
first step the estimate is closer to the largest singular value than the specification's
three iterations from a random u.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("spectral_norm", "none", "scaled_orthogonal")
SPEC_ITERATIONS = 3  # power iterations per forward call in the specification
WARM_ITERATIONS = 100  # iterations `per_step` runs once, before the first step


def power_iteration(w: torch.Tensor, u: torch.Tensor, iterations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, v) after `iterations` (>= 1) steps v = W^T u / (|W^T u| + 1e-8), u = W v / (|W v| + 1e-8)
    from the unit vector u (call it without gradient)."""
    for _ in range(iterations):
        v = w.t() @ u
        v = v / (v.norm() + 1e-8)
        u = w @ v
        u = u / (u.norm() + 1e-8)
    return u, v


class RecurrentWeight(nn.Module):
    """Holds the raw D x D recurrent matrix and returns its constrained form.

    `step_iterations` (None: the specification's `power_iterations` every call) is the
    iteration count of a training-mode call; `fp32` False leaves the iterations and sigma to
    the caller's autocast (bf16 matrix-vector products), which the training profile's
    `before` setup times."""

    def __init__(self, dim: int, mode: str = "spectral_norm", radius: float = 0.99,
                 init_gain: float = 0.1, power_iterations: int = SPEC_ITERATIONS):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"r_h_mode must be one of {MODES}, got {mode!r}")
        if int(power_iterations) < 1:
            raise ValueError(f"power_iterations must be at least 1, got {power_iterations!r}")
        self.mode, self.radius, self.iters = mode, float(radius), int(power_iterations)
        self.step_iterations: int | None = None
        self.fp32 = True
        if mode == "scaled_orthogonal":
            q, _ = torch.linalg.qr(torch.randn(dim, dim))
            self.register_buffer("q", q)
            self.s = nn.Parameter(torch.tensor(-0.01))
        else:
            self.weight = nn.Parameter(torch.empty(dim, dim))
            nn.init.xavier_uniform_(self.weight, gain=init_gain)
        if mode == "spectral_norm":
            self.register_buffer("u", F.normalize(torch.randn(dim), dim=0))

    def iterations(self) -> int:
        """Power iterations the next call runs."""
        if self.training and self.step_iterations is not None:
            return self.step_iterations
        return self.iters

    def forward(self) -> torch.Tensor:
        if self.mode == "scaled_orthogonal":
            return torch.sigmoid(self.s) * self.q
        w = self.weight
        if self.mode == "none":
            return w
        ct = torch.promote_types(w.dtype, torch.float32)  # fp32, or fp64 for fp64 weights
        exact = torch.autocast(w.device.type, enabled=False) if self.fp32 else contextlib.nullcontext()
        with exact:
            wc = w.to(ct)
            with torch.no_grad():
                u, v = power_iteration(wc, self.u.to(ct), self.iterations())
                if self.training:
                    self.u.copy_(u)
            sigma = (u @ (wc @ v)).abs()
            return (wc * (self.radius / (sigma + 1e-8))).to(w.dtype)

    def extra_repr(self) -> str:
        return f"mode={self.mode}, radius={self.radius}"


def spectral_weights(model: nn.Module) -> list[RecurrentWeight]:
    """Every spectrally normalised weight of a model."""
    return [m for m in model.modules() if isinstance(m, RecurrentWeight) and m.mode == "spectral_norm"]


def per_step(model: nn.Module, iterations: int | None = 1) -> int:
    """Set `step_iterations` of every spectrally normalised weight of `model` (None: the
    specification's count every call); with a count, first converge each weight's u on its
    matrix (WARM_ITERATIONS). Returns how many weights it set."""
    if iterations is not None and (not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"power iterations per step must be a positive integer or None, got {iterations!r}")
    weights = spectral_weights(model)
    for w in weights:
        w.step_iterations = iterations
        if iterations is not None:
            with torch.no_grad():
                ct = torch.promote_types(w.weight.dtype, torch.float32)
                u, _ = power_iteration(w.weight.to(ct), w.u.to(ct), WARM_ITERATIONS)
                w.u.copy_(u)
    return len(weights)
