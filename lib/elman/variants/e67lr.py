"""E67lr, the h-dependent gate in low-rank form. Chapter:
book/chapters/e66_low_rank_h_dependence.ipynb (with E66).

    x_t = silu(W_in y_t)                                                     (Template P)
    alpha_t = sigmoid(W_alpha x_t + U (V h_{t-1}) + b_alpha),  v_t = tanh(W_x x_t + b_v)
    h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t,  c_t = h_t * silu(h_t),  output W_out c_t

Rank r = max(D // 8, 8); U, V orthogonal x 0.1; b_alpha = 2.0, b_v = 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.layer import check_backend
from ..families.twogemm import inputs, op as twogemm
from ..families.twogemm.layers import GatedLowRank

MODE = "gated_alpha"  # alpha = sigmoid(pre), h = alpha h + (1 - alpha) v, out = h * silu(h)


def reference(x, w_x, w_a, b_v, b_a, u, v, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        alpha = torch.sigmoid(x[t] @ w_a.t() + (h @ v.t()) @ u.t() + b_a)
        cand = torch.tanh(x[t] @ w_x.t() + b_v)
        h = alpha * h + (1 - alpha) * cand
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def cell(x, w_x, w_a, b_v, b_a, u, v, h0=None, backend: str = "cuda", path: str = "auto"):
    """E67lr's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the candidate
    tanh(W_x x + b_v) and W_alpha x are computed for all steps first."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_x, w_a, b_v, b_a, u, v, h0)
    T, B, D = twogemm.validate.sequence("x", x)
    twogemm.validate.shapes({"W_x": (w_x, (D, D)), "W_alpha": (w_a, (D, D)), "b_v": (b_v, (D,))})
    x2 = x.reshape(T * B, D)
    a = (x2 @ w_a.t()).view(T, B, D)
    cand = torch.tanh(torch.addmm(b_v, x2, w_x.t())).view(T, B, D)
    return twogemm.lowrank_cell(MODE, a, cand, u, v, b_a, h0, path)


def default_rank(D: int) -> int:
    return max(D // 8, 8)


class E67lr(GatedLowRank):
    """E67lr layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its
    cell parameters: W_x, W_alpha, b (= b_v, 0), b_alpha (2.0), U [D, r], V [r, D]
    (orthogonal x 0.1); option `rank` (default max(D // 8, 8))."""

    gain = 0.1
    default_rank = staticmethod(default_rank)
    cell_fn = staticmethod(cell)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 2 * D * D + 2 * D + 2 * D * default_rank(D)


ENTRIES = (inputs.entry(
    name="E67lr", aliases=("67lr",), layer=E67lr, reference=reference, cell=cell,
    rank=lambda D: max(D // 8, 2),
    title="h-dependent gate, low-rank: alpha = sigmoid(W_a x + U V h + b_a)",
    chapter="book/chapters/e66_low_rank_h_dependence.ipynb",
    layer_params=layer_params,
),)
