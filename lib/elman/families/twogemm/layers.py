"""The layer shared by the gated low-rank variants (E66, E67lr): Template P with cell
parameters W_x, W_alpha [D, D], biases b (0) and b_alpha (2.0), and factors U [D, r],
V [r, D] (orthogonal, times the variant's gain)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ...core.layer import RecurrentLayer
from . import op


def factors(D: int, r: int, gain: float) -> tuple[nn.Parameter, nn.Parameter]:
    """U [D, r] and V [r, D], orthogonal times `gain`."""
    if r < 1:
        raise ValueError(f"rank must be at least 1, got {r}")
    return (nn.Parameter(nn.init.orthogonal_(torch.empty(D, r)) * gain),
            nn.Parameter(nn.init.orthogonal_(torch.empty(r, D)) * gain))


class GatedLowRank(RecurrentLayer):
    """Subclasses set `gain`, `default_rank(D)` and `cell_fn(x, w_x, w_a, b, b_a, u, v, h0,
    backend, path)` (a staticmethod); option `rank`."""

    paths, template = op.PATHS, "P"
    gain: float = 0.5
    default_rank: Callable[[int], int]
    cell_fn: Callable

    def build(self, D: int, rank: int | None = None):
        self.rank = type(self).default_rank(D) if rank is None else int(rank)
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_a = nn.Parameter(torch.empty(D, D))
        self.b = nn.Parameter(torch.zeros(D))
        self.b_a = nn.Parameter(torch.full((D,), 2.0))
        self.u, self.v = factors(D, self.rank, self.gain)
        return (self.w_x, self.w_a)

    def cell(self, x, z, h0):
        dt = x.dtype
        w = (self.w_x, self.w_a, self.b, self.b_a, self.u, self.v)
        return type(self).cell_fn(x, *(p.to(dt) for p in w), h0, self.backend, self.path)
