"""E62, the selective write (vector delta), and its two variants. Chapter:
book/chapters/e62_selective_write.ipynb.

    x_t = silu(W_in y_t)                                             (Template P)
    E62:  k_t = sigma(W_k x_t + b_k),  v_t = tanh(W_v x_t + b_v),  h_t = (1 - k_t) h_{t-1} + k_t v_t
    E62b: h_t = alpha_t (1 - k_t) h_{t-1} + k_t v_t,  alpha_t = sigma(W_a x_t + b_a)
    E62c: p_t = W x_t + b,  h_t = (1 - sigma(p_t)) h_{t-1} + sigma(p_t) tanh(p_t)   (tied)
    c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import torch

from ..core.layer import check_backend
from ..families.diagonal import inputs, op as diagonal
from ..families.diagonal.layer import DiagonalLayer
from ..families.diagonal.reference import walk

STEPS = {"E62": "e62", "E62b": "e62b", "E62c": "e62c"}


def reference(x, w_k, b_k, w_v, b_v, h0=None):
    """E62, the definition: a sequential loop over time-major [T, B, D] tensors."""
    def step(xt, h):
        k = torch.sigmoid(xt @ w_k.t() + b_k)
        return (1 - k) * h + k * torch.tanh(xt @ w_v.t() + b_v)
    return walk(x, h0, step)


def reference_b(x, w_a, b_a, w_k, b_k, w_v, b_v, h0=None):
    """E62b: an extra decay alpha on the kept part."""
    def step(xt, h):
        alpha = torch.sigmoid(xt @ w_a.t() + b_a)
        k = torch.sigmoid(xt @ w_k.t() + b_k)
        return alpha * (1 - k) * h + k * torch.tanh(xt @ w_v.t() + b_v)
    return walk(x, h0, step)


def reference_c(x, w, b, h0=None):
    """E62c: one projection p gives both the write gate sigma(p) and the value tanh(p)."""
    def step(xt, h):
        p = xt @ w.t() + b
        k = torch.sigmoid(p)
        return (1 - k) * h + k * torch.tanh(p)
    return walk(x, h0, step)


def cell(x, w_k, b_k, w_v, b_v, h0=None, backend: str = "cuda"):
    """E62's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_k, b_k, w_v, b_v, h0)
    return diagonal.cell(STEPS["E62"], x, ((w_k, b_k), (w_v, b_v)), (), h0)


def cell_b(x, w_a, b_a, w_k, b_k, w_v, b_v, h0=None, backend: str = "cuda"):
    """E62b's cell on [T, B, D]."""
    check_backend(backend)
    if backend == "reference":
        return reference_b(x, w_a, b_a, w_k, b_k, w_v, b_v, h0)
    return diagonal.cell(STEPS["E62b"], x, ((w_a, b_a), (w_k, b_k), (w_v, b_v)), (), h0)


def cell_c(x, w, b, h0=None, backend: str = "cuda"):
    """E62c's cell on [T, B, D]."""
    check_backend(backend)
    if backend == "reference":
        return reference_c(x, w, b, h0)
    return diagonal.cell(STEPS["E62c"], x, ((w, b),), (), h0)


class E62(DiagonalLayer):
    """E62 layer: W_k, W_v [D, D] (Xavier), b_k = -2 (sigma = 0.12: keep by default), b_v = 0."""

    projections = (("w_k", "b_k", -2.0), ("w_v", "b_v", 0.0))
    cell_fn = staticmethod(cell)


class E62b(DiagonalLayer):
    """E62b layer: E62's parameters and W_a [D, D] (Xavier) with b_a = 2."""

    projections = (("w_a", "b_a", 2.0), ("w_k", "b_k", -2.0), ("w_v", "b_v", 0.0))
    cell_fn = staticmethod(cell_b)


class E62c(DiagonalLayer):
    """E62c layer: one W [D, D] (Xavier), b = 0 (the specification gives no other value)."""

    projections = (("w", "b", 0.0),)
    cell_fn = staticmethod(cell_c)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 2 * D * D + 2 * D


def layer_params_b(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 3 * D * D + 3 * D


def layer_params_c(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + D * D + D


CHAPTER = "book/chapters/e62_selective_write.ipynb"
ENTRIES = (
    inputs.entry(
        name="E62", aliases=("62",), layer=E62, reference=reference, cell=cell, epilogue=STEPS["E62"],
        title="Selective write: h = (1 - k) h + k tanh(W_v x + b_v), k = sigma(W_k x + b_k)",
        chapter=CHAPTER, layer_params=layer_params),
    inputs.entry(
        name="E62b", aliases=("62b",), layer=E62b, reference=reference_b, cell=cell_b,
        epilogue=STEPS["E62b"], title="Selective write with decay: h = alpha (1 - k) h + k v",
        chapter=CHAPTER, layer_params=layer_params_b),
    inputs.entry(
        name="E62c", aliases=("62c",), layer=E62c, reference=reference_c, cell=cell_c,
        epilogue=STEPS["E62c"], title="Selective write, tied: h = (1 - sigma(p)) h + sigma(p) tanh(p)",
        chapter=CHAPTER, layer_params=layer_params_c),
)
