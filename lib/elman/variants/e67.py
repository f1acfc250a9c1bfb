"""E67, the h-dependent gate in its diagonal form (levels 67 and 67d; the low-rank form 67lr
is its own module). Chapter: book/chapters/e67_h_gate.ipynb.

    x_t = silu(W_in y_t)                                             (Template P)
    alpha_t = sigma(W_a x_t + d_a * h_{t-1} + b_a),  v_t = tanh(W_x x_t + b_v)
    h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t,  c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import torch

from ..core.layer import check_backend
from ..families.diagonal import inputs, op as diagonal
from ..families.diagonal.layer import DiagonalLayer, constant
from ..families.diagonal.reference import walk

STEP = "e67"


def reference(x, w_a, b_a, w_x, b_v, d_a, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    def step(xt, h):
        alpha = torch.sigmoid(xt @ w_a.t() + d_a * h + b_a)
        v = torch.tanh(xt @ w_x.t() + b_v)
        return alpha * h + (1 - alpha) * v
    return walk(x, h0, step)


def cell(x, w_a, b_a, w_x, b_v, d_a, h0=None, backend: str = "cuda"):
    """E67's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_a, b_a, w_x, b_v, d_a, h0)
    return diagonal.cell(STEP, x, ((w_a, b_a), (w_x, b_v)), (d_a,), h0)


class E67(DiagonalLayer):
    """E67 layer: W_a, W_x [D, D] (Xavier), b_a = 2, b_v = 0, d_a = 0.1."""

    projections = (("w_a", "b_a", 2.0), ("w_x", "b_v", 0.0))
    vectors = (("d_a", constant(0.1)),)
    cell_fn = staticmethod(cell)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 2 * D * D + 3 * D


ENTRIES = (inputs.entry(
    name="E67", aliases=("67", "67d", "E67d"), layer=E67, reference=reference, cell=cell,
    epilogue=STEP,
    title="h-dependent gate (diagonal): alpha = sigma(W_a x + d_a * h + b_a)",
    chapter="book/chapters/e67_h_gate.ipynb", layer_params=layer_params,
),)
