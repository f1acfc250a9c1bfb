"""Inputs of the dense family: fresh random parity and benchmark inputs (never zeros),
the family's parity shapes, and the parity cases of a dense variant's cell."""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from ...core.entry import Entry, ParityCase, Shape, Tolerance, shapes
from . import op

# (T, B, D): B=1 and T=1, odd T and B, D not a multiple of 32, and the sizes the
# persistent kernels take: the cluster design at D = 256..1024 in steps of 256 (B = 130
# needs two waves of 16-column clusters at D = 1024), the grid design at D = 2048 with
# 8, 32 and 64 batch columns and at its padded widths (384: one tile of six blocks; 1152
# and 1920: the last tile partly beyond D), B = 70 beyond it (the per-step path); the wide
# cluster design at D = 1280, B = 70 (nine clusters of 8 columns, the last one partly empty).
TEST_SHAPES = shapes(
    (1, 1, 32), (7, 3, 100), (33, 2, 48), (64, 4, 256), (17, 5, 512),
    (9, 16, 1024), (13, 64, 512), (5, 8, 768), (3, 2, 2048), (6, 64, 1024), (4, 130, 1024),
    (6, 20, 2048), (5, 64, 2048), (4, 70, 2048),
    (5, 3, 384), (4, 64, 1152), (3, 9, 1920), (4, 70, 1280),
)


def random_inputs(T: int, B: int, D: int, names: tuple[str, ...], device, generator,
                  radius: float = 0.99) -> dict[str, torch.Tensor]:
    """Fresh fp64 parity inputs for a dense cell (never zeros): activations ~ N(0, 1),
    square weights Xavier-uniform, W_h rescaled to spectral norm `radius` as the layer's
    spectral normalisation would, biases ~ N(0, 0.1), h0 ~ U(-0.5, 0.5). Two weight names of
    single-matrix variants: `w` (one W [D, D] used on the input and on h, spectral norm
    `radius`: E37, E42) and `w_xh` (E56's W = [W_x, W_h], [D, 2D]: a Xavier input half
    beside a recurrent half of spectral norm `radius`). E63's gates: `w_a`, `w_b` Xavier like
    W_x, `b_a`, `b_b` like b, `u_a`, `u_b` recurrent like W_h."""
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    a = (6.0 / (2 * D)) ** 0.5
    make = {
        "x": lambda: torch.randn(T, B, D, **kw),
        "z": lambda: torch.randn(T, B, D, **kw),
        "w_x": lambda: (torch.rand(D, D, **kw) * 2 - 1) * a,
        "w_g": lambda: (torch.rand(D, D, **kw) * 2 - 1) * a,
        "b": lambda: 0.1 * torch.randn(D, **kw),
        "b_g": lambda: 0.1 * torch.randn(D, **kw),
        "h0": lambda: torch.rand(B, D, **kw) - 0.5,
    }
    make.update(w_a=make["w_x"], w_b=make["w_x"], b_a=make["b"], b_b=make["b"])

    def recurrent():
        w = torch.randn(D, D, **kw)
        return w * (radius / torch.linalg.matrix_norm(w, ord=2))
    make.update(w_h=recurrent, w=recurrent, u_a=recurrent, u_b=recurrent,
                w_xh=lambda: torch.cat([make["w_x"](), recurrent()], 1))
    out = {n: make[n]() for n in names}
    return {k: v.requires_grad_() for k, v in out.items()}


def reference_inputs(reference: Callable, shape: Shape, device, generator) -> dict[str, torch.Tensor]:
    """Fresh fp64 inputs for every argument of a dense reference, by name (see
    `random_inputs`): time-major activations and gates [T, B, D], weights [D, D], biases
    [D], the initial state h0 [B, D]."""
    names = tuple(inspect.signature(reference).parameters)
    return random_inputs(shape.T, shape.B, shape.D, names, device, generator)


def time_major(name: str, t: torch.Tensor) -> bool:
    """Whether a reference input has one slice per step ([T, B, D]: activations, gates)."""
    return t.dim() == 3


def parity_cases(reference: Callable, cell: Callable, shape: Shape, dtype: torch.dtype, device,
                 generator, epilogue: str = "tanh_silu_gate") -> list[ParityCase]:
    """A dense variant's parity cases: its `cell` (with backend="cuda") on each path that
    takes this size with its `epilogue` against its `reference`, on the same fresh inputs."""
    kw = reference_inputs(reference, shape, device, generator)
    return [ParityCase(kw, lambda p=p, **a: cell(**a, backend="cuda", path=p), reference,
                       ("out", "h_T"), "cuda:" + p)
            for p in op.paths(shape.B, shape.D, dtype, epilogue)]


def entry(*, reference: Callable, cell: Callable, **fields) -> Entry:
    """The registry entry of a dense variant: its own fields (name, layer, epilogue, title,
    chapter, layer_params, ...) with the family's parity builder, shapes, tolerances and op."""
    defaults = dict(
        family="dense", kind="variant", test_shapes=TEST_SHAPES, cuda_op="elman_dense.forward/backward",
        tolerance={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(1e-2, 2e-2)},
        parity=lambda shape, dtype, device, generator: parity_cases(
            reference, cell, shape, dtype, device, generator,
            fields.get("epilogue") or "tanh_silu_gate"))
    return Entry(reference=reference, **{**defaults, **fields})
