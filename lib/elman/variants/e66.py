"""E66, the low-rank h-dependence. Chapter: book/chapters/e66_low_rank_h_dependence.ipynb
(with E67lr).

    x_t = silu(W_in y_t)                                                     (Template P)
    alpha_t = sigmoid(W_alpha x_t + b_alpha),  v_t = tanh(U (V h_{t-1}) + W_x x_t + b)
    h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t,  c_t = h_t * silu(h_t),  output W_out c_t

Default rank r = max(D // 4, 16); levels 66r16, 66r64, 66r128 fix it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.layer import check_backend
from ..families.twogemm import inputs, op as twogemm
from ..families.twogemm.layers import GatedLowRank

MODE = "gated_tanh"  # v = tanh(pre), h = alpha h + (1 - alpha) v, out = h * silu(h)
RANKS = (16, 64, 128)  # the fixed ranks of levels 66r16, 66r64, 66r128


def reference(x, w_x, w_a, b, b_a, u, v, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        alpha = torch.sigmoid(x[t] @ w_a.t() + b_a)
        cand = torch.tanh((h @ v.t()) @ u.t() + x[t] @ w_x.t() + b)
        h = alpha * h + (1 - alpha) * cand
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def cell(x, w_x, w_a, b, b_a, u, v, h0=None, backend: str = "cuda", path: str = "auto"):
    """E66's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_x, w_a, b, b_a, u, v, h0)
    T, B, D = twogemm.validate.sequence("x", x)
    twogemm.validate.shapes({"W_x": (w_x, (D, D)), "W_alpha": (w_a, (D, D)), "b_alpha": (b_a, (D,))})
    x2 = x.reshape(T * B, D)
    a = (x2 @ w_x.t()).view(T, B, D)
    c = torch.addmm(b_a, x2, w_a.t()).view(T, B, D)
    return twogemm.lowrank_cell(MODE, a, c, u, v, b, h0, path)


def default_rank(D: int) -> int:
    return max(D // 4, 16)


class E66(GatedLowRank):
    """E66 layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W_x, W_alpha, b, b_alpha (2.0), U [D, r], V [r, D] (orthogonal x 0.5);
    option `rank` (default max(D // 4, 16))."""

    gain = 0.5
    default_rank = staticmethod(default_rank)
    cell_fn = staticmethod(cell)


def _fixed(rank: int):
    class Fixed(E66):
        __doc__ = f"E66 with rank {rank} (level 66r{rank})."

        def build(self, D: int, rank: int = rank):
            return super().build(D, rank)
    Fixed.__name__ = Fixed.__qualname__ = f"E66r{rank}"
    return Fixed


def layer_params(dim: int, expansion: float = 1.0, rank: int | None = None) -> int:
    D = int(dim * expansion)
    r = default_rank(D) if rank is None else rank
    return 2 * dim * D + 2 * D * D + 2 * D + 2 * D * r


TITLE = "Low-rank h-dependence: h = a h + (1 - a) tanh(U V h + W_x x + b), output h * silu(h)"
CHAPTER = "book/chapters/e66_low_rank_h_dependence.ipynb"

ENTRIES = (inputs.entry(
    name="E66", aliases=("66",), layer=E66, reference=reference, cell=cell,
    title=TITLE, chapter=CHAPTER, layer_params=layer_params,
), *(inputs.entry(
    name=f"E66r{r}", aliases=(f"66r{r}",), layer=_fixed(r), reference=reference, cell=cell,
    rank=lambda D, r=r: r, title=TITLE + f" (rank {r})", chapter=CHAPTER,
    layer_params=lambda dim, expansion=1.0, r=r: layer_params(dim, expansion, r),
) for r in RANKS))
