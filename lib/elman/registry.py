"""The one list of every variant and baseline.

Tests, `elman parity`, `elman bench`, the LM wrapper, `elman dims` and the book all read
this registry; adding a variant means writing its module (which calls `register`), its
kernel and its chapter. Level names are case-insensitive (`E1`, `e1`, `1` all resolve).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

Shape = tuple[int, int, int]  # (T, B, D) for parity cases and kernel benchmarks


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
    aliases: tuple[str, ...] = ()
    # layer_params(dim, expansion) -> parameters of one layer, from the specification's
    # formula; tests check it against an instantiated layer.
    layer_params: Callable[[int, float], int] | None = None
    # parity(T, B, D, dtype, device, generator, **opts) -> list of ParityCase
    parity: Callable[..., list[ParityCase]] | None = None
    test_shapes: tuple[Shape, ...] = ()
    tolerance: dict[str, Tolerance] = field(default_factory=dict)
    cuda_op: str | None = None  # name of the op in the compiled extension, if any
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    notes: str = ""


_REGISTRY: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}
_MODULES = ("elman.variants", "elman.baselines")
_loaded = False


def register(entry: Entry) -> Entry:
    key = entry.name.lower()
    if key in _REGISTRY:
        raise ValueError(f"level {entry.name!r} is registered twice")
    _REGISTRY[key] = entry
    for alias in (entry.name, *entry.aliases):
        a = alias.lower()
        if _ALIASES.get(a, key) != key:
            raise ValueError(f"alias {alias!r} is taken by {_ALIASES[a]!r}")
        _ALIASES[a] = key
    return entry


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _MODULES:
            importlib.import_module(mod)


def get(level: str | int) -> Entry:
    """The entry for a level name or alias (`"E1"`, `"1"`, `1`, `"mamba2"`)."""
    _load()
    key = _ALIASES.get(str(level).lower())
    if key is None:
        known = ", ".join(e.name for e in entries())
        raise KeyError(f"unknown level {level!r}; registered levels: {known}")
    return _REGISTRY[key]


def entries(kind: str | None = None) -> list[Entry]:
    """All entries in registration order, optionally only one kind."""
    _load()
    return [e for e in _REGISTRY.values() if kind is None or e.kind == kind]


def variants() -> list[Entry]:
    return entries("variant")


def baselines() -> list[Entry]:
    return entries("baseline")
