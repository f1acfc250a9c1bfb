"""E75, the gated delta matrix memory (E88's predecessor): per head an n x n tanh delta-rule
memory with a per-row forget gate instead of a scalar decay. Chapter:
book/chapters/e75_gated_delta_matrix.ipynb.

Template P front end (x = silu(W_in y)); per head, value-first state S [n, n] (row i over
values, column j over keys), k normalised, q raw:

    beta = sigmoid(W_beta x + b_beta)                      (n, one per row)
    S_t = tanh(beta[:, None] * S + (v - S k) k^T),  o = S_t q,  c = o * silu(o)
    out = W_out concat_h(c)

In the matrix family's key-first convention this is the recurrence on S^T with a per-column
decay beta and no write gate; `cell` runs it that way on the CUDA op.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from ..core.entry import Entry, shapes
from ..core.layer import CausalConv, autocast_dtype, check_backend, check_sequence, inner_width
from ..families.matrix import inputs, op as matrix
from ..families.matrix.layer import check_parameters, remember_shapes
from ..families.matrix.reference import l2_normalize


def reference(q, k, v, decay, h0):
    """The E75 core, value-first: q, k [T, B, H, n] (k normalised), v [T, B, H, n], the per-row
    gate decay [T, B, H, n], h0 [B, H, n, n] -> (o [T, B, H, n], S_T [B, H, n, n])."""
    S, outs = h0, []
    for t in range(k.shape[0]):
        r = torch.einsum("bhij,bhj->bhi", S, k[t])
        S = torch.tanh(decay[t][..., :, None] * S + (v[t] - r)[..., :, None] * k[t][..., None, :])
        outs.append(torch.einsum("bhij,bhj->bhi", S, q[t]))
    return torch.stack(outs), S


reference.decay_kind = "column"


def cell(q, k, v, decay, h0, backend: str = "cuda", checkpoint: int = matrix.CHECKPOINT, group: int = 0):
    """E75's core on `backend`; the CUDA op runs it on the transposed (key-first) state, with
    `group` threads per value column (0: the default)."""
    check_backend(backend)
    if backend == "reference":
        return reference(q, k, v, decay, h0)
    o, S = matrix.recurrence(q, k, v, decay, None, h0.transpose(-1, -2), "tanh", checkpoint, group)
    return o, S.transpose(-1, -2)


class E75(nn.Module):
    """`forward(y [B, T, dim], h0=None [B, H, n, n]) -> (out [B, T, dim], S_T [B, H, n, n])`.
    H = 1 is the single-head E75 (levels 75, 75n32...)."""

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda", n_heads: int = 1,
                 n_state: int = 64, use_conv: bool = False, d_conv: int = 4, dropout: float = 0.0,
                 checkpoint: int = matrix.CHECKPOINT, group: int = 0):
        super().__init__()
        check_backend(backend)
        D = inner_width(dim, expansion)
        H, n = n_heads, n_state
        if group not in matrix.layouts(n, n):
            raise ValueError(f"group must be one of {matrix.layouts(n, n)} at n={n} (the CUDA op's "
                             f"thread layouts; 0: the fastest that runs), got {group!r}")
        self.dim, self.H, self.n, self.backend, self.checkpoint = dim, H, n, backend, checkpoint
        self.group = group
        self.w_in = nn.Parameter(torch.empty(D, dim))
        self.conv = CausalConv(D, d_conv) if use_conv else None
        self.w_k, self.w_v, self.w_q, self.w_beta = (nn.Parameter(torch.empty(H * n, D)) for _ in range(4))
        self.b_beta = nn.Parameter(torch.full((H, n), 2.0))
        self.w_out = nn.Parameter(torch.empty(dim, H * n))
        self.dropout = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.w_in)
        nn.init.xavier_uniform_(self.w_out)
        with torch.no_grad():
            for w in (self.w_k, self.w_v, self.w_q, self.w_beta):
                for h in range(H):                   # each head's n x D slice on its own fans
                    nn.init.xavier_uniform_(w[h * n:(h + 1) * n])
        remember_shapes(self)

    def state_shape(self, B: int) -> tuple[int, int, int, int]:
        return (B, self.H, self.n, self.n)

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        check_sequence("E75", y, self.dim)
        check_parameters(self)
        B, T = y.shape[:2]
        H, n = self.H, self.n
        if h0 is not None and tuple(h0.shape) != (B, H, n, n):
            raise ValueError(f"h0 must be [B, H, n, n] = {(B, H, n, n)}, got {tuple(h0.shape)}")
        dt = autocast_dtype(y)
        a = y.transpose(0, 1).to(dt) @ self.w_in.to(dt).t()      # [T, B, D]
        x = F.silu(self.conv(a) if self.conv is not None else a)
        k, v, q = (x @ w.to(dt).t() for w in (self.w_k, self.w_v, self.w_q))
        acc = torch.promote_types(dt, torch.float32)
        beta = torch.sigmoid(x.to(acc) @ self.w_beta.to(acc).t() + self.b_beta.to(acc).reshape(-1))
        shape = (T, B, H, n)
        k = l2_normalize(k.reshape(shape)).to(dt)  # autocast may leave the normalised k in fp32
        S0 = y.new_zeros(B, H, n, n, dtype=acc) if h0 is None else h0.to(acc)
        o, S = cell(q.reshape(shape), k, v.reshape(shape), beta.reshape(shape), S0, self.backend,
                    self.checkpoint, self.group)
        o = o.to(dt)
        c = (o * F.silu(o)).reshape(T, B, H * n)
        return (self.dropout(c @ self.w_out.to(dt).t())).transpose(0, 1), S


def params(dim: int, expansion: float = 1.0, n_heads: int = 1, n_state: int = 64,
           use_conv: bool = False, d_conv: int = 4, **_) -> int:
    """dD + 4 Hn D + Hn + Hn d (+ the conv's D d_conv + D)."""
    D, Hn = int(dim * expansion), n_heads * n_state
    return dim * D + 4 * Hn * D + Hn + Hn * dim + ((d_conv + 1) * D if use_conv else 0)


_PATTERN = re.compile(r"e75h(\d+)(?:n(\d+))?", re.IGNORECASE)
SINGLE = {"75": 64, "75n32": 32, "75n48": 48, "75n64": 64, "75n96": 96}
MULTI = ((4, 16), (4, 24), (4, 32), (8, 16), (8, 24))       # the 100M standard configs


def level_options(level: str) -> dict:
    """Options of 'E75' / '75', 'E75n{N}' / '75n{N}' or any 'E75h{H}n{N}' (a missing n means 32)."""
    m = re.fullmatch(r"(?:e)?75(?:n(\d+))?", level, re.IGNORECASE)
    if m:
        return dict(n_heads=1, n_state=int(m.group(1) or 64))
    m = _PATTERN.fullmatch(level)
    if m is None:
        raise ValueError(f"{level!r} is not an E75 level: '75', '75n{{N}}' or 'E75h{{H}}n{{N}}'")
    return dict(n_heads=int(m.group(1)), n_state=int(m.group(2) or 32))


def layer_for(level: str, dim: int, expansion: float = 1.0, **options) -> E75:
    """The E75 layer of any E75 level name (patterns included), options overriding."""
    return E75(dim, expansion, **{**level_options(level), **options})


def _entry(name: str, opts: dict, aliases: tuple[str, ...] = ()):
    H, n = opts["n_heads"], opts["n_state"]

    def layer(dim: int, expansion: float = 1.0, **kw) -> E75:
        return E75(dim, expansion, **{**opts, **kw})

    return inputs.entry(
        name=name, aliases=aliases, layer=layer, reference=reference, cell=cell,
        layer_cases=lambda shape: [("", layer)], conditioned=("core",),  # as E88's core (e88.CONDITIONED)
        test_shapes=shapes((17, 2, 64, H, n, n), (1, 1, 48, H, n, n), (40, 1, 32, H, n, n)),
        title="E75: gated delta matrix memory, per-row forget gate",
        chapter="book/chapters/e75_gated_delta_matrix.ipynb",
        layer_params=lambda dim, expansion=1.0: params(dim, expansion, **opts))


def entry_for(level: str) -> Entry | None:
    """The entry of any E75 level name, patterns included ('E75h3n48'); None if `level` is not
    an E75 name."""
    try:
        opts = level_options(level)
    except ValueError:
        return None
    if opts["n_heads"] == 1 and _PATTERN.fullmatch(level) is None:
        n = opts["n_state"]
        return _entry("E75" if n == 64 and level.lower() in ("75", "e75") else f"E75n{n}", opts)
    return _entry(f"E75h{opts['n_heads']}n{opts['n_state']}", opts)


ENTRIES = (
    *(_entry("E" + name, dict(n_heads=1, n_state=n), (name,)) for name, n in SINGLE.items()),
    *(_entry(f"E75h{H}n{N}", dict(n_heads=H, n_state=N)) for H, N in MULTI),
)
