"""The layer of every diagonal variant: Template P (x = silu(W_in y)) around a cell whose
parameters are square projections W_i [D, D] with biases b_i [D] (Xavier-uniform weights,
constant bias initialisations) and per-channel vectors [D] with their own initialisations.

A variant subclasses `DiagonalLayer`, names its projections and vectors, and points `cell_fn`
at its module's `cell(x, <parameters by name>, h0, backend)`:

    class E67(DiagonalLayer):
        projections = (("w_a", "b_a", 2.0), ("w_x", "b_v", 0.0))
        vectors = (("d_a", constant(0.1)),)
        cell_fn = staticmethod(cell)

The vectors stay fp32 on the CUDA path (decays and gates are computed in fp32) and take the
compute dtype on the reference path.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ...core.layer import RecurrentLayer

Init = Callable[[int], torch.Tensor]


def constant(value: float) -> Init:
    """A vector of D copies of `value`."""
    return lambda D: torch.full((D,), float(value))


def uniform(low: float, high: float) -> Init:
    """A vector of D draws from U(low, high)."""
    return lambda D: torch.empty(D).uniform_(low, high)


class DiagonalLayer(RecurrentLayer):
    """`forward(y [B, T, dim], h0=None) -> (out [B, T, dim], h_T [B, D])` on Template P."""

    template = "P"
    paths = ("auto",)
    projections: tuple[tuple[str, str, float], ...] = ()  # (weight, bias, bias init)
    vectors: tuple[tuple[str, Init], ...] = ()
    scaled: tuple[tuple[str, float], ...] = ()  # weights multiplied after their Xavier init
    cell_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def __init__(self, dim: int, expansion: float = 1.0, **options):
        super().__init__(dim, expansion, **options)
        with torch.no_grad():
            for name, factor in self.scaled:
                getattr(self, name).mul_(factor)

    def build(self, D: int) -> tuple[nn.Parameter, ...]:
        for w, b, b0 in self.projections:
            setattr(self, w, nn.Parameter(torch.empty(D, D)))
            setattr(self, b, nn.Parameter(torch.full((D,), float(b0))))
        for name, init in self.vectors:
            setattr(self, name, nn.Parameter(init(D)))
        return tuple(getattr(self, w) for w, _, _ in self.projections)

    def cell(self, x: torch.Tensor, z: torch.Tensor | None, h0: torch.Tensor | None):
        dt = x.dtype
        kw = {}
        for w, b, _ in self.projections:
            kw[w], kw[b] = getattr(self, w).to(dt), getattr(self, b).to(dt)
        for name, _ in self.vectors:
            v = getattr(self, name)
            kw[name] = v if self.backend == "cuda" else v.to(dt)
        return type(self).cell_fn(x, **kw, h0=h0, backend=self.backend)
