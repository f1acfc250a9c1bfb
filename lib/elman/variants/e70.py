"""E70, matrix linear: one n x n memory with a trainable scalar decay and an outer-product write,
the first step of the matrix-state road (unnormalised linear attention with decay). Chapter:
book/chapters/e70_matrix_linear.ipynb.

Template P front end (x = silu(W_in y)); value-first state S [n, n] (row i over values, column
j over keys):

    k = SN_0.5(W_k) x,  v = SN_0.5(W_v) x,  q = W_q x        (k not normalised)
    lambda = clamp(lambda_param, 0, 0.999)                   (trainable, initialised 0.9)
    S_t = lambda S_{t-1} + v_t k_t^T,  o_t = S_t q_t,  c_t = o_t * silu(o_t)
    out = W_out c

The CUDA path runs it as the gated recurrence on S^T (rule 'decay', linear state).
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.entry import shapes
from ..families.matrix import gated_op
from ..families.matrix.single import (SingleStateLayer, SpectralNormed, check_cell_backend, entry,
                                      head, per_head, self_gate, unhead, with_inputs, xavier)

RADIUS = 0.5


@with_inputs({"q": "key", "k": "key", "v": "value", "lam": "scalar", "h0": "state"})
def reference(q, k, v, lam, h0):
    """q, k [T, B, H, n], v [T, B, H, n], lam [H] (the clamped decay), h0 [B, H, n, n]
    (value-first) -> (o [T, B, H, n], S_T)."""
    S, outs = h0, []
    for t in range(k.shape[0]):
        S = lam[:, None, None] * S + v[t][..., :, None] * k[t][..., None, :]
        outs.append(torch.einsum("bhij,bhj->bhi", S, q[t]))
    return torch.stack(outs), S


def cell(q, k, v, lam, h0, backend: str = "cuda", checkpoint: int = gated_op.CHECKPOINT):
    """E70's core on `backend` ('schedule': the CUDA op's schedule in PyTorch)."""
    check_cell_backend(backend)
    if backend == "reference":
        return reference(q, k, v, lam, h0)
    c = per_head("lam", lam, v, columns=False)
    o, S = gated_op.recurrence(q, k, v, c, h0.transpose(-1, -2), "decay", "linear", K=checkpoint,
                               engine=backend)
    return o, S.transpose(-1, -2)


class E70(SingleStateLayer):
    """E70 layer; `spectral_norm=False` turns the normalisation of W_k and W_v off."""

    name = "E70"

    def build(self, D: int, spectral_norm: bool = True, decay_init: float = 0.9) -> None:
        n = self.n
        self.w_k = SpectralNormed(n, D, RADIUS, spectral_norm)
        self.w_v = SpectralNormed(n, D, RADIUS, spectral_norm)
        self.w_q = xavier(n, D)
        self.lam = nn.Parameter(torch.tensor(float(decay_init)))

    def cell(self, x, S0):
        k, v, q = (head(self.project(x, w)) for w in (self.w_k, self.w_v, self.w_q))
        lam = self.lam.clamp(0.0, 0.999).to(S0.dtype).reshape(1)
        o, S = cell(q, k, v, lam, S0.unsqueeze(1), self.backend)
        return self_gate(unhead(o).to(x.dtype)), S.squeeze(1)


def params(dim: int, expansion: float = 1.0, n_state: int = 64, **_) -> int:
    """dD + 3nD + 1 + nd."""
    D = int(dim * expansion)
    return dim * D + 3 * n_state * D + 1 + n_state * dim


def _entry(name: str, n: int, aliases: tuple[str, ...]):
    def layer(dim: int, expansion: float = 1.0, **kw) -> E70:
        return E70(dim, expansion, **{"n_state": n, **kw})

    return entry(
        name=name, aliases=aliases, layer=layer, reference=reference,
        cell=lambda **a: cell(**a),
        # eval: the power-iteration vector stays put, so both backends normalise by one sigma
        layer_cases=lambda shape: [("", lambda dim: layer(dim).eval())],
        test_shapes=shapes((17, 2, 64, 1, n, n), (1, 1, 32, 1, n, n), (33, 1, 48, 2, 16, 16)),
        title="E70: matrix linear memory, trainable scalar decay",
        chapter="book/chapters/e70_matrix_linear.ipynb",
        layer_params=lambda dim, expansion=1.0: params(dim, expansion, n))


ENTRIES = (_entry("E70", 64, ("70",)), _entry("E70n32", 32, ("70n32",)),
           _entry("E70n128", 128, ("70n128",)))
