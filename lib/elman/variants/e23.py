"""E23, the dual-memory "tape" Elman. Chapter: book/chapters/e23_dual_memory_elman.ipynb.

    [a_t; z_t] = W_in y_t,  x_t = silu(a_t)                                  (Template S)
    State: working memory w [D] and a tape M [N, D] of N slots; s = 1 / sqrt(D).
    read    alpha_t = softmax_N(s M_{t-1} w_{t-1}),  r_t = M_{t-1}^T alpha_t
    update  w_t = tanh(W_h w_{t-1} + W_x x_t + r_t + b)
    write   u_t = W_wr w_t,  beta_t = softmax_N(s M_{t-1} w_t)  (new w, old tape)
            M_t = (1 - beta_t) M_{t-1} + beta_t u_t^T   (each slot n scaled by 1 - beta_n)
    output  c_t = w_t * silu(z_t),  layer output W_out c_t

The slot count N is a layer option (level 23: 8, 23n32: 32, 23n128: 128); no parameter
depends on it. On the GPU in bf16, N <= 32 and D <= 512 run the persistent kernels (tape on
chip, two cluster exchanges a step: families/twogemm/op.py); N = 128, larger D and fp32 run
the graph loop. The layer's state is the pair (w, M): `forward(y, h0=None)` returns
(out, (w_T, M_T)), and h0 may be that pair (or w alone, with an empty tape).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.layer import RecurrentLayer, autocast_dtype, check_backend
from ..families.twogemm import inputs, op as twogemm

SLOTS = {"E23": 8, "E23n32": 32, "E23n128": 128}


def reference(x, z, w_x, w_h, w_wr, b, h0=None, tape0=None, slots: int = 8):
    """The definition: a sequential loop over time-major [T, B, D] tensors. Returns
    (out [T, B, D], w_T [B, D], tape_T [B, N, D]); h0 and tape0 default to zeros (N =
    `slots` then)."""
    T, B, D = x.shape
    w = x.new_zeros(B, D) if h0 is None else h0
    tape = x.new_zeros(B, slots, D) if tape0 is None else tape0
    s = D ** -0.5
    outs = []
    for t in range(T):
        alpha = torch.softmax(s * torch.einsum("bnd,bd->bn", tape, w), dim=-1)
        read = torch.einsum("bn,bnd->bd", alpha, tape)
        w_new = torch.tanh(w @ w_h.t() + x[t] @ w_x.t() + read + b)
        u = w_new @ w_wr.t()
        beta = torch.softmax(s * torch.einsum("bnd,bd->bn", tape, w_new), dim=-1)
        tape = (1 - beta)[..., None] * tape + beta[..., None] * u[:, None, :]
        w = w_new
        outs.append(w * F.silu(z[t]))
    return torch.stack(outs), w, tape


def cell(x, z, w_x, w_h, w_wr, b, h0=None, tape0=None, backend: str = "cuda",
         path: str = "auto", slots: int = 8):
    """E23's cell on [T, B, D]: returns (c [T, B, D], w_T [B, D], tape_T [B, N, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, z, w_x, w_h, w_wr, b, h0, tape0, slots)
    T, B, D = twogemm.validate.sequence("x", x)
    if tape0 is None:
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive integer, got {slots!r}")
        tape0 = x.new_zeros(B, slots, D)
    h0 = x.new_zeros(B, D) if h0 is None else h0
    return twogemm.tape_cell(x, z, w_x, w_h, w_wr, b, h0, tape0, path)


class E23(RecurrentLayer):
    """E23 layer on Template S: `forward(y [B, T, d], h0=None) -> (out, (w_T [B, D],
    tape_T [B, N, D]))`. Its cell parameters: W_x, W_h (0.9 x orthogonal), W_wr, b; option
    `slots` (N, default 8)."""

    paths, template = twogemm.PATHS, "S"

    def build(self, D: int, slots: int = 8):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive integer, got {slots!r}")
        self.slots = slots
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_h = nn.Parameter(nn.init.orthogonal_(torch.empty(D, D)) * 0.9)
        self.w_wr = nn.Parameter(torch.empty(D, D))
        self.b = nn.Parameter(torch.zeros(D))
        return (self.w_x, self.w_wr)

    def cell(self, x, z, h0, tape0=None):
        dt = x.dtype
        w = (self.w_x, self.w_h, self.w_wr, self.b)
        return cell(x, z, *(p.to(dt) for p in w), h0, tape0, self.backend, self.path, self.slots)

    def forward(self, y: torch.Tensor, h0=None):
        """h0: None, the working memory w0 [B, D] (tape zeros) or the state (w0, tape0);
        returns (out [B, T, d], (w_T [B, D], tape_T [B, N, D]))."""
        w0, tape0 = h0 if isinstance(h0, (tuple, list)) else (h0, None)
        self.check(y, w0)
        B = y.shape[0]
        if tape0 is not None and tuple(tape0.shape) != (B, self.slots, self.inner):
            raise ValueError(f"tape0 must be [B, N, D] = {(B, self.slots, self.inner)}, "
                             f"got {tuple(tape0.shape)}")
        dt = autocast_dtype(y)
        yt = y.transpose(0, 1).to(dt)
        w_in = self.w_in.to(dt)
        D = self.inner
        a, z = yt @ w_in[:D].t(), yt @ w_in[D:].t()
        if self.conv is not None:
            a = self.conv(a)
        c, w, tape = self.cell(F.silu(a), z, None if w0 is None else w0.to(dt),
                               None if tape0 is None else tape0.to(dt))
        out = self.dropout(c) @ self.w_out.to(dt).t()
        return out.transpose(0, 1), (w, tape)


def _fixed(name: str, n: int):
    class Fixed(E23):
        __doc__ = f"E23 with N = {n} tape slots (level {name[1:]})."

        def build(self, D: int, slots: int = n):
            return super().build(D, slots)
    Fixed.__name__ = Fixed.__qualname__ = name
    return Fixed


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 3 * dim * D + 3 * D * D + D


def _entry(name: str, n: int):
    def ref(x, z, w_x, w_h, w_wr, b, h0=None, tape0=None):
        return reference(x, z, w_x, w_h, w_wr, b, h0, tape0, n)
    ref.__doc__ = reference.__doc__

    def fast(x, z, w_x, w_h, w_wr, b, h0=None, tape0=None, backend="cuda", path="auto"):
        return cell(x, z, w_x, w_h, w_wr, b, h0, tape0, backend, path, n)
    entry = inputs.entry(
        name=name, aliases=(name[1:],), layer=E23 if n == 8 else _fixed(name, n),
        reference=ref, cell=fast, test_shapes=inputs.tape_shapes(n),
        cuda_op="elman_twogemm.tape_read/tape_write/tape_write_backward/tape_read_backward",
        tolerance={"float32": inputs.Tolerance(1e-5, 1e-5), "bfloat16": inputs.Tolerance(2e-2, 3e-2)},
        title=f"Dual-memory Elman: tanh working memory + {n}-slot tape (softmax read, replacement write)",
        chapter="book/chapters/e23_dual_memory_elman.ipynb", layer_params=layer_params)
    return entry


ENTRIES = tuple(_entry(name, n) for name, n in SLOTS.items())
