"""Pieces the variant layers share: backend checks, autocast dtype, the optional causal
depthwise conv of Templates S and P, and the parity shapes of the dense family."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ("cuda", "reference")

# (T, B, D): B=1 and T=1, odd T and B, D not a multiple of 32, and the sizes the
# persistent kernels take: the cluster design at D = 256..1024 in steps of 256 (B = 130
# needs two waves of 16-column clusters at D = 1024), the grid design at D = 2048 with
# 8, 32 and 64 batch columns (B = 70 is beyond it: the per-step path).
DENSE_TEST_SHAPES = (
    (1, 1, 32), (7, 3, 100), (33, 2, 48), (64, 4, 256), (17, 5, 512),
    (9, 16, 1024), (13, 64, 512), (5, 8, 768), (3, 2, 2048), (6, 64, 1024), (4, 130, 1024),
    (6, 20, 2048), (5, 64, 2048), (4, 70, 2048),
)


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
