"""One validation layer for every family's op (and the baselines' fast paths), run before any
launch and, where possible, before the extension is even loaded.

Each check raises a clear error naming the tensor, what was expected and what it got:
`ValueError` for a shape, an empty dimension, a device, a size the kernels do not take or a
misaligned view; `TypeError` for a dtype. The bindings check again (common/check.h), as a
second line; a crash is never the answer to bad input.

Typical use (the dense op):

    T, B, D = validate.sequence("x", x, "[T, B, D]")            # rank, no empty dimension
    validate.shapes({"W_h": (w_h, (D, D)), "b": (b, (D,)), ...})  # None tensors are skipped
    validate.dtypes({"x": x, ...}, (torch.float32, torch.bfloat16))
    validate.devices({"x": x, ...})                              # all CUDA, one device

Contiguity is not an error: `contiguous(t)` returns `t` or a contiguous copy (the ops call it on
every input). `aligned(t)` likewise returns `t` or a copy whose data starts 16-byte aligned,
for the paths whose kernels copy 16 bytes at a time; `check_aligned` raises instead.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

Shape = Sequence[int | None]  # None: any size in that dimension


def _fmt(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def sequence(name: str, t: torch.Tensor, dims: str = "[T, B, D]") -> tuple[int, ...]:
    """`t` is a tensor of len(dims) dimensions, none of them empty; returns its shape."""
    rank = len(dims.strip("[]").split(","))
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {dims}, got {t.dim()} dimensions (shape {_fmt(t.shape)})")
    nonempty(name, t.shape, dims)
    return tuple(t.shape)


def nonempty(name: str, shape: Sequence[int], dims: str = "") -> None:
    """No dimension of `shape` is 0 (an empty batch, sequence or width)."""
    if any(s == 0 for s in shape):
        raise ValueError(f"{name} has an empty dimension: shape {_fmt(shape)}"
                         + (f" ({dims} must all be >= 1)" if dims else ""))


def shape(name: str, t: torch.Tensor | None, expected: Shape) -> None:
    """`t` (if given) has exactly the shape `expected`."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    ok = t.dim() == len(expected) and all(e is None or s == e for s, e in zip(t.shape, expected))
    if not ok:
        raise ValueError(f"{name} has shape {_fmt(t.shape)}; expected {_fmt(expected)}")


def shapes(specs: Mapping[str, tuple[torch.Tensor | None, Shape]]) -> None:
    """`shape` for every {name: (tensor or None, expected shape)}."""
    for name, (t, expected) in specs.items():
        shape(name, t, expected)


def dtypes(tensors: Mapping[str, torch.Tensor | None], allowed: Sequence[torch.dtype]) -> torch.dtype:
    """Every given tensor has one dtype, and it is allowed; returns it."""
    given = {n: t for n, t in tensors.items() if t is not None}
    first_name, first = next(iter(given.items()))
    if first.dtype not in allowed:
        names = ", ".join(str(a).replace("torch.", "") for a in allowed)
        raise TypeError(f"{first_name} has dtype {str(first.dtype).replace('torch.', '')}; "
                        f"the kernels take {names}")
    for n, t in given.items():
        if t.dtype != first.dtype:
            raise TypeError(f"{n} has dtype {str(t.dtype).replace('torch.', '')}; expected "
                            f"{str(first.dtype).replace('torch.', '')} like {first_name} "
                            "(all tensors of one call share a dtype)")
    return first.dtype


def devices(tensors: Mapping[str, torch.Tensor | None], cuda: bool = True) -> torch.device:
    """Every given tensor is on one device (a CUDA device when `cuda`); returns it."""
    given = {n: t for n, t in tensors.items() if t is not None}
    first_name, first = next(iter(given.items()))
    for n, t in given.items():
        if cuda and not t.is_cuda:
            raise ValueError(f"{n} must be a CUDA tensor (backend='cuda'), got one on {t.device}; "
                             "move it with .cuda() or use backend='reference'")
        if t.device != first.device:
            raise ValueError(f"{n} is on {t.device} but {first_name} is on {first.device} "
                             "(all tensors of one call share a device)")
    return first.device


def size_limit(name: str, count: int, limit: int = 2 ** 31) -> None:
    """A per-step element count the kernels index with 32-bit integers."""
    if count >= limit:
        raise ValueError(f"{name} = {count} is too large: the kernels take below {limit}")


def contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t`, or a contiguous copy of it (the documented copy: kernels read dense rows)."""
    return None if t is None else t.contiguous()


def is_aligned(t: torch.Tensor, alignment: int = 16) -> bool:
    return t.data_ptr() % alignment == 0


def aligned(t: torch.Tensor, alignment: int = 16) -> torch.Tensor:
    """`t`, or a copy whose data starts `alignment`-byte aligned (a contiguous view at an odd
    storage offset is not)."""
    return t if is_aligned(t, alignment) else t.clone()


def check_aligned(name: str, t: torch.Tensor, alignment: int = 16) -> None:
    if not is_aligned(t, alignment):
        raise ValueError(f"{name} must start at a {alignment}-byte aligned address (it is a view "
                         f"with storage offset {t.storage_offset()}); pass a copy (.clone())")
