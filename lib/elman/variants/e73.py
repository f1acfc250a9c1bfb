"""E73, matrix memory with the state inside the tanh, and E73cp, the same recurrence with its
state checkpointed. Chapter: book/chapters/e73_nonlinear_matrix.ipynb.

Template P front end; value-first state S [n, n] (row i over values, column j over keys);
k, v, q = W_* x (raw k: no normalisation, no delta rule):

    z_t = tanh(W_z x_t + b_z)
    m_t[i, j] = z_j (column, 73 / 73c),  z_i (row, 73r),  z_i z_j (full, 73f)
    S_t = tanh(S_{t-1} * m_t + v_t k_t^T),  o_t = S_t q_t,  c_t = o_t * silu(o_t)
    out = W_out c

On the CUDA op (the gated recurrence on S^T, rule 'decay', tanh state) the key-side factor of m
is the row modulation and the value-side factor the column coefficient. E73 stores every state
(checkpoint interval K = 1, the memory of a kernel that keeps the whole history); E73cp stores
one state in K = 16 and recomputes the others in the backward: the same outputs and gradients.
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.entry import shapes
from ..families.matrix import gated_op
from ..families.matrix.single import (SingleStateLayer, check_cell_backend, entry, head, self_gate,
                                      unhead, with_inputs, xavier)

MODULATIONS = ("column", "row", "full")
SPEC = {"q": "key", "k": "key", "v": "value", "z": "mod", "h0": "state"}
EVERY_STATE = 1  # E73's checkpoint interval: every state stored


def _modulation(z: torch.Tensor, kind: str) -> torch.Tensor:
    """m [.., n, n] (value-first) of z [.., n]."""
    if kind == "column":
        return z[..., None, :].expand(*z.shape, z.shape[-1])
    if kind == "row":
        return z[..., :, None].expand(*z.shape, z.shape[-1])
    return z[..., :, None] * z[..., None, :]


def _run(q, k, v, z, h0, modulation: str):
    S, outs = h0, []
    for t in range(k.shape[0]):
        S = torch.tanh(S * _modulation(z[t], modulation) + v[t][..., :, None] * k[t][..., None, :])
        outs.append(torch.einsum("bhij,bhj->bhi", S, q[t]))
    return torch.stack(outs), S


@with_inputs(SPEC)
def reference(q, k, v, z, h0):
    """Column modulation: q, k, v [T, B, H, n], z (after its tanh) [T, B, H, n],
    h0 [B, H, n, n] (value-first) -> (o [T, B, H, n], S_T)."""
    return _run(q, k, v, z, h0, "column")


@with_inputs(SPEC)
def reference_row(q, k, v, z, h0):
    """Row modulation (73r)."""
    return _run(q, k, v, z, h0, "row")


@with_inputs(SPEC)
def reference_full(q, k, v, z, h0):
    """Full modulation z_i z_j (73f)."""
    return _run(q, k, v, z, h0, "full")


REFERENCES = {"column": reference, "row": reference_row, "full": reference_full}


def cell(q, k, v, z, h0, modulation: str = "column", backend: str = "cuda",
         checkpoint: int = EVERY_STATE):
    """E73's core on `backend`; `checkpoint` = K (1 for E73, 16 for E73cp)."""
    check_cell_backend(backend)
    if modulation not in MODULATIONS:
        raise ValueError(f"modulation must be one of {MODULATIONS}, got {modulation!r}")
    if backend == "reference":
        return _run(q, k, v, z, h0, modulation)
    m = z if modulation in ("column", "full") else None
    c = z if modulation in ("row", "full") else torch.ones_like(v, dtype=h0.dtype)
    o, S = gated_op.recurrence(q, k, v, c, h0.transpose(-1, -2), "decay", "tanh", m=m,
                               K=checkpoint, engine=backend)
    return o, S.transpose(-1, -2)


class E73(SingleStateLayer):
    """E73 (checkpoint=1) and E73cp (checkpoint=16); `modulation` column | row | full."""

    name = "E73"

    def build(self, D: int, modulation: str = "column", checkpoint: int = EVERY_STATE) -> None:
        if modulation not in MODULATIONS:
            raise ValueError(f"modulation must be one of {MODULATIONS}, got {modulation!r}")
        n = self.n
        self.modulation, self.checkpoint = modulation, checkpoint
        self.w_k, self.w_v, self.w_q, self.w_z = (xavier(n, D) for _ in range(4))
        self.b_z = nn.Parameter(torch.full((n,), 1.0))

    def cell(self, x, S0):
        k, v, q = (head(self.project(x, w)) for w in (self.w_k, self.w_v, self.w_q))
        acc = S0.dtype
        z = head(torch.tanh(x.to(acc) @ self.w_z.to(acc).t() + self.b_z.to(acc)))
        o, S = cell(q, k, v, z, S0.unsqueeze(1), self.modulation, self.backend, self.checkpoint)
        return self_gate(unhead(o).to(x.dtype)), S.squeeze(1)


def params(dim: int, expansion: float = 1.0, n_state: int = 64, **_) -> int:
    """dD + 4nD + n + nd."""
    D = int(dim * expansion)
    return dim * D + 4 * n_state * D + n_state + n_state * dim


def _entry(name: str, modulation: str, checkpoint: int, aliases: tuple[str, ...]):
    def layer(dim: int, expansion: float = 1.0, **kw) -> E73:
        return E73(dim, expansion, **{"modulation": modulation, "checkpoint": checkpoint, **kw})

    cp = checkpoint != EVERY_STATE
    return entry(
        name=name, aliases=aliases, layer=layer, reference=REFERENCES[modulation],
        cell=lambda **a: cell(**a, modulation=modulation, checkpoint=checkpoint),
        test_shapes=shapes((17, 2, 64, 1, 64, 64), (1, 1, 32, 1, 32, 32), (40, 1, 48, 2, 16, 16)),
        title=f"E73{'cp' if cp else ''}: matrix memory inside tanh, {modulation} modulation"
              + (", checkpointed every 16 steps" if cp else ", every state stored"),
        chapter="book/chapters/e73_nonlinear_matrix.ipynb",
        layer_params=lambda dim, expansion=1.0: params(dim, expansion))


ENTRIES = (
    _entry("E73", "column", EVERY_STATE, ("73", "73c", "E73c")),
    _entry("E73r", "row", EVERY_STATE, ("73r",)),
    _entry("E73f", "full", EVERY_STATE, ("73f",)),
    _entry("E73cp", "column", gated_op.CHECKPOINT, ("73cp",)),
)
