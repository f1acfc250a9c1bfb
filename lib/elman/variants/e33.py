"""E33, the self-gated Elman. Chapter: book/chapters/e33_self_gated.ipynb.

    x_t = silu(W_in y_t)                                            (Template P)
    h_t = tanh(W_x x_t + W_h h_{t-1} + b),  c_t = h_t * silu(h_t),  output W_out c_t

The output gate is the state itself: no z branch, so W_in is D x d. W_h is spectrally
normalised to 0.99 by default.
"""
from __future__ import annotations

import functools
import torch
import torch.nn.functional as F

from ..families.dense import inputs, layers

EPILOGUE = "tanh_self_gate"  # the dense op's epilogue: h = tanh(v), out = h * silu(h)


def reference(x, w_x, w_h, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w_x.t() + h @ w_h.t() + b)
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def cell(x, w_x, w_h, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E33's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D])."""
    return layers.self_gated_cell(EPILOGUE, reference, "own", x, (w_x, w_h, b), h0, backend, path)


class E33(layers.SelfGatedLayer):
    """E33 layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W_x, W_h (options r_h_mode, spectral_radius 0.99, r_h_init_gain), b."""

    radius = 0.99
    cell_fn = staticmethod(cell)


layer_params = functools.partial(layers.params, input_weight="own", bias=True)


ENTRIES = (inputs.entry(
    name="E33", aliases=("33",), layer=E33, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="Self-gated Elman: tanh recurrence, output h * silu(h)",
    chapter="book/chapters/e33_self_gated.ipynb",
    layer_params=layer_params,
),)
