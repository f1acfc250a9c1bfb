"""`elman parity`: every fast implementation against its reference, forward and backward.

For each registered entry with a `parity` builder, each of its test shapes and dtypes,
and each implementation that takes the size (for the dense family: the persistent
kernel and the per-step path), the harness draws fresh random inputs (never zeros),
runs the reference in fp64 and the implementation in the dtype under test with every
output allocation poisoned (NaN) so that unwritten elements show, backpropagates the same
random upstream gradient through both, and reports the relative error
||fast - ref|| / ||ref|| of every output, the final state and the gradient of every
input, parameter and the initial state. Pass/fail uses the registry's tolerances.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
from tqdm import tqdm

from .. import registry
from ..core import extension as ops, records

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def rel_error(fast: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """||fast - ref|| / ||ref|| in fp64; inf for a missing or non-finite result."""
    if fast is None or ref is None:
        return math.inf if (fast is None) != (ref is None) else 0.0
    a, b = fast.detach().double(), ref.detach().double()
    if not torch.isfinite(a).all():
        return math.inf
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff / denom if denom > 0 else diff


def run_case(case: registry.ParityCase, dtype: torch.dtype, generator: torch.Generator) -> dict:
    """Run one case; returns {name: relative error} for outputs and input gradients."""
    ref_in = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in case.inputs.items()}
    fast_in = {k: v.detach().to(dtype).requires_grad_(v.requires_grad) for k, v in case.inputs.items()}
    ref_out = case.reference(**ref_in)
    with ops.poisoned():
        fast_out = case.fast(**fast_in)
    grads = [torch.randn(r.shape, dtype=torch.float64, device=r.device, generator=generator)
             for r in ref_out]
    torch.autograd.backward(ref_out, grads)
    with ops.poisoned():
        torch.autograd.backward(fast_out, [g.to(f.dtype) for g, f in zip(grads, fast_out)])
    errors = {f"fwd:{n}": rel_error(f, r) for n, f, r in zip(case.outputs, fast_out, ref_out)}
    for name, t in ref_in.items():
        if t.requires_grad:
            errors[f"grad:{name}"] = rel_error(fast_in[name].grad, t.grad)
    return errors


def check_entry(entry: registry.Entry, dtypes: Iterable[str], shapes=None, seed: int = 0,
                device: str = "cuda") -> list[dict]:
    """Parity records for one entry over its test shapes (or `shapes`) and `dtypes`."""
    out = []
    generator = torch.Generator(device=device).manual_seed(seed)
    for dt in dtypes:
        tol = entry.tolerance[dt]
        for shape in shapes or entry.test_shapes:
            for case in entry.parity(shape, DTYPES[dt], device, generator):
                errors = run_case(case, DTYPES[dt], generator)
                fwd = max(v for k, v in errors.items() if k.startswith("fwd:"))
                bwd = max((v for k, v in errors.items() if k.startswith("grad:")), default=0.0)
                passed = fwd <= tol.fwd and bwd <= tol.bwd
                out.append(records.make(
                    "parity", entry.name, case.impl,
                    {**shape.params(), "dtype": dt, "seed": seed},
                    {"errors": errors, "max_fwd": fwd, "max_bwd": bwd, "tol_fwd": tol.fwd,
                     "tol_bwd": tol.bwd, "passed": passed}))
    return out


def table(recs: list[dict]) -> str:
    """A markdown table of parity records."""
    lines = ["| variant | impl | dtype | T | B | D | max fwd err | max grad err | tolerance | result |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        p, m = r["params"], r["metrics"]
        lines.append(f"| {r['variant']} | {r['impl']} | {p['dtype']} | {p['T']} | {p['B']} | {p['D']} "
                     f"| {m['max_fwd']:.2e} | {m['max_bwd']:.2e} | {m['tol_fwd']:.0e} / {m['tol_bwd']:.0e} "
                     f"| {'pass' if m['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("--levels", nargs="*", help="levels to check (default: every entry with a parity builder)")
    p.add_argument("--dtypes", nargs="*", help="dtypes (default: each entry's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true", help="do not write records to runs/")


def main(args) -> int:
    if not torch.cuda.is_available():
        print("elman parity: no CUDA device; the CUDA kernels cannot be checked here "
              "(the CPU tests check the references).")
        return 2
    entries = [registry.get(l) for l in args.levels] if args.levels else \
        [e for e in registry.entries() if e.parity is not None]
    recs = []
    for e in tqdm(entries, desc="parity"):
        recs += check_entry(e, args.dtypes or e.dtypes, seed=args.seed)
    print(table(recs))
    if not args.no_record:
        print(f"records: {records.write(recs)}")
    failed = [r for r in recs if not r["metrics"]["passed"]]
    print(f"{len(recs) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0
