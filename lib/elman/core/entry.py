"""What a registry entry says about a variant or baseline: its layer, reference, parity
builder, shapes, tolerances and kernel family. `elman.registry` collects the entries.
`run_case` runs one parity comparison (the harness and the baselines' own checks share it)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from . import extension

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FAMILIES = ("dense", "diagonal", "matrix", "twogemm")  # kernel families of the variants
KINDS = ("variant", "baseline")


@dataclass(frozen=True)
class Shape:
    """One problem size: time T, batch B, width D; matrix-state variants add heads H and
    the state's n x v per head."""

    T: int
    B: int
    D: int
    H: int | None = None
    n: int | None = None
    v: int | None = None

    def params(self) -> dict[str, int]:
        """The set fields, as a record's `params` carries them."""
        return {k: val for k, val in asdict(self).items() if val is not None}

    def __str__(self) -> str:
        return " ".join(f"{k}={val}" for k, val in self.params().items())


def shapes(*sizes: tuple[int, ...]) -> tuple[Shape, ...]:
    """Shapes from (T, B, D[, H, n, v]) tuples."""
    return tuple(Shape(*s) for s in sizes)


@dataclass(frozen=True)
class Tolerance:
    """Largest relative error ||fast - ref|| / ||ref|| (ref in fp64) that passes."""

    fwd: float
    bwd: float


@dataclass
class ParityCase:
    """One comparison of a fast implementation with its reference.

    `inputs` are leaf tensors in fp64 on the device; the harness casts them to the dtype
    under test for `fast` and keeps fp64 for `reference`. Every input with
    `requires_grad` gets its gradient compared. Both callables take the inputs as
    keyword arguments and return a tuple of tensors named by `outputs`.
    """

    inputs: dict[str, torch.Tensor]
    fast: Callable[..., tuple[torch.Tensor, ...]]
    reference: Callable[..., tuple[torch.Tensor, ...]]
    outputs: tuple[str, ...]
    impl: str = "cuda"  # what `fast` ran, e.g. "cuda:persistent", "cuda:steps"
    # an ill-conditioned problem (a state that amplifies rounding, a gradient that is one sum
    # which cancels): the reference also runs in fp32 on the inputs as `fast` gets them (rounded
    # to the dtype under test), and an error within CONDITIONED_FACTOR times that run's passes
    conditioned: bool = False


# How far a conditioned case's error may exceed the fp32 reference's own error against fp64,
# and the most its bound may exceed the plain tolerance (past it the fp32 reference itself has
# lost the solution, and the comparison says nothing). In bf16 the reference's own error is
# what rounding the inputs to bf16 costs: no kernel that takes bf16 inputs can do better.
CONDITIONED_FACTOR = 4.0
CONDITIONED_CAP = 100.0


def rel_error(fast: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """||fast - ref|| / ||ref|| in fp64 (on fast's device); inf for a missing or non-finite
    result."""
    if fast is None or ref is None:
        return math.inf if (fast is None) != (ref is None) else 0.0
    a, b = fast.detach().double(), ref.detach().to(fast.device).double()
    if not torch.isfinite(a).all():
        return math.inf
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff / denom if denom > 0 else diff


def run_case(case: ParityCase, dtype: torch.dtype, generator: torch.Generator) -> dict[str, float]:
    """Run one case: the reference in fp64, `fast` in `dtype` with every output allocation
    poisoned (NaN), the same random upstream gradient through both. Returns
    {"fwd:<output>" | "grad:<input>": relative error}; a conditioned case adds
    {"ref:fwd:<output>" | "ref:grad:<input>": the relative error of the reference run in fp32 on
    the inputs and upstream gradients as `fast` gets them (rounded to `dtype`)}."""
    ref_in = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in case.inputs.items()}
    fast_in = {k: v.detach().to(dtype).requires_grad_(v.requires_grad) for k, v in case.inputs.items()}
    ref_out = case.reference(**ref_in)
    with extension.poisoned():
        fast_out = case.fast(**fast_in)
    grads = [torch.randn(r.shape, dtype=torch.float64, device=r.device, generator=generator)
             for r in ref_out]
    torch.autograd.backward(ref_out, grads)
    with extension.poisoned():
        torch.autograd.backward(fast_out, [g.to(f.dtype) for g, f in zip(grads, fast_out)])
    errors = {f"fwd:{n}": rel_error(f, r) for n, f, r in zip(case.outputs, fast_out, ref_out)}
    for name, t in ref_in.items():
        if t.requires_grad:
            errors[f"grad:{name}"] = rel_error(fast_in[name].grad, t.grad)
    if case.conditioned:
        own_in = {k: v.detach().to(dtype).float().requires_grad_(v.requires_grad)
                  for k, v in case.inputs.items()}
        own_out = case.reference(**own_in)
        torch.autograd.backward(own_out, [g.to(f.dtype).float() for g, f in zip(grads, fast_out)])
        errors |= {f"ref:fwd:{n}": rel_error(o, r) for n, o, r in zip(case.outputs, own_out, ref_out)}
        errors |= {f"ref:grad:{name}": rel_error(own_in[name].grad, t.grad)
                   for name, t in ref_in.items() if t.requires_grad}
    return errors


def worst(errors: dict[str, float], prefix: str) -> float:
    """The largest of `run_case`'s errors whose key starts with `prefix` ("fwd:", "grad:",
    "ref:fwd:", "ref:grad:"); 0 if none."""
    return max((v for k, v in errors.items() if k.startswith(prefix)), default=0.0)


def passes(errors: dict[str, float], tol: Tolerance) -> bool:
    """Whether every error of `run_case` is within `tol` (fwd: outputs, grad: gradients) or,
    where the fp32 reference's own error is given (ref:...), within CONDITIONED_FACTOR times it
    and CONDITIONED_CAP times the tolerance."""
    def bound(key: str) -> float:
        plain = tol.fwd if key.startswith("fwd:") else tol.bwd
        return max(plain, min(CONDITIONED_FACTOR * errors.get("ref:" + key, 0.0), CONDITIONED_CAP * plain))

    return all(err <= bound(key) for key, err in errors.items() if not key.startswith("ref:"))


def tolerance_text(metrics: dict, values: bool = True) -> str:
    """A parity record's bound as tables show it: "fwd / bwd", and for a conditioned case (its
    metrics carry reference_fwd / reference_bwd) the conditioned bound, with that run's worst
    errors where `values`."""
    text = f"{metrics['tol_fwd']:.0e} / {metrics['tol_bwd']:.0e}"
    if "reference_fwd" in metrics:
        text += f", or {CONDITIONED_FACTOR:g}x the error of the fp32 reference on the same inputs"
        if values:
            text += f" ({metrics['reference_fwd']:.1e} / {metrics['reference_bwd']:.1e}) up to {CONDITIONED_CAP:g}x"
    return text


@dataclass(frozen=True)
class Entry:
    """A registered variant (kind "variant") or baseline (kind "baseline")."""

    name: str
    kind: str
    title: str
    layer: Callable[..., torch.nn.Module]
    chapter: str | None
    family: str | None = None  # kernel family of a variant (FAMILIES); None for baselines
    # the definition: plain sequential PyTorch over the cell's inputs (variants)
    reference: Callable[..., tuple[torch.Tensor, ...]] | None = None
    # dense: the op's epilogue the cell runs (the family's cell benchmark feeds it);
    # diagonal: the scan's step name (lib/csrc/diagonal/steps.cuh)
    epilogue: str | None = None
    aliases: tuple[str, ...] = ()
    # layer_params(dim, expansion) -> parameters of one layer, from the specification's
    # formula; tests check it against an instantiated layer.
    layer_params: Callable[[int, float], int] | None = None
    # parity(shape, dtype, device, generator, **opts) -> list of ParityCase
    parity: Callable[..., list[ParityCase]] | None = None
    test_shapes: tuple[Shape, ...] = ()
    tolerance: dict[str, Tolerance] = field(default_factory=dict)
    cuda_op: str | None = None  # name of the op in the compiled extension, if any
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    notes: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "variant" and self.family not in FAMILIES:
            raise ValueError(f"{self.name}: a variant names its kernel family, one of {FAMILIES}")
