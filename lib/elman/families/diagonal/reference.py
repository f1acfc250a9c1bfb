"""The loop every diagonal reference shares: h_t = step(x_t, h_{t-1}) over time-major x
[T, B, D] from h0 (zeros when None), with the family's output c_t = h_t * silu(h_t)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def walk(x: torch.Tensor, h0: torch.Tensor | None,
         step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(c [T, B, D], h_T [B, D]) of the recurrence `step(x_t, h_{t-1}) -> h_t`."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = step(x[t], h)
        outs.append(h * F.silu(h))
    return torch.stack(outs), h
