"""E71, matrix memory with a state-dependent retain gate: E70's write, but each value row keeps a
share alpha of its old content chosen from what the memory already returns for the key. Chapter:
book/chapters/e71_state_gated_matrix.ipynb.

Template P front end; value-first state S [n, n]; k, v, q = W_* x (no normalisation, no SN):

    r_t = S_{t-1} k_t                                   (retrieval with the old state)
    alpha_t = sigmoid(W_alpha x_t + delta * r_t + b_alpha)      (one per value row)
    S_t = alpha_t * S_{t-1} + (1 - alpha_t) * v_t k_t^T   (row-wise),  o_t = S_t q_t
    c_t = o_t * silu(o_t),  out = W_out c

The CUDA path runs it as the gated recurrence on S^T (rule 'retain', linear state).
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.entry import shapes
from ..families.matrix import gated_op
from ..families.matrix.single import (SingleStateLayer, check_cell_backend, entry, head, per_head,
                                      self_gate, unhead, with_inputs, xavier)


@with_inputs({"q": "key", "k": "key", "v": "value", "alpha_x": "pre", "delta": "param", "h0": "state"})
def reference(q, k, v, alpha_x, delta, h0):
    """q, k, v [T, B, H, n], alpha_x = W_alpha x + b_alpha [T, B, H, n], delta [H, n],
    h0 [B, H, n, n] (value-first) -> (o [T, B, H, n], S_T)."""
    S, outs = h0, []
    for t in range(k.shape[0]):
        r = torch.einsum("bhij,bhj->bhi", S, k[t])
        alpha = torch.sigmoid(alpha_x[t] + delta * r)
        S = alpha[..., :, None] * S + ((1 - alpha) * v[t])[..., :, None] * k[t][..., None, :]
        outs.append(torch.einsum("bhij,bhj->bhi", S, q[t]))
    return torch.stack(outs), S


def cell(q, k, v, alpha_x, delta, h0, backend: str = "cuda", checkpoint: int = gated_op.CHECKPOINT):
    """E71's core on `backend`."""
    check_cell_backend(backend)
    if backend == "reference":
        return reference(q, k, v, alpha_x, delta, h0)
    e = per_head("delta", delta, v, columns=True)
    o, S = gated_op.recurrence(q, k, v, alpha_x, h0.transpose(-1, -2), "retain", "linear", e=e,
                               K=checkpoint, engine=backend)
    return o, S.transpose(-1, -2)


class E71(SingleStateLayer):
    name = "E71"

    def build(self, D: int) -> None:
        n = self.n
        self.w_k, self.w_v, self.w_q, self.w_alpha = (xavier(n, D) for _ in range(4))
        self.delta = nn.Parameter(torch.full((n,), 0.1))
        self.b_alpha = nn.Parameter(torch.full((n,), 2.0))

    def cell(self, x, S0):
        k, v, q = (head(self.project(x, w)) for w in (self.w_k, self.w_v, self.w_q))
        acc = S0.dtype
        alpha_x = head(x.to(acc) @ self.w_alpha.to(acc).t() + self.b_alpha.to(acc))
        o, S = cell(q, k, v, alpha_x, self.delta.to(acc)[None], S0.unsqueeze(1), self.backend)
        return self_gate(unhead(o).to(x.dtype)), S.squeeze(1)


def params(dim: int, expansion: float = 1.0, n_state: int = 64, **_) -> int:
    """dD + 4nD + 2n + nd."""
    D = int(dim * expansion)
    return dim * D + 4 * n_state * D + 2 * n_state + n_state * dim


def _entry(name: str, n: int, aliases: tuple[str, ...]):
    def layer(dim: int, expansion: float = 1.0, **kw) -> E71:
        return E71(dim, expansion, **{"n_state": n, **kw})

    return entry(
        name=name, aliases=aliases, layer=layer, reference=reference, cell=lambda **a: cell(**a),
        test_shapes=shapes((17, 2, 64, 1, n, n), (1, 1, 32, 1, n, n), (33, 1, 48, 2, 16, 16)),
        title="E71: matrix memory with a state-dependent retain gate",
        chapter="book/chapters/e71_state_gated_matrix.ipynb",
        layer_params=lambda dim, expansion=1.0: params(dim, expansion, n))


ENTRIES = (_entry("E71", 64, ("71",)), _entry("E71n32", 32, ("71n32",)),
           _entry("E71n128", 128, ("71n128",)))
