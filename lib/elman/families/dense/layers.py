"""The layer shape shared by the self-gated dense variants (E33, E36, E37, E38, E39, E42):
Template P, a cell whose output is h * silu(h), and one of three input sides.

    input_weight "own":  v = W_x x + W_h h_{t-1} (+ b)   W_x Xavier, W_h the recurrent weight
    input_weight "tied": v = W x + W h_{t-1} (+ b)       one W, the recurrent weight
    input_weight "none": v = x + W_h h_{t-1} (+ b)       no input matrix

The recurrent weight (`W_h`, or the tied `W`) is `core.spectral.RecurrentWeight`: raw
Xavier with gain `r_h_init_gain` (0.1), spectral normalisation to the variant's `radius`
unless `r_h_mode` says otherwise (`spectral_norm` on by default; `none` turns it off).
A variant's layer sets the class attributes and `cell_fn` (its module's cell function, which
takes the weights in the order of `weights(dtype)`); its cell function is one call of
`self_gated_cell`.
"""
from __future__ import annotations

import torch
from torch import nn

from ...core.layer import RecurrentLayer, check_backend, recurrent_weight
from .op import PATHS, cell as dense_cell

INPUT_WEIGHTS = ("own", "tied", "none")


class SelfGatedLayer(RecurrentLayer):
    """Template P dense layer; its cell weights are `weights(dtype)`: (W_x, W_h, b) for
    "own", (W, b) for "tied", (W_h, b) for "none", without b when `bias` is False."""

    template, paths = "P", PATHS
    input_weight = "own"
    bias = True
    radius = 0.99
    cell_fn = None  # the variant's cell function (a staticmethod)

    def build(self, D: int, r_h_mode: str = "spectral_norm", spectral_radius: float | None = None,
              r_h_init_gain: float = 0.1):
        if self.input_weight not in INPUT_WEIGHTS:
            raise ValueError(f"{type(self).__name__}.input_weight must be one of {INPUT_WEIGHTS}")
        radius = self.radius if spectral_radius is None else spectral_radius
        recurrent = recurrent_weight(D, r_h_mode, radius, r_h_init_gain)
        xavier = ()
        if self.input_weight == "tied":
            self.w = recurrent
        else:
            self.w_h = recurrent
        if self.input_weight == "own":
            self.w_x = nn.Parameter(torch.empty(D, D))
            xavier = (self.w_x,)
        if self.bias:
            self.b = nn.Parameter(torch.zeros(D))
        return xavier

    def weights(self, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        """The cell's weights in the compute dtype, spectral normalisation applied."""
        if self.input_weight == "tied":
            ws = [self.w().to(dt)]
        elif self.input_weight == "own":
            ws = [self.w_x.to(dt), self.w_h().to(dt)]
        else:
            ws = [self.w_h().to(dt)]
        return (*ws, self.b.to(dt)) if self.bias else tuple(ws)

    def cell(self, x, z, h0):
        return type(self).cell_fn(x, *self.weights(x.dtype), h0, self.backend, self.path)


def self_gated_cell(epilogue: str, reference, input_weight: str, x: torch.Tensor,
                    weights: tuple[torch.Tensor, ...], h0: torch.Tensor | None, backend: str,
                    path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A self-gated variant's cell on [T, B, D]: its `reference` on (x, *weights, h0), or the
    dense op with `epilogue`. `weights` are (W_x, W_h[, b]) for "own", (W[, b]) for "tied"
    (the one tensor is the op's W_x and W_h, so autograd sums both gradients into it) and
    (W_h[, b]) for "none" (the op runs without W_x: wx = x)."""
    check_backend(backend)
    if backend == "reference":
        return reference(x, *weights, h0)
    if input_weight == "own":
        w_x, w_h, *b = weights
    elif input_weight == "tied":
        w_h, *b = weights
        w_x = w_h
    else:
        w_x, (w_h, *b) = None, weights
    return dense_cell(epilogue, x, (), w_x, w_h, b[0] if b else None, h0, path)


def params(dim: int, expansion: float = 1.0, input_weight: str = "own", bias: bool = True) -> int:
    """P_layer of a SelfGatedLayer: W_in and W_out (2 d D), W_h or W (D^2), W_x (D^2 when
    "own"), b (D when `bias`)."""
    D = int(dim * expansion)
    return 2 * dim * D + D * D * (2 if input_weight == "own" else 1) + (D if bias else 0)
