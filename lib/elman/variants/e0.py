"""E0, the stock Elman with a learned output gate. Chapter: book/chapters/e00_stock_elman.ipynb.

    x_t = W_in y_t  (no pre-activation; conv + silu only with use_conv)
    h_t = tanh(W_x x_t + W_h h_{t-1} + b),  c_t = h_t * silu(W_g x_t + b_g),  output W_out c_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import validate
from ..core.layer import RecurrentLayer, check_backend, recurrent_weight
from ..families.dense import inputs, op as dense

EPILOGUE = "tanh_silu_gate"  # the dense op's epilogue: h = tanh(v), out = h * silu(z)


def reference(x, w_x, w_h, w_g, b, b_g, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w_x.t() + h @ w_h.t() + b)
        outs.append(h * F.silu(x[t] @ w_g.t() + b_g))
    return torch.stack(outs), h


def cell(x, w_x, w_h, w_g, b, b_g, h0=None, backend: str = "cuda", path: str = "auto"):
    """E0's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the gate
    pre-activation z = W_g x + b_g is one GEMM for all steps; the recurrence is the dense op."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, w_x, w_h, w_g, b, b_g, h0)
    T, B, D = validate.sequence("x", x)
    validate.shapes({"W_g": (w_g, (D, D)), "b_g": (b_g, (D,))})
    z = torch.addmm(b_g, x.reshape(T * B, D), w_g.t()).view(T, B, D)
    return dense.cell(EPILOGUE, x, (z,), w_x, w_h, b, h0, path)


class E0(RecurrentLayer):
    """E0 layer: x = W_in y enters the cell as is (conv and silu only with use_conv). Its cell
    parameters: W_x, W_h (options r_h_mode, spectral_radius, r_h_init_gain), W_g, b, b_g."""

    template, paths = "E0", dense.PATHS

    def build(self, D: int, **w_h_options):
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_h = recurrent_weight(D, **w_h_options)
        self.w_g = nn.Parameter(torch.empty(D, D))
        self.b = nn.Parameter(torch.zeros(D))
        self.b_g = nn.Parameter(torch.zeros(D))
        return (self.w_x, self.w_g)

    def cell(self, x, z, h0):
        dt = x.dtype
        return cell(x, self.w_x.to(dt), self.w_h().to(dt), self.w_g.to(dt), self.b.to(dt),
                    self.b_g.to(dt), h0, self.backend, self.path)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 2 * dim * D + 3 * D * D + 2 * D


ENTRIES = (inputs.entry(
    name="E0", aliases=("0",), layer=E0, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="Stock Elman: tanh recurrence, output h * silu(W_g x + b_g)",
    chapter="book/chapters/e00_stock_elman.ipynb",
    layer_params=layer_params,
),)
