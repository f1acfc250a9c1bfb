"""E39, no input matrix and no bias; E38 (e38.py) is the same with a bias. Chapter:
book/chapters/e39_no_input_weight.ipynb.

    x_t = silu(W_in y_t)                                            (Template P)
    h_t = tanh(x_t + W_h h_{t-1}),  c_t = h_t * silu(h_t),  output W_out c_t

x_t enters the recurrence as it is: there is nothing to precompute, and per step one GEMM
W_h h plus the fused tanh and self gate. W_h is spectrally normalised to 0.99 by default.
"""
from __future__ import annotations

import functools
import torch
import torch.nn.functional as F

from ..families.dense import inputs, layers

EPILOGUE = "tanh_self_gate"  # the dense op's epilogue: h = tanh(v), out = h * silu(h)
CHAPTER = "book/chapters/e39_no_input_weight.ipynb"


def reference(x, w_h, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] + h @ w_h.t())
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def cell(x, w_h, h0=None, backend: str = "cuda", path: str = "auto"):
    """E39's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the op runs with
    no W_x (wx = x) and no bias."""
    return layers.self_gated_cell(EPILOGUE, reference, "none", x, (w_h,), h0, backend, path)


class E39(layers.SelfGatedLayer):
    """E39 layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameter: W_h (options r_h_mode, spectral_radius 0.99, r_h_init_gain)."""

    input_weight, bias, radius = "none", False, 0.99
    cell_fn = staticmethod(cell)


layer_params = functools.partial(layers.params, input_weight="none", bias=False)


ENTRIES = (inputs.entry(
    name="E39", aliases=("39",), layer=E39, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="No input matrix, no bias: tanh(x + W_h h), output h * silu(h)",
    chapter=CHAPTER,
    layer_params=layer_params,
),)
