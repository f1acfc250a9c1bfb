"""E56, the concatenated single-GEMM Elman. Chapter: book/chapters/e56_concat.ipynb.

    [a_t; z_t] = W_in y_t,  x_t = silu(a_t)                        (Template S)
    h_t = tanh(W [x_t; h_{t-1}] + b),  c_t = h_t * silu(z_t),  output W_out c_t

W is one D x 2D parameter (Xavier over the whole matrix, no spectral normalisation). The
earlier code concatenated [x_t; h_{t-1}] every step and ran one GEMM of twice E1's per-step
work. Here W's input half W[:, :D] runs as one GEMM for all steps and only the recurrent
half W[:, D:] stays in the loop (on the persistent path, in registers): the same math as E1
with the two matrices stored side by side.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import validate
from ..core.layer import RecurrentLayer, check_backend
from ..families.dense import inputs, op as dense

EPILOGUE = "tanh_silu_gate"  # the dense op's epilogue: h = tanh(v), out = h * silu(z)


def reference(x, z, w_xh, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(torch.cat([x[t], h], -1) @ w_xh.t() + b)
        outs.append(h * F.silu(z[t]))
    return torch.stack(outs), h


def cell(x, z, w_xh, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E56's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the halves of W
    are the op's W_x and W_h; their gradients land in the two halves of W's gradient."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, z, w_xh, b, h0)
    T, B, D = validate.sequence("x", x)
    validate.shapes({"W": (w_xh, (D, 2 * D))})
    return dense.cell(EPILOGUE, x, (z,), w_xh[:, :D], w_xh[:, D:], b, h0, path)


class E56(RecurrentLayer):
    """E56 layer on Template S: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W [D, 2D], b."""

    paths, template = dense.PATHS, "S"

    def build(self, D: int):
        self.w = nn.Parameter(torch.empty(D, 2 * D))
        self.b = nn.Parameter(torch.zeros(D))
        return (self.w,)

    def cell(self, x, z, h0):
        dt = x.dtype
        return cell(x, z, self.w.to(dt), self.b.to(dt), h0, self.backend, self.path)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 3 * dim * D + 2 * D * D + D


ENTRIES = (inputs.entry(
    name="E56", aliases=("56",), layer=E56, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="Concatenated single-GEMM Elman: tanh(W [x; h] + b), output h * silu(z)",
    chapter="book/chapters/e56_concat.ipynb",
    layer_params=layer_params,
),)
