"""Bad input is a clear error, for every registered op and layer: the cases, and one case's
run in this process.

From the registry, for every entry (variants and baselines alike), at a small shape:
- op cases, on the fast implementations of the entry's parity builder (its `ParityCase`s):
  on the first, each input on the CPU, in a wrong dtype, with a wrong shape (its last
  dimension one larger), non-contiguous, misaligned (a view at storage offset 1); on every
  one, an empty batch and an empty sequence (B = 0, T = 0) and, for entries with a compiled
  op, the extension missing;
- layer cases: B = 0 and T = 0 through the layer, a wrong input width, a zero width at
  construction; for the variants' layers a wrong-shaped parameter (each of the cell's
  own: recurrent weight, biases, ...) and, for layers with several paths, a size or dtype
  that the persistent path does not take.

The rule: every case raises a Python exception whose message names the problem
(`KINDS[kind]` is the pattern), and the CUDA context works afterwards. An empty dimension
raises ValueError, everywhere. A non-contiguous, misaligned or other-dtype input may
instead run, if its outputs equal those of the valid input within the entry's tolerance.

    python -m elman.harness.badinput --list E1          # the case ids of an entry
    python -m elman.harness.badinput E1 'op/0/cpu:x'    # one case; prints a RESULT line
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from .. import registry
from ..core import extension
from ..core.entry import DTYPES, Entry, Shape, rel_error
from ..core.layer import RecurrentLayer

# kind -> (exception types that count, the pattern the message must match, may it run)
KINDS: dict[str, tuple[tuple[type, ...], str, bool]] = {
    "cpu": ((ValueError, RuntimeError), r"(?i)cuda|device|cpu", False),
    "dtype": ((ValueError, RuntimeError, TypeError), r"(?i)dtype|type|float|half|double", True),
    "shape": ((ValueError, RuntimeError), r"(?i)shape|must be|size|dimension|\[", False),
    "noncontiguous": ((ValueError, RuntimeError), r"(?i)contiguous|stride", True),
    "misaligned": ((ValueError, RuntimeError), r"(?i)align", True),
    "empty": ((ValueError,), r"(?i)empty|>= ?1|at least 1", False),
    "unsupported": ((ValueError, RuntimeError), r"(?i)does not take|not support|unsupported", False),
    "extension": ((extension.ExtensionUnavailable,), r"(?i)extension|cuda", False),
    "width": ((ValueError,), r"(?i)width|dim|at least|positive|multiple", False),
    "parameter": ((ValueError, RuntimeError), r"(?i)shape|must be|size", False),
}
SMALL = Shape(3, 2, 256)  # the dense family's persistent, graph and steps paths all take it


@dataclass
class Case:
    id: str
    kind: str
    run: Callable[[], tuple | None]      # the bad call: raises, or returns its outputs
    valid: Callable[[], tuple]           # the same call on valid input
    tolerance: float = 0.0


def dtype_of(entry: Entry) -> str:
    return "bfloat16" if "bfloat16" in entry.dtypes else entry.dtypes[0]


def small_shape(entry: Entry) -> Shape:
    """A small size the entry's fast paths take, with T and B unlike any other size of its
    inputs (so that the empty cases can find their axes): SMALL for a dense variant, else
    T = 5, B = 3 at the width of its smallest parity shape."""
    return SMALL if entry.family == "dense" else Shape(5, 3, entry.test_shapes[0].D)


def _emptied(inputs: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
    """The inputs with every axis of length `size` cut to length 0."""
    out = {}
    for k, t in inputs.items():
        for axis, n in enumerate(t.shape):
            if n == size:
                t = t.narrow(axis, 0, 0)
        out[k] = t.detach().clone().requires_grad_(t.requires_grad)
    return out


def _noncontiguous(t: torch.Tensor) -> torch.Tensor | None:
    buf = t.new_empty(*t.shape[:-1], 2 * t.shape[-1]) if t.dim() else None
    if buf is None:
        return None
    v = buf[..., ::2]
    v.copy_(t)
    return None if v.is_contiguous() else v


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    v = t.new_empty(t.numel() + 1)[1:].view(t.shape)
    v.copy_(t)
    return v


def _wrong_shape(t: torch.Tensor) -> torch.Tensor:
    shape = list(t.shape) or [1]
    shape[-1] += 1
    return torch.randn(shape, dtype=t.dtype, device=t.device)


MUTATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "cpu": lambda t: t.cpu(),
    "dtype": lambda t: t.to(torch.float64),
    "shape": _wrong_shape,
    "noncontiguous": _noncontiguous,
    "misaligned": _misaligned,
}


def _call(case, inputs: dict[str, torch.Tensor]) -> tuple:
    """The fast path forward and backward (the backward reads the inputs again)."""
    outs = case.fast(**inputs)
    grads = [o for o in outs if o.requires_grad]
    if grads:
        torch.autograd.backward(grads, [torch.ones_like(o) for o in grads])
    return tuple(o.detach() for o in outs)


def _leaves(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(dtype).requires_grad_(v.requires_grad) for k, v in inputs.items()}


def op_cases(entry: Entry, device: str = "cuda") -> list[Case]:
    """The op cases of one entry (builds its parity cases, so needs its device)."""
    dt = DTYPES[dtype_of(entry)]
    shape = small_shape(entry)
    out: list[Case] = []

    tol = entry.tolerance[dtype_of(entry)].fwd
    built = entry.parity(shape, dt, device, torch.Generator(device=device).manual_seed(0))
    for i, case in enumerate(built):
        def valid(case=case):
            return _call(case, _leaves(case.inputs, dt))
        # Inputs are validated before a path is chosen: each input's mutations on the first
        # implementation; the empty dimensions and the missing extension on every one.
        for kind, mutate in (MUTATIONS.items() if i == 0 else ()):
            for name in case.inputs:
                def run(case=case, name=name, mutate=mutate):
                    inputs = _leaves(case.inputs, dt)
                    t = inputs[name]
                    bad = mutate(t.detach())
                    inputs[name] = bad.detach().requires_grad_(t.requires_grad)
                    return _call(case, inputs)
                if kind == "noncontiguous" and _noncontiguous(case.inputs[name].detach()) is None:
                    continue
                out.append(Case(f"op/{i}/{kind}:{name}", kind, run, valid, tol))
        if entry.cuda_op:
            out.append(Case(f"op/{i}/extension", "extension", lambda case=case: _without_extension(
                lambda: _call(case, _leaves(case.inputs, dt))), valid))
        for dim in ("B", "T"):
            def empty(case=case, dim=dim):
                return _call(case, _emptied(_leaves(case.inputs, dt), getattr(shape, dim)))
            out.append(Case(f"op/{i}/empty:{dim}", "empty", empty, valid))
    return out


def _without_extension(fn: Callable[[], tuple]) -> tuple:
    """Run fn as if the compiled extension were missing (load() raises), then restore it."""
    saved = extension.load

    def missing(*args, **kwargs):
        raise extension.ExtensionUnavailable("the elman CUDA extension is unavailable (simulated)")
    extension.load = missing
    os.environ["ELMAN_NO_EXTENSION"] = "1"
    try:
        return fn()
    finally:
        extension.load = saved
        os.environ.pop("ELMAN_NO_EXTENSION", None)


def layer_cases(entry: Entry, device: str = "cuda") -> list[Case]:
    """The layer cases of one entry (on `device`; with "cpu" the layer runs backend
    "reference")."""
    backend = "cuda" if device == "cuda" else "reference"
    dim = small_shape(entry).D

    def make(d: int = dim, **options):
        torch.manual_seed(0)
        return entry.layer(d, backend=backend, **options).to(device)

    def forward(layer, y):
        out = layer(y)[0]
        out.float().sum().backward()
        return (out.detach(),)

    def y(B: int = 2, T: int = 3, d: int = dim, dtype=torch.float32):
        return torch.randn(B, T, d, device=device, dtype=dtype)

    def valid():
        return forward(make(), y())

    cases = [Case("layer/empty:B", "empty", lambda: forward(make(), y(B=0)), valid),
             Case("layer/empty:T", "empty", lambda: forward(make(), y(T=0)), valid),
             Case("layer/shape:y", "shape", lambda: forward(make(), y(d=dim + 1)), valid),
             Case("layer/width:0", "width", lambda: make(0), valid)]
    if isinstance(entry.layer, type) and issubclass(entry.layer, RecurrentLayer):
        base = {n for n, _ in make().named_parameters()}
        for name in sorted(base - {"w_in", "w_out"} - {n for n in base if n.startswith("conv.")}):
            cases.append(Case(f"layer/parameter:{name}", "parameter",
                              lambda name=name: forward(_replaced(make(), name), y()), valid))
        if "persistent" in entry.layer.paths and device == "cuda":
            cases.append(Case("layer/unsupported:size", "unsupported",
                              lambda: forward(make(100, path="persistent"), y(d=100)), valid))
            cases.append(Case("layer/unsupported:dtype", "unsupported",
                              lambda: forward(make(path="persistent"), y()), valid))
    return cases


def _replaced(layer: torch.nn.Module, name: str) -> torch.nn.Module:
    """`layer` with parameter `name` replaced by one whose last dimension is one larger."""
    owner, _, leaf = name.rpartition(".")
    module = layer.get_submodule(owner) if owner else layer
    setattr(module, leaf, torch.nn.Parameter(_wrong_shape(getattr(module, leaf).detach())))
    return layer


def cases(entry: Entry, device: str = "cuda") -> list[Case]:
    return (op_cases(entry, device) if entry.parity is not None and device == "cuda" else []) \
        + layer_cases(entry, device)


def run(case: Case) -> dict:
    """Run one case here: what it raised (or that it ran, and whether its outputs equal the
    valid call's), then whether a valid call still runs."""
    result: dict = {"id": case.id, "kind": case.kind}
    try:
        outs = case.run()
        if device_is_cuda():
            torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001  (the case is about what is raised)
        result.update(raised=type(exc).__name__, types=[c.__name__ for c in type(exc).__mro__],
                      message=str(exc).strip()[:2000])
    else:
        result["ran"] = True
        if outs is not None:
            good = case.valid()
            result["error"] = max((rel_error(a.to(b.device), b) for a, b in zip(outs, good)), default=0.0)
    try:
        case.valid()
        if device_is_cuda():
            torch.cuda.synchronize()
        result["alive"] = True
    except BaseException as exc:  # noqa: BLE001
        result.update(alive=False, after=f"{type(exc).__name__}: {str(exc)[:500]}")
    return result


def device_is_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def verdict(result: dict) -> str | None:
    """None if the result keeps the rule, else what is wrong."""
    types, pattern, may_run = KINDS[result["kind"]]
    if not result.get("alive"):
        return f"a valid call failed afterwards: {result.get('after')}"
    if "raised" in result:
        if not any(t.__name__ in result["types"] for t in types):
            return f"raised {result['raised']}, expected one of {[t.__name__ for t in types]}: {result['message']}"
        if not re.search(pattern, result["message"]):
            return f"the message does not name the problem ({pattern}): {result['message']}"
        return None
    if not may_run:
        return "ran without an error"
    if result.get("error", 0.0) > result.get("tolerance", 0.0):
        return f"ran, but its outputs differ from the valid call's (relative error {result['error']:.2e})"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m elman.harness.badinput", description=__doc__.splitlines()[0])
    p.add_argument("level")
    p.add_argument("case", nargs="?", help="a case id (default: list the ids)")
    p.add_argument("--list", action="store_true", help="print the entry's case ids")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    entry = registry.get(args.level)
    todo = cases(entry, args.device)
    if args.list or args.case is None:
        print("\n".join(c.id for c in todo))
        return 0
    by_id = {c.id: c for c in todo}
    if args.case not in by_id:
        print(f"unknown case {args.case!r} of {entry.name}", file=sys.stderr)
        return 2
    case = by_id[args.case]
    try:
        result = {**run(case), "tolerance": case.tolerance}
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        return 3
    result["verdict"] = verdict(result)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
