"""The layer skeleton every recurrent variant shares, and the pieces it is made of: backend
checks, the autocast dtype, the optional causal depthwise conv of Templates S and P.

A variant's layer is a small subclass of `RecurrentLayer`: it names its template, builds
its own cell parameters (`build`) and runs its cell (`cell`). The skeleton owns the rest:

    template "S":  [a; z] = W_in y,  x = silu(conv?(a)),  the cell sees (x, z)
    template "P":  x = silu(conv?(W_in y)),                 the cell sees x
    template "E0": x = W_in y (silu(conv(.)) only with use_conv), the cell sees x
    out = W_out dropout(c),  c the cell's output

with time-major [T, B, D] tensors inside, the compute dtype of autocast (fp32 weights cast
per call), h0 cast to it, and clear errors for a bad input before any work.

The input becomes one contiguous time-major tensor in the compute dtype (`time_major`: at
most one copy, none when y is a [B, T, d] view of time-major storage already in that dtype),
so the input GEMMs and their backward read it without copies; the output is a [B, T, d] view
of the time-major result. LadderLM keeps its residual stream time-major for such layers
(`RecurrentLayer.time_major`), so neither side copies.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .spectral import RecurrentWeight

BACKENDS = ("cuda", "reference")
TEMPLATES = ("S", "P", "E0")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the layer computes in: autocast's if it is on for x's device, else x's."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def inner_width(dim: int, expansion: float) -> int:
    """D = int(dim * expansion), both at least 1 (a zero width has no layer)."""
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    D = int(dim * expansion)
    if D < 1:
        raise ValueError(f"the inner width int(dim * expansion) = int({dim} * {expansion}) = {D}; "
                         "it must be at least 1")
    return D


def check_sequence(name: str, y: torch.Tensor, dim: int) -> None:
    """A layer's input must be [B, T, dim] with B >= 1 and T >= 1: a clear error otherwise
    (an empty batch or sequence raises; it is never passed to a kernel)."""
    if y.dim() != 3 or y.shape[0] < 1 or y.shape[1] < 1 or y.shape[2] != dim:
        raise ValueError(f"{name} input must be [B, T, dim={dim}] with B >= 1 and T >= 1, "
                         f"got shape {tuple(y.shape)}")


def time_major(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """y [B, T, d] as a contiguous time-major [T, B, d] tensor in `dtype`: one copy at most, none
    when y is a view of time-major storage in `dtype`. (`Tensor.to(dtype,
    memory_format=torch.contiguous_format)` alone returns a strided tensor unchanged when its
    dtype is already `dtype`.)"""
    yt = y.transpose(0, 1)
    return yt.contiguous() if yt.dtype == dtype else yt.to(dtype, memory_format=torch.contiguous_format)


def recurrent_weight(D: int, r_h_mode: str = "spectral_norm", spectral_radius: float = 0.99,
                     r_h_init_gain: float = 0.1) -> RecurrentWeight:
    """W_h [D, D] with the layer options of its parametrisation (core.spectral)."""
    return RecurrentWeight(D, r_h_mode, spectral_radius, r_h_init_gain)


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


class RecurrentLayer(nn.Module):
    """`forward(y [B, T, dim], h0=None) -> (out [B, T, dim], h_T [B, D])`.

    Subclasses set `template` (TEMPLATES) and `paths` (the implementations `path` may
    name), and define `build(D, **options)` (register the cell's parameters; return those
    that get Xavier-uniform initialisation, in order) and `cell(x, z, h0)` (time-major,
    in the compute dtype; z is None except for template "S").

    `time_major` tells LadderLM that a [B, T, d] view of time-major storage is the input this
    layer copies least (none) and its output is one. `contiguous_input` False passes the input
    GEMMs the strided transpose instead, which each of them copies (the training profile's
    `before` setup times the difference)."""

    template = "S"
    paths: tuple[str, ...] = ("auto",)
    time_major = True
    contiguous_input = True

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda",
                 use_conv: bool = False, d_conv: int = 4, dropout: float = 0.0,
                 path: str = "auto", **options):
        super().__init__()
        check_backend(backend)
        if self.template not in TEMPLATES:
            raise ValueError(f"{type(self).__name__}: template must be one of {TEMPLATES}")
        if path not in self.paths:
            raise ValueError(f"path must be one of {self.paths}, got {path!r}")
        D = inner_width(dim, expansion)
        self.dim, self.inner = dim, D
        self.backend, self.path = backend, path
        self.w_in = nn.Parameter(torch.empty((2 if self.template == "S" else 1) * D, dim))
        xavier = self.build(D, **options)
        self.w_out = nn.Parameter(torch.empty(dim, D))
        self.conv = CausalConv(D, d_conv) if use_conv else None
        self.dropout = nn.Dropout(dropout)
        for w in (self.w_in, *xavier, self.w_out):
            nn.init.xavier_uniform_(w)
        self._shapes = {n: p.shape for n, p in self.named_parameters()}

    def build(self, D: int, **options) -> tuple[nn.Parameter, ...]:
        raise NotImplementedError

    def cell(self, x: torch.Tensor, z: torch.Tensor | None, h0: torch.Tensor | None):
        raise NotImplementedError

    def check(self, y: torch.Tensor, h0: torch.Tensor | None) -> None:
        """Clear errors for an input the layer cannot take, and for a parameter replaced by
        one of another shape since construction."""
        check_sequence(type(self).__name__, y, self.dim)
        if h0 is not None and tuple(h0.shape) != (y.shape[0], self.inner):
            raise ValueError(f"h0 must be [B, D] = {(y.shape[0], self.inner)}, got {tuple(h0.shape)}")
        for name, p in self.named_parameters():
            if p.shape != self._shapes.get(name, p.shape):
                raise ValueError(f"parameter {name} has shape {tuple(p.shape)}; the layer was "
                                 f"built with {tuple(self._shapes[name])}")

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        self.check(y, h0)
        dt = autocast_dtype(y)
        yt = time_major(y, dt) if self.contiguous_input else y.transpose(0, 1).to(dt)  # [T, B, dim]
        w_in = self.w_in.to(dt)
        z = None
        if self.template == "S":
            D = self.inner
            a, z = yt @ w_in[:D].t(), yt @ w_in[D:].t()
        else:
            a = yt @ w_in.t()
        if self.conv is not None:
            a = self.conv(a)
        x = a if self.template == "E0" and self.conv is None else F.silu(a)
        c, h = self.cell(x, z, None if h0 is None else h0.to(dt))
        out = self.dropout(c) @ self.w_out.to(dt).t()        # [T, B, dim]
        return out.transpose(0, 1), h
