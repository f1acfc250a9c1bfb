"""E65, diagonal h-dependence. Chapter: book/chapters/e64_e65_h_dependence.ipynb.

    x_t = silu(W_in y_t)                                             (Template P)
    alpha_t = sigma(W_a x_t + b_a),  v_t = tanh(d_h * h_{t-1} + W_x x_t + b)
    h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t,  c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import torch

from ..core.layer import check_backend
from ..families.diagonal import inputs, op as diagonal
from ..families.diagonal.layer import DiagonalLayer, constant
from ..families.diagonal.reference import walk

STEP = "e65"


def reference(x, w_a, b_a, w_x, b, d_h, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    def step(xt, h):
        alpha = torch.sigmoid(xt @ w_a.t() + b_a)
        v = torch.tanh(d_h * h + xt @ w_x.t() + b)
        return alpha * h + (1 - alpha) * v
    return walk(x, h0, step)


def cell(x, w_a, b_a, w_x, b, d_h, h0=None, backend: str = "cuda"):
    """E65's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_a, b_a, w_x, b, d_h, h0)
    return diagonal.cell(STEP, x, ((w_a, b_a), (w_x, b)), (d_h,), h0)


class E65(DiagonalLayer):
    """E65 layer: W_a, W_x [D, D] (Xavier), b_a = 2, b = 0, d_h = 0.5."""

    projections = (("w_a", "b_a", 2.0), ("w_x", "b", 0.0))
    vectors = (("d_h", constant(0.5)),)
    cell_fn = staticmethod(cell)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 2 * D * D + 3 * D


ENTRIES = (inputs.entry(
    name="E65", aliases=("65",), layer=E65, reference=reference, cell=cell, epilogue=STEP,
    title="Diagonal h-dependence: v = tanh(d_h * h + W_x x + b), h = alpha h + (1 - alpha) v",
    chapter="book/chapters/e64_e65_h_dependence.ipynb", layer_params=layer_params,
),)
