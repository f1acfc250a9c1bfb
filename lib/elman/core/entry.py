"""What a registry entry says about a variant or baseline: its layer, reference, parity
builder, shapes, tolerances and kernel family. `elman.registry` collects the entries."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

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


@dataclass(frozen=True)
class Entry:
    """A registered variant (kind "variant") or baseline (kind "baseline")."""

    name: str
    kind: str
    title: str
    layer: Callable[..., torch.nn.Module]
    chapter: str | None
    family: str | None = None  # kernel family of a variant (FAMILIES); None for baselines
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
