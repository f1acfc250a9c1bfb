"""E61, the decay-gated vector recurrence (HGRN's recurrence), and its two variants. Chapter:
book/chapters/e61_decay_gated.ipynb.

    x_t = silu(W_in y_t)                                             (Template P)
    E61:  alpha_t = sigma(W_a x_t + b_a),  v_t = W_v x_t + b_v,  h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t
    E61b: h_t = alpha_t h_{t-1} + v_t                     (W_v scaled by 0.1 at initialisation)
    E61c: p_t = W x_t + b,  h_t = sigma(p_t) h_{t-1} + (1 - sigma(p_t)) tanh(p_t)   (tied)
    c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import torch

from ..core.layer import check_backend
from ..families.diagonal import inputs, op as diagonal
from ..families.diagonal.layer import DiagonalLayer
from ..families.diagonal.reference import walk

STEPS = {"E61": "e61", "E61b": "e61b", "E61c": "e61c"}


def reference(x, w_a, b_a, w_v, b_v, h0=None):
    """E61, the definition: a sequential loop over time-major [T, B, D] tensors."""
    def step(xt, h):
        alpha = torch.sigmoid(xt @ w_a.t() + b_a)
        return alpha * h + (1 - alpha) * (xt @ w_v.t() + b_v)
    return walk(x, h0, step)


def reference_b(x, w_a, b_a, w_v, b_v, h0=None):
    """E61b: the input is added without the (1 - alpha) factor."""
    def step(xt, h):
        return torch.sigmoid(xt @ w_a.t() + b_a) * h + (xt @ w_v.t() + b_v)
    return walk(x, h0, step)


def reference_c(x, w, b, h0=None):
    """E61c: one projection p gives both the decay sigma(p) and the value tanh(p)."""
    def step(xt, h):
        p = xt @ w.t() + b
        alpha = torch.sigmoid(p)
        return alpha * h + (1 - alpha) * torch.tanh(p)
    return walk(x, h0, step)


def cell(x, w_a, b_a, w_v, b_v, h0=None, backend: str = "cuda"):
    """E61's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_a, b_a, w_v, b_v, h0)
    return diagonal.cell(STEPS["E61"], x, ((w_a, b_a), (w_v, b_v)), (), h0)


def cell_b(x, w_a, b_a, w_v, b_v, h0=None, backend: str = "cuda"):
    """E61b's cell on [T, B, D]."""
    check_backend(backend)
    if backend == "reference":
        return reference_b(x, w_a, b_a, w_v, b_v, h0)
    return diagonal.cell(STEPS["E61b"], x, ((w_a, b_a), (w_v, b_v)), (), h0)


def cell_c(x, w, b, h0=None, backend: str = "cuda"):
    """E61c's cell on [T, B, D]."""
    check_backend(backend)
    if backend == "reference":
        return reference_c(x, w, b, h0)
    return diagonal.cell(STEPS["E61c"], x, ((w, b),), (), h0)


class E61(DiagonalLayer):
    """E61 layer: W_a, W_v [D, D] (Xavier), b_a = 2 (sigma = 0.88), b_v = 0."""

    projections = (("w_a", "b_a", 2.0), ("w_v", "b_v", 0.0))
    cell_fn = staticmethod(cell)


class E61b(E61):
    """E61b layer: E61's parameters, W_v scaled by 0.1 after its Xavier initialisation."""

    scaled = (("w_v", 0.1),)
    cell_fn = staticmethod(cell_b)


class E61c(DiagonalLayer):
    """E61c layer: one W [D, D] (Xavier), b = 0."""

    projections = (("w", "b", 0.0),)
    cell_fn = staticmethod(cell_c)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 2 * D * D + 2 * D


def layer_params_c(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + D * D + D


ENTRIES = (
    inputs.entry(
        name="E61", aliases=("61",), layer=E61, reference=reference, cell=cell, epilogue=STEPS["E61"],
        title="Decay-gated: h = alpha h + (1 - alpha) v, alpha = sigma(W_a x + b_a)",
        chapter="book/chapters/e61_decay_gated.ipynb", layer_params=layer_params),
    inputs.entry(
        name="E61b", aliases=("61b",), layer=E61b, reference=reference_b, cell=cell_b,
        epilogue=STEPS["E61b"], title="Decay-gated, additive input: h = alpha h + v",
        chapter="book/chapters/e61_decay_gated.ipynb", layer_params=layer_params),
    inputs.entry(
        name="E61c", aliases=("61c",), layer=E61c, reference=reference_c, cell=cell_c,
        epilogue=STEPS["E61c"], title="Decay-gated, tied: h = sigma(p) h + (1 - sigma(p)) tanh(p)",
        chapter="book/chapters/e61_decay_gated.ipynb", layer_params=layer_params_c),
)
