"""E14, the matrix-state Elman: a D x k memory per sequence written by outer products of a
tanh key and a value, decayed per row by an input gate, read by a query and gated by the z
branch. Chapter: book/chapters/e14_matrix_state_elman.ipynb.

Template S front end ([a; z] = W_in y, x = silu(a)); state M [D, k] (k = D by default):

    key_t = tanh(W_key x_t + b_key) (D),   val_t = W_val x_t + b_val (k)
    dec_t = sigmoid(W_dec x_t + b_dec) (D), qry_t = W_qry x_t + b_qry (k)
    M_t = dec_t[:, None] * M_{t-1} + key_t val_t^T
    c_t = (M_t qry_t) * silu(z_t),  out = W_out c

Linear in M with input-only coefficients. On the CUDA op M^T is the key-first state of the gated
recurrence (keys: val, values: key, column coefficient dec, rule 'decay', linear state), so the
kernel takes D and k in the gated kernels' sizes (gated_op.SIZES); larger widths run on
backend 'reference' (the state grows as D k per sequence).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.entry import shapes
from ..core.layer import autocast_dtype, check_backend, check_sequence, inner_width
from ..families.matrix import gated_op
from ..families.matrix.layer import check_parameters, remember_shapes
from ..families.matrix.single import check_cell_backend, entry, head, unhead, with_inputs, xavier


@with_inputs({"qry": "key", "val": "key", "key": "value", "dec": "open", "h0": "state"})
def reference(qry, val, key, dec, h0):
    """qry, val [T, B, H, k], key, dec [T, B, H, D], h0 [B, H, D, k] -> (o = M qry [T, B, H, D],
    M_T [B, H, D, k])."""
    M, outs = h0, []
    for t in range(key.shape[0]):
        M = dec[t][..., :, None] * M + key[t][..., :, None] * val[t][..., None, :]
        outs.append(torch.einsum("bhij,bhj->bhi", M, qry[t]))
    return torch.stack(outs), M


def cell(qry, val, key, dec, h0, backend: str = "cuda", checkpoint: int = gated_op.CHECKPOINT):
    """E14's core on `backend`."""
    check_cell_backend(backend)
    if backend == "reference":
        return reference(qry, val, key, dec, h0)
    o, S = gated_op.recurrence(qry, val, key, dec, h0.transpose(-1, -2), "decay", "linear",
                               K=checkpoint, engine=backend)
    return o, S.transpose(-1, -2)


class E14(nn.Module):
    """`forward(y [B, T, dim], h0=None [B, D, k]) -> (out [B, T, dim], M_T [B, D, k])`;
    `d_state` = k (None: k = D)."""

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda",
                 d_state: int | None = None):
        super().__init__()
        check_backend(backend)
        D = inner_width(dim, expansion)
        k = D if d_state is None else d_state
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"d_state must be a positive integer, got {d_state!r}")
        self.dim, self.D, self.k, self.backend = dim, D, k, backend
        self.w_in = xavier(2 * D, dim)
        self.w_key, self.w_dec = xavier(D, D), nn.Parameter(torch.zeros(D, D))
        self.w_val, self.w_qry = xavier(k, D), xavier(k, D)
        self.b_key, self.b_val, self.b_qry = (nn.Parameter(torch.zeros(s)) for s in (D, k, k))
        self.b_dec = nn.Parameter(torch.full((D,), 3.0))
        self.w_out = xavier(dim, D)
        remember_shapes(self)

    def state_shape(self, B: int) -> tuple[int, int, int]:
        return (B, self.D, self.k)

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        check_sequence("E14", y, self.dim)
        check_parameters(self)
        B = y.shape[0]
        if h0 is not None and tuple(h0.shape) != self.state_shape(B):
            raise ValueError(f"h0 must be [B, D, k] = {list(self.state_shape(B))}, got {list(h0.shape)}")
        dt = autocast_dtype(y)
        acc = torch.promote_types(dt, torch.float32)
        a, z = (y.transpose(0, 1).to(dt) @ self.w_in.to(dt).t()).chunk(2, dim=-1)
        x = F.silu(a)
        lin = lambda w, b: x @ w.to(dt).t() + b.to(dt)  # noqa: E731
        key, val, qry = torch.tanh(lin(self.w_key, self.b_key)), lin(self.w_val, self.b_val), lin(self.w_qry, self.b_qry)
        dec = torch.sigmoid(x.to(acc) @ self.w_dec.to(acc).t() + self.b_dec.to(acc))
        M0 = y.new_zeros(self.state_shape(B), dtype=acc) if h0 is None else h0.to(acc)
        o, M = cell(head(qry), head(val), head(key), head(dec), M0.unsqueeze(1), self.backend)
        c = unhead(o).to(dt) * F.silu(z)
        return (c @ self.w_out.to(dt).t()).transpose(0, 1), M.squeeze(1)


def params(dim: int, expansion: float = 1.0, d_state: int | None = None, **_) -> int:
    """W_in 2dD, W_key and W_dec D^2 + D each, W_val and W_qry kD + k each, W_out dD; with k = D:
    3dD + 4D^2 + 4D."""
    D = int(dim * expansion)
    k = D if d_state is None else d_state
    return 3 * dim * D + 2 * (D * D + D) + 2 * (k * D + k)


def layer(dim: int, expansion: float = 1.0, **kw) -> E14:
    return E14(dim, expansion, **kw)


ENTRIES = (entry(
    name="E14", aliases=("14",), layer=layer, reference=reference, cell=lambda **a: cell(**a),
    test_shapes=shapes((17, 2, 32, 1, 32, 32), (1, 1, 16, 1, 16, 16), (40, 1, 64, 2, 64, 64)),
    title="E14: matrix-state Elman, decayed outer-product memory",
    chapter="book/chapters/e14_matrix_state_elman.ipynb",
    layer_params=lambda dim, expansion=1.0: params(dim, expansion)),)
