"""Inputs of the matrix family: fresh random parity inputs (never zeros), the family's parity
shapes, and the parity cases of a matrix variant: its recurrence core on the CUDA op against
its reference (fp32 and bf16), and its whole layer (every parameter's gradient, h0 included)
on backend 'cuda' against backend 'reference' (fp32)."""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch.func import functional_call

from ...core.entry import Entry, ParityCase, Shape, Tolerance, shapes
from . import op
from .reference import l2_normalize

# Shape(T, B, D, H, n, v); D is the layer width of the layer cases. T = 1, B = 1, odd H, T not
# a multiple of the checkpoint interval (16), rectangular states both ways, then every
# supported (n, v) pair at small T (core only: D = 0 is not a layer width, so `layer_shapes`
# leaves them out).
TEST_SHAPES = shapes(
    (1, 1, 32, 1, 8, 8), (17, 2, 64, 3, 16, 16), (40, 1, 64, 2, 32, 32), (23, 3, 96, 5, 24, 48),
    (35, 2, 128, 4, 32, 64), (19, 2, 64, 1, 64, 32), (9, 2, 128, 2, 128, 128),
    (33, 1, 96, 3, 96, 96),
)
PAIR_SHAPES = tuple(Shape(5, 2, 1, 1, n, v) for n in op.SIZES for v in op.SIZES)
# bf16 gradients: at B = H = T = 1 the decay's gradient is one scalar, a sum of n v products of
# bf16-rounded values with heavy cancellation (4e-2 measured at n = v = 8; at most 1.4e-2 at
# every larger shape)
TOLERANCE = {"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 5e-2)}


def _dims(shape: Shape) -> tuple[int, int, int, int, int]:
    n = shape.n or 4
    return shape.T, shape.B, shape.H or 2, n, shape.v or n


def random_inputs(T: int, B: int, H: int, n: int, v: int, names: tuple[str, ...], device,
                  generator, decay: str = "scalar") -> dict[str, torch.Tensor]:
    """Fresh fp64 leaves: q, k L2-normalised N(0, 1) [T, B, H, n], v ~ N(0, 1) [T, B, H, v],
    decay ~ U(0.5, 1) ([T, B, H] or [T, B, H, v] for decay='column'), beta ~ U(0.2, 1)
    [T, B, H], h0 ~ U(-0.5, 0.5) [B, H, n, v]."""
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    make = {
        "q": lambda: l2_normalize(torch.randn(T, B, H, n, **kw)),
        "k": lambda: l2_normalize(torch.randn(T, B, H, n, **kw)),
        "v": lambda: torch.randn(T, B, H, v, **kw),
        "decay": lambda: 0.5 + 0.5 * torch.rand(T, B, H, *((v,) if decay == "column" else ()), **kw),
        "beta": lambda: 0.2 + 0.8 * torch.rand(T, B, H, **kw),
        "h0": lambda: torch.rand(B, H, n, v, **kw) - 0.5,
    }
    return {name: make[name]().requires_grad_() for name in names}


def reference_inputs(reference: Callable, shape: Shape, device, generator) -> dict[str, torch.Tensor]:
    """Inputs of a matrix reference by argument name (`random_inputs`); a Shape without H, n, v
    gets H = 2, n = v = 4. A reference with a `decay_kind` attribute 'column' gets a per-column
    decay."""
    T, B, H, n, v = _dims(shape)
    if hasattr(reference, "make_inputs"):  # the single-state variants' own kinds (single.py)
        return reference.make_inputs(T, B, H, n, v, device, generator)
    names = tuple(inspect.signature(reference).parameters)
    return random_inputs(T, B, H, n, v, names, device, generator,
                         getattr(reference, "decay_kind", "scalar"))


def time_major(name: str, t: torch.Tensor) -> bool:
    """Whether a reference input has one slice per step (q, k, v, decay, beta, and the per-step
    inputs of the single-state variants: PER_STEP)."""
    return name in ("q", "k", "v", "decay", "beta") or name in PER_STEP


# per-step inputs of the E70-E74 and E14 references (lam, delta, bias, rho, retain are not)
PER_STEP = ("alpha_x", "alpha", "z", "gate_x", "erase", "write", "key", "val", "dec", "qry")


def core_cases(reference: Callable, cell: Callable, shape: Shape, device, generator,
               conditioned: bool = False) -> list[ParityCase]:
    """The core on the CUDA op against the reference, on the same inputs for every thread layout
    the kernels take at this v (`op.groups`): impl 'cuda:core' (the default), 'cuda:core:G<g>'."""
    kw = reference_inputs(reference, shape, device, generator)
    return [ParityCase(kw, lambda g=g, **a: cell(**a, group=g), reference, ("o", "S_T"),
                       "cuda:core" + (f":G{g}" if g else ""), conditioned)
            for g in op.groups(shape.v or shape.n or 4)]


def layer_case(layer: Callable[..., torch.nn.Module], shape: Shape, device, generator,
               label: str = "", conditioned: bool = False) -> ParityCase:
    """The whole layer at width shape.D: every parameter, y and h0 are inputs; the same
    module runs on backend 'cuda' (fast) and 'reference'. The module's initialisation is
    seeded from `generator`, so that a seed gives the same case on every run."""
    seed = int(torch.randint(0, 2**62, (), generator=generator, device=generator.device))
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        module = layer(shape.D)
    module = module.to(device)
    names = [n for n, _ in module.named_parameters()]
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    params = {n: p.detach().double().to(device) for n, p in module.named_parameters()}
    params = {n: (p + 0.01 * torch.randn(p.shape, **kw)).requires_grad_() for n, p in params.items()}
    y = torch.randn(shape.B, shape.T, shape.D, **kw).requires_grad_()
    S = getattr(module, "state_shape", None)
    h0 = (torch.rand(*S(shape.B), **kw) - 0.5).requires_grad_()

    def run(backend: str, y, h0, **p):
        module.backend = backend
        return functional_call(module, p, (y, h0))

    return ParityCase({"y": y, "h0": h0, **params}, lambda **a: run("cuda", **a),
                      lambda **a: run("reference", **a), ("out", "S_T"),
                      "cuda:layer" + (f"[{label}]" if label else ""), conditioned)


def entry(*, reference: Callable, cell: Callable, layer: Callable, layer_cases: Callable | None = None,
          test_shapes=TEST_SHAPES, conditioned: tuple[str, ...] = (), **fields) -> Entry:
    """The registry entry of a matrix variant. `cell(**reference inputs, group=g)` runs its core
    on the CUDA op; `layer_cases(shape)` gives [(label, layer factory(dim))] for the layer
    comparisons at a shape (default: the entry's layer as registered); the labels in
    `conditioned` are ill-conditioned configurations (ParityCase.conditioned), "core" the core
    cases."""
    cases = layer_cases or (lambda shape: [("", layer)])

    def parity(shape: Shape, dtype, device, generator) -> list[ParityCase]:
        first = test_shapes[0]  # a shape without heads or state sizes takes the entry's first
        shape = Shape(shape.T, shape.B, shape.D, shape.H or first.H, shape.n or first.n, shape.v or first.v)
        out = core_cases(reference, cell, shape, device, generator, "core" in conditioned)
        # The layer cases run in fp32 only: in bf16 the harness rounds every parameter (A_log,
        # dt_bias, the projections) before the fast run, which measures that rounding, not a kernel.
        if shape.D > 1 and dtype == torch.float32:
            out += [layer_case(f, shape, device, generator, label, label in conditioned)
                    for label, f in cases(shape)]
        return out

    defaults = dict(family="matrix", kind="variant", test_shapes=test_shapes, tolerance=TOLERANCE,
                    cuda_op="elman_matrix.forward/backward", parity=parity)
    return Entry(reference=reference, layer=layer, **{**defaults, **fields})
