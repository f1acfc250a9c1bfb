"""E34, the diagonal recurrence. Chapter: book/chapters/e34_diagonal.ipynb.

    x_t = silu(W_in y_t)                                             (Template P)
    h_t = tanh(W_x x_t + delta * h_{t-1} + b),  delta = clamp(d_vec, -0.99, 0.99)
    c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import torch

from ..core.layer import check_backend
from ..families.diagonal import inputs, op as diagonal
from ..families.diagonal.layer import DiagonalLayer, uniform
from ..families.diagonal.reference import walk

STEP = "e34"  # the scan's step: h = tanh(u + delta * h_prev)
CLAMP = 0.99


def reference(x, w_x, b, d_vec, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    delta = d_vec.clamp(-CLAMP, CLAMP)
    return walk(x, h0, lambda xt, h: torch.tanh(xt @ w_x.t() + delta * h + b))


def cell(x, w_x, b, d_vec, h0=None, backend: str = "cuda"):
    """E34's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_x, b, d_vec, h0)
    return diagonal.cell(STEP, x, ((w_x, b),), (d_vec.clamp(-CLAMP, CLAMP),), h0)


class E34(DiagonalLayer):
    """E34 layer: W_x [D, D] (Xavier), b = 0, d_vec ~ U(0.9, 0.99)."""

    projections = (("w_x", "b", 0.0),)
    vectors = (("d_vec", uniform(0.9, 0.99)),)
    cell_fn = staticmethod(cell)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + D * D + 2 * D


ENTRIES = (inputs.entry(
    name="E34", aliases=("34",), layer=E34, reference=reference, cell=cell, epilogue=STEP,
    title="Diagonal recurrence: h = tanh(W_x x + delta * h + b), output h * silu(h)",
    chapter="book/chapters/e34_diagonal.ipynb", layer_params=layer_params,
),)
