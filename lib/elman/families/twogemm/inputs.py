"""Inputs of the two-GEMM family: fresh random parity and benchmark inputs (never zeros),
the family's parity shapes, and the parity cases of a variant's cell.

Inputs are made by the reference's argument names: activations x, z, y [T, B, D]; square
weights w_* [D, D] (Xavier-uniform; E23's w_h scaled to spectral norm 0.9 like its
0.9-orthogonal init); low-rank factor pairs (u, v), (u_h, v_h), ... of shapes [D, r] and
[r, D], with each product rescaled to spectral norm 0.95 (what E4's normalisation gives);
biases b* ~ N(0, 0.1); h0 ~ U(-0.5, 0.5) [B, D]; E23's tape0 ~ N(0, 0.5^2) [B, N, D]. The
rank r and slot count N come from the entry (`rank(D)`, the shape's `n`).
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from ...core.entry import Entry, ParityCase, Shape, Tolerance, shapes
from . import op

# (T, B, D): B = 1 and T = 1, odd T and B, D not a multiple of 32 (nor of the persistent
# kernel's 8 or 16 CTAs), T = 33 (not a multiple of the tape's checkpoint interval
# ceil(sqrt(33)) = 6), B = 20 (three 8-column clusters, the last one partly filled), the
# benchmark's D = 512 and a D = 2048 whose factors may not fit a cluster (the graph path).
TEST_SHAPES = shapes((1, 1, 32), (7, 3, 100), (33, 2, 48), (64, 4, 256), (17, 5, 512),
                     (5, 20, 1024), (3, 2, 2048))


def tape_shapes(N: int) -> tuple[Shape, ...]:
    """E23's parity shapes for N slots (the shape's `n`)."""
    return tuple(Shape(T, B, D, None, N) for T, B, D in
                 ((1, 1, 32), (7, 3, 100), (33, 2, 48), (17, 4, 512), (6, 2, 256)))


def default_rank(D: int) -> int:
    return max(2, D // 4)


def product_norm(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The spectral norm of U V without forming it: with U = Q_u R_u and V^T = Q_v R_v (reduced
    QR), U V = Q_u (R_u R_v^T) Q_v^T, and R_u R_v^T is at most min(D, r) square."""
    return torch.linalg.matrix_norm(torch.linalg.qr(u).R @ torch.linalg.qr(v.t()).R.t(), ord=2)


def _pair(D: int, r: int, kw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    u = torch.randn(D, r, **kw) / r ** 0.5
    v = torch.randn(r, D, **kw) / D ** 0.5
    scale = (0.95 / product_norm(u, v)).sqrt()
    return u * scale, v * scale


def random_inputs(T: int, B: int, D: int, names: tuple[str, ...], device, generator,
                  rank: int | None = None, slots: int = 8) -> dict[str, torch.Tensor]:
    """Fresh fp64 inputs by name (module docstring), all requiring gradients."""
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    r = default_rank(D) if rank is None else rank
    a = (6.0 / (2 * D)) ** 0.5
    out: dict[str, torch.Tensor] = {}
    for n in names:
        if n in out:
            continue
        if n in ("x", "z", "y"):
            out[n] = torch.randn(T, B, D, **kw)
        elif n == "w_h":
            w = torch.randn(D, D, **kw)
            out[n] = w * (0.9 / torch.linalg.matrix_norm(w, ord=2))
        elif n.startswith("w_"):
            out[n] = (torch.rand(D, D, **kw) * 2 - 1) * a
        elif n.startswith("u"):
            partner = "v" + n[1:]
            out[n], out[partner] = _pair(D, r, kw)
        elif n.startswith("b"):
            out[n] = 0.1 * torch.randn(D, **kw)
        elif n == "h0":
            out[n] = torch.rand(B, D, **kw) - 0.5
        elif n == "tape0":
            out[n] = 0.5 * torch.randn(B, slots, D, **kw)
        else:
            raise ValueError(f"no random input for argument {n!r}")
    return {n: out[n].requires_grad_() for n in names}


def reference_inputs(reference: Callable, shape: Shape, device, generator,
                     rank: int | None = None) -> dict[str, torch.Tensor]:
    """Fresh fp64 inputs for every argument of a two-GEMM reference, by name (see
    `random_inputs`); the tape's slot count is the shape's `n` (8 when unset)."""
    names = tuple(inspect.signature(reference).parameters)
    return random_inputs(shape.T, shape.B, shape.D, names, device, generator, rank, shape.n or 8)


def time_major(name: str, t: torch.Tensor) -> bool:
    """Whether a reference input has one slice per step ([T, B, D]: activations, gates)."""
    return name in ("x", "z", "y")


STATES = ("h0", "tape0")  # the state inputs a reference takes, in the order it returns them


class ParityBuilder:
    """A two-GEMM variant's parity builder (the entry's `parity`): called with (shape, dtype,
    device, generator), its `cell` (backend="cuda") on each path against its `reference`, on
    the same fresh inputs, every output named (E23 adds the tape); `paths` names those paths
    without making inputs. `rank(D)` is the factors' rank in the inputs; a tape variant's slot
    count is the shape's `n` (8 when unset)."""

    def __init__(self, reference: Callable, cell: Callable, rank: Callable[[int], int] = default_rank):
        self.reference, self.cell, self.rank = reference, cell, rank
        self.tape = "tape0" in inspect.signature(reference).parameters

    def paths(self, shape: Shape, dtype: torch.dtype) -> list[str]:
        if self.tape:
            return op.paths(shape.B, shape.D, dtype, slots=shape.n or 8)
        return op.paths(shape.B, shape.D, dtype, rank=self.rank(shape.D))

    def __call__(self, shape: Shape, dtype: torch.dtype, device, generator) -> list[ParityCase]:
        kw = reference_inputs(self.reference, shape, device, generator, self.rank(shape.D))
        outputs = ("out", "h_T", "tape_T") if self.tape else ("out", "h_T")
        return [ParityCase(kw, lambda p=p, **a: self.cell(**a, backend="cuda", path=p),
                           self.reference, outputs, "cuda:" + p)
                for p in self.paths(shape, dtype)]


def entry(*, reference: Callable, cell: Callable, rank: Callable[[int], int] = default_rank,
          **fields) -> Entry:
    """The registry entry of a two-GEMM variant: its own fields (name, layer, title, chapter,
    layer_params, ...) with the family's parity builder, shapes, tolerances and op. `rank(D)`
    is the factors' rank in the parity inputs."""
    defaults = dict(
        family="twogemm", kind="variant", test_shapes=TEST_SHAPES,
        cuda_op="elman_twogemm.lowrank_forward/lowrank_backward",
        tolerance={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(1e-2, 2e-2)},
        parity=ParityBuilder(reference, cell, rank))
    return Entry(reference=reference, **{**defaults, **fields})


def sequence_check(reference: Callable, T: int = 4, B: int = 2, D: int = 5, n: int = 3) -> float:
    """The whole sequence against T single steps that carry every state the reference takes
    and returns (`STATES`: h0, and E23's tape0): the max abs difference of outputs and final
    states, fp64 on the CPU."""
    kw = {k: v.detach() for k, v in reference_inputs(
        reference, Shape(T, B, D, None, n), "cpu", torch.Generator().manual_seed(0)).items()}
    states = [s for s in STATES if s in kw]
    full = reference(**kw)
    carried, outs = {s: kw[s] for s in states}, []
    for t in range(T):
        step = {k: (v[t:t + 1] if time_major(k, v) else v) for k, v in kw.items()}
        out, *final = reference(**{**step, **carried})
        carried = dict(zip(states, final))
        outs.append(out)
    pairs = [(torch.cat(outs), full[0]), *zip(carried.values(), full[1:])]
    return max((a - b).abs().max().item() for a, b in pairs)
