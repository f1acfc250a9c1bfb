"""E72, matrix memory with a memory-gated value: the write's value is gated by what the memory
already returns for the key (standard: more where it returns more; inverse 72i: less where it
returns a large magnitude), and an input-only retain gate interpolates old and new. Chapter:
book/chapters/e72_memory_gated_value.ipynb.

Template P front end; value-first state S [n, n]; k, v, q = W_* x:

    alpha_t = sigmoid(W_alpha x_t + b_alpha),  r_t = S_{t-1} k_t
    g_t = sigmoid(delta_g * r_t + b_g)           (72, 72s)
    g_t = sigmoid(-delta_g * |r_t| + b_g)        (72i)
    S_t = alpha_t * S_{t-1} + (1 - alpha_t) * (v_t * g_t) k_t^T   (row-wise),  o_t = S_t q_t
    c_t = o_t * silu(o_t),  out = W_out c

The CUDA path runs it as the gated recurrence on S^T (rule 'value_gate' or 'value_gate_abs',
linear state); its backward differentiates through v * g (the gated value).
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.entry import shapes
from ..families.matrix import gated_op
from ..families.matrix.single import (SingleStateLayer, check_cell_backend, entry, head, per_head,
                                      self_gate, unhead, with_inputs, xavier)

SPEC = {"q": "key", "k": "key", "v": "value", "alpha": "open", "delta": "param", "bias": "param",
        "h0": "state"}


def _run(q, k, v, alpha, delta, bias, h0, inverse: bool):
    S, outs = h0, []
    for t in range(k.shape[0]):
        r = torch.einsum("bhij,bhj->bhi", S, k[t])
        g = torch.sigmoid(-delta * r.abs() + bias if inverse else delta * r + bias)
        S = alpha[t][..., :, None] * S + ((1 - alpha[t]) * v[t] * g)[..., :, None] * k[t][..., None, :]
        outs.append(torch.einsum("bhij,bhj->bhi", S, q[t]))
    return torch.stack(outs), S


@with_inputs(SPEC)
def reference(q, k, v, alpha, delta, bias, h0):
    """The standard gate: q, k, v [T, B, H, n], alpha (the retain gate, after its sigmoid)
    [T, B, H, n], delta, bias [H, n], h0 [B, H, n, n] (value-first) -> (o, S_T)."""
    return _run(q, k, v, alpha, delta, bias, h0, inverse=False)


@with_inputs(SPEC)
def reference_inverse(q, k, v, alpha, delta, bias, h0):
    """The inverse gate (72i): g = sigmoid(-delta |r| + bias)."""
    return _run(q, k, v, alpha, delta, bias, h0, inverse=True)


def cell(q, k, v, alpha, delta, bias, h0, inverse: bool = False, backend: str = "cuda",
         checkpoint: int = gated_op.CHECKPOINT):
    """E72's core on `backend`."""
    check_cell_backend(backend)
    if backend == "reference":
        return _run(q, k, v, alpha, delta, bias, h0, inverse)
    e, f = per_head("delta", delta, v, columns=True), per_head("bias", bias, v, columns=True)
    o, S = gated_op.recurrence(q, k, v, alpha, h0.transpose(-1, -2),
                               "value_gate_abs" if inverse else "value_gate", "linear", e=e, f=f,
                               K=checkpoint, engine=backend)
    return o, S.transpose(-1, -2)


class E72(SingleStateLayer):
    name = "E72"

    def build(self, D: int, inverse: bool = False) -> None:
        n = self.n
        self.inverse = inverse
        self.w_k, self.w_v, self.w_q, self.w_alpha = (xavier(n, D) for _ in range(4))
        self.b_alpha = nn.Parameter(torch.full((n,), 2.0))
        self.delta_g = nn.Parameter(torch.full((n,), 0.5))
        self.b_g = nn.Parameter(torch.zeros(n))

    def cell(self, x, S0):
        k, v, q = (head(self.project(x, w)) for w in (self.w_k, self.w_v, self.w_q))
        acc = S0.dtype
        alpha = head(torch.sigmoid(x.to(acc) @ self.w_alpha.to(acc).t() + self.b_alpha.to(acc)))
        o, S = cell(q, k, v, alpha, self.delta_g.to(acc)[None], self.b_g.to(acc)[None],
                    S0.unsqueeze(1), self.inverse, self.backend)
        return self_gate(unhead(o).to(x.dtype)), S.squeeze(1)


def params(dim: int, expansion: float = 1.0, n_state: int = 64, **_) -> int:
    """dD + 4nD + 3n + nd."""
    D = int(dim * expansion)
    return dim * D + 4 * n_state * D + 3 * n_state + n_state * dim


def _entry(name: str, inverse: bool, aliases: tuple[str, ...]):
    def layer(dim: int, expansion: float = 1.0, **kw) -> E72:
        return E72(dim, expansion, **{"inverse": inverse, **kw})

    return entry(
        name=name, aliases=aliases, layer=layer,
        reference=reference_inverse if inverse else reference,
        cell=lambda **a: cell(**a, inverse=inverse),
        test_shapes=shapes((17, 2, 64, 1, 64, 64), (1, 1, 32, 1, 32, 32), (33, 1, 48, 2, 16, 16)),
        title="E72: matrix memory with a memory-gated value" + (" (inverse gate)" if inverse else ""),
        chapter="book/chapters/e72_memory_gated_value.ipynb",
        layer_params=lambda dim, expansion=1.0: params(dim, expansion))


ENTRIES = (_entry("E72", False, ("72", "72s", "E72s")), _entry("E72i", True, ("72i",)))
