"""Pieces the variant layers share: backend checks, autocast dtype, the optional causal
depthwise conv of Templates S and P."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ("cuda", "reference")

def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the layer computes in: autocast's if it is on for x's device, else x's."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


class CausalConv(nn.Module):
    """Depthwise causal conv over time on a time-major [T, B, D] tensor (kernel d_conv,
    with bias), as Templates S and P apply it before the silu when use_conv=1."""

    def __init__(self, dim: int, d_conv: int = 4):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, d_conv, groups=dim, padding=d_conv - 1)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        T = a.shape[0]
        w, b = self.conv.weight.to(a.dtype), self.conv.bias.to(a.dtype)
        u = a.permute(1, 2, 0)                               # [B, D, T]
        return F.conv1d(u, w, b, padding=w.shape[-1] - 1, groups=u.shape[1])[..., :T].permute(2, 0, 1)
