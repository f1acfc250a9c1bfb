"""E1, the Mamba-gated Elman. Chapter: book/chapters/e01_gated_elman.ipynb.

    [a_t; z_t] = W_in y_t,  x_t = silu(a_t)                        (Template S)
    h_t = tanh(W_x x_t + W_h h_{t-1} + b),  c_t = h_t * silu(z_t),  output W_out c_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.layer import RecurrentLayer, check_backend, recurrent_weight
from ..families.dense import inputs, op as dense

EPILOGUE = "tanh_silu_gate"  # the dense op's epilogue: h = tanh(v), out = h * silu(z)


def reference(x, z, w_x, w_h, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w_x.t() + h @ w_h.t() + b)
        outs.append(h * F.silu(z[t]))
    return torch.stack(outs), h


def cell(x, z, w_x, w_h, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E1's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, z, w_x, w_h, b, h0)
    return dense.cell(EPILOGUE, x, (z,), w_x, w_h, b, h0, path)


class E1(RecurrentLayer):
    """E1 layer on Template S: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W_x, W_h (options r_h_mode, spectral_radius, r_h_init_gain), b."""

    paths, template = dense.PATHS, "S"

    def build(self, D: int, **w_h_options):
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_h = recurrent_weight(D, **w_h_options)
        self.b = nn.Parameter(torch.zeros(D))
        return (self.w_x,)

    def cell(self, x, z, h0):
        dt = x.dtype
        return cell(x, z, self.w_x.to(dt), self.w_h().to(dt), self.b.to(dt), h0,
                    self.backend, self.path)


def layer_params(dim: int, expansion: float = 1.0) -> int:
    D = int(dim * expansion)
    return 3 * dim * D + 2 * D * D + D


ENTRIES = (inputs.entry(
    name="E1", aliases=("1",), layer=E1, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="Mamba-gated Elman: tanh recurrence on silu(x), output h * silu(z)",
    chapter="book/chapters/e01_gated_elman.ipynb",
    layer_params=layer_params,
),)
