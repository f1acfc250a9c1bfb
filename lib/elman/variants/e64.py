"""E64, additive h-dependence. Chapter: book/chapters/e64_e65_h_dependence.ipynb.

    x_t = silu(W_in y_t)                                             (Template P)
    alpha_t = sigma(W_a x_t + b_a),  v_t = tanh(h_{t-1} + W_x x_t + b)
    h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t,  c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import torch

from ..core.layer import check_backend
from ..families.diagonal import inputs, op as diagonal
from ..families.diagonal.layer import DiagonalLayer
from ..families.diagonal.reference import walk

STEP = "e64"


def reference(x, w_a, b_a, w_x, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    def step(xt, h):
        alpha = torch.sigmoid(xt @ w_a.t() + b_a)
        v = torch.tanh(h + xt @ w_x.t() + b)
        return alpha * h + (1 - alpha) * v
    return walk(x, h0, step)


def cell(x, w_a, b_a, w_x, b, h0=None, backend: str = "cuda"):
    """E64's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_a, b_a, w_x, b, h0)
    return diagonal.cell(STEP, x, ((w_a, b_a), (w_x, b)), (), h0)


class E64(DiagonalLayer):
    """E64 layer: W_a, W_x [D, D] (Xavier), b_a = 2, b = 0."""

    projections = (("w_a", "b_a", 2.0), ("w_x", "b", 0.0))
    cell_fn = staticmethod(cell)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 2 * D * D + 2 * D


ENTRIES = (inputs.entry(
    name="E64", aliases=("64",), layer=E64, reference=reference, cell=cell, epilogue=STEP,
    title="Additive h-dependence: v = tanh(h + W_x x + b), h = alpha h + (1 - alpha) v",
    chapter="book/chapters/e64_e65_h_dependence.ipynb", layer_params=layer_params,
),)
