"""Inputs of the diagonal family: fresh random parity inputs by argument name (never zeros),
the family's parity shapes, its parity cases and the registry entry helper."""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from ...core.entry import Entry, ParityCase, Shape, Tolerance, shapes

# (T, B, D): B = 1 and T = 1, odd T and B, D not a multiple of 8 or 32 (the scalar kernel),
# D a multiple of 8 (the 16-byte kernel) with T beyond the prefetch depth, and large shapes
# with many channel blocks.
TEST_SHAPES = shapes(
    (1, 1, 32), (7, 3, 100), (33, 2, 48), (1, 4, 5), (64, 4, 256), (17, 5, 520),
    (129, 16, 1024), (13, 64, 2048), (300, 2, 96), (3, 64, 4096),
)


def random_inputs(T: int, B: int, D: int, names: tuple[str, ...], device, generator) -> dict[str, torch.Tensor]:
    """Fresh fp64 inputs by argument name (never zeros): `x` [T, B, D] ~ N(0, 1); a weight
    `w*` [D, D] Xavier-uniform; a bias `b*` [D] ~ N(0, 0.5); a per-channel vector `d*` [D]
    ~ U(0.3, 0.95) (inside E34's clamp); `h0` [B, D] ~ U(-0.5, 0.5)."""
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    a = (6.0 / (2 * D)) ** 0.5
    out = {}
    for n in names:
        if n == "x":
            out[n] = torch.randn(T, B, D, **kw)
        elif n == "h0":
            out[n] = torch.rand(B, D, **kw) - 0.5
        elif n.startswith("w"):
            out[n] = (torch.rand(D, D, **kw) * 2 - 1) * a
        elif n.startswith("b"):
            out[n] = 0.5 * torch.randn(D, **kw)
        elif n.startswith("d"):
            out[n] = 0.3 + 0.65 * torch.rand(D, **kw)
        else:
            raise ValueError(f"no random input for argument {n!r} of a diagonal reference")
    return {k: v.requires_grad_() for k, v in out.items()}


def reference_inputs(reference: Callable, shape: Shape, device, generator) -> dict[str, torch.Tensor]:
    """Fresh fp64 inputs for every argument of a diagonal reference, by name (`random_inputs`)."""
    names = tuple(inspect.signature(reference).parameters)
    return random_inputs(shape.T, shape.B, shape.D, names, device, generator)


def time_major(name: str, t: torch.Tensor) -> bool:
    """Whether a reference input has one slice per step ([T, B, D]: only x)."""
    return t.dim() == 3


def parity_cases(reference: Callable, cell: Callable, shape: Shape, dtype: torch.dtype, device,
                 generator) -> list[ParityCase]:
    """A diagonal variant's parity case: its `cell` (backend="cuda", the scan kernel) against
    its `reference`, on the same fresh inputs."""
    kw = reference_inputs(reference, shape, device, generator)
    return [ParityCase(kw, lambda **a: cell(**a, backend="cuda"), reference, ("out", "h_T"),
                       "cuda:scan")]


def entry(*, reference: Callable, cell: Callable, **fields) -> Entry:
    """The registry entry of a diagonal variant: its own fields (name, aliases, layer, title,
    chapter, layer_params, and `epilogue` = the name of its step in the kernel's table) with
    the family's parity builder, shapes, tolerances and op."""
    defaults = dict(
        family="diagonal", kind="variant", test_shapes=TEST_SHAPES,
        cuda_op="elman_diagonal.forward/backward",
        tolerance={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(1e-2, 2e-2)},
        parity=lambda shape, dtype, device, generator: parity_cases(
            reference, cell, shape, dtype, device, generator))
    return Entry(reference=reference, **{**defaults, **fields})
