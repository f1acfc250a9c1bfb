"""E42, linear recurrence with tied weights and a self gate. Chapter:
book/chapters/e42_linear_tied.ipynb.

    x_t = silu(W_in y_t)                                            (Template P)
    h_t = W x_t + W h_{t-1} + b,  c_t = h_t * silu(h_t),  output W_out c_t

One matrix W (spectrally normalised to 0.999 by default) acts on the input and on the state;
its gradient is the sum of both uses. Per step: one GEMM W h and the fused linear self gate;
W x is one GEMM for all steps.
"""
from __future__ import annotations

import functools
import torch
import torch.nn.functional as F

from ..families.dense import inputs, layers

EPILOGUE = "linear_self_gate"  # the dense op's epilogue: h = v, out = h * silu(h)


def reference(x, w, b, h0=None):
    """The definition: a sequential loop over time-major [T, B, D] tensors."""
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        h = (x[t] + h) @ w.t() + b
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def cell(x, w, b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E42's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). On CUDA the one tensor W is
    the op's W_x and W_h, so autograd sums the two gradients into it."""
    return layers.self_gated_cell(EPILOGUE, reference, "tied", x, (w, b), h0, backend, path)


class E42(layers.SelfGatedLayer):
    """E42 layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its cell
    parameters: W (options r_h_mode, spectral_radius 0.999, r_h_init_gain), b."""

    input_weight, radius = "tied", 0.999
    cell_fn = staticmethod(cell)


layer_params = functools.partial(layers.params, input_weight="tied", bias=True)


ENTRIES = (inputs.entry(
    name="E42", aliases=("42",), layer=E42, reference=reference, cell=cell,
    epilogue=EPILOGUE,
    title="Linear recurrence, tied weights, output h * silu(h)",
    chapter="book/chapters/e42_linear_tied.ipynb",
    layer_params=layer_params,
),)
