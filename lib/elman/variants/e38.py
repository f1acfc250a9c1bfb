"""E38, E39 with a bias. Chapter (with E39): book/chapters/e39_no_input_weight.ipynb.

    x_t = silu(W_in y_t)                                            (Template P)
    h_t = tanh(x_t + W_h h_{t-1} + b),  c_t = h_t * silu(h_t),  output W_out c_t
"""
from __future__ import annotations

import functools
import torch
import torch.nn.functional as F

from ..families.dense import inputs, layers
from .e39 import CHAPTER, EPILOGUE


def reference(x, w_h, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] + h @ w_h.t() + b)
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def cell(x, w_h, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E38's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the op runs with
    no W_x (wx = x)."""
    return layers.self_gated_cell(EPILOGUE, reference, "none", x, (w_h, b), h0, backend, path)


class E38(layers.SelfGatedLayer):
    """E38 layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W_h (options r_h_mode, spectral_radius 0.99, r_h_init_gain), b."""

    input_weight, radius = "none", 0.99
    cell_fn = staticmethod(cell)


layer_params = functools.partial(layers.params, input_weight="none", bias=True)


ENTRIES = (inputs.entry(
    name="E38", aliases=("38",), layer=E38, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="No input matrix: tanh(x + W_h h + b), output h * silu(h)",
    chapter=CHAPTER,
    layer_params=layer_params,
),)
