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

import importlib
from typing import Iterable

import torch
from tqdm import tqdm

from .. import registry
from ..core import records
from ..core.entry import (DTYPES, Shape, passes, rel_error, run_case,  # noqa: F401 (rel_error re-exported)
                          tolerance_text, worst)


def check_entry(entry: registry.Entry, dtypes: Iterable[str], shapes=None, seed: int = 0,
                device: str = "cuda") -> list[dict]:
    """Parity records for one entry over its test shapes (or `shapes`: Shapes or (T, B, D,
    ...) tuples) and `dtypes`."""
    out = []
    generator = torch.Generator(device=device).manual_seed(seed)
    for dt in dtypes:
        tol = entry.tolerance[dt]
        for shape in shapes or entry.test_shapes:
            shape = shape if isinstance(shape, Shape) else Shape(*shape)
            for case in entry.parity(shape, DTYPES[dt], device, generator):
                errors = run_case(case, DTYPES[dt], generator)
                metrics = {"errors": errors, "max_fwd": worst(errors, "fwd:"), "max_bwd": worst(errors, "grad:"),
                           "tol_fwd": tol.fwd, "tol_bwd": tol.bwd, "passed": passes(errors, tol)}
                if any(k.startswith("ref:") for k in errors):  # conditioned: the fp32 run's worst
                    metrics |= {"reference_fwd": worst(errors, "ref:fwd:"),
                                "reference_bwd": worst(errors, "ref:grad:")}
                out.append(records.make("parity", entry.name, case.impl,
                                        {**shape.params(), "dtype": dt, "seed": seed}, metrics))
    return out


def table(recs: list[dict]) -> str:
    """A markdown table of parity records, one column per shape field the records carry."""
    dims = [k for k in Shape.__dataclass_fields__ if any(k in r["params"] for r in recs)]
    lines = ["| variant | impl | dtype | " + " | ".join(dims) + " | max fwd err | max grad err "
             "| tolerance | result |", "|---" * (len(dims) + 7) + "|"]
    for r in recs:
        p, m = r["params"], r["metrics"]
        shape = " | ".join(str(p.get(k, "")) for k in dims)
        lines.append(f"| {r['variant']} | {r['impl']} | {p['dtype']} | {shape} "
                     f"| {m['max_fwd']:.2e} | {m['max_bwd']:.2e} | {tolerance_text(m)} "
                     f"| {'pass' if m['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def reference_checks(level: str, T: int = 4, B: int = 2, D: int = 5) -> str:
    """CPU checks of an entry's reference, as a markdown table: an fp64 gradcheck of every
    input, and the whole sequence against T single steps that carry the state (h0 in, the
    second output out). The inputs come from the entry's kernel family
    (`elman.families.<family>.inputs.reference_inputs`; `time_major` says which inputs
    have one slice per step; a family whose references carry more state than h0 gives its
    own `sequence_check`)."""
    entry = registry.get(level)
    if entry.reference is None or entry.family is None:
        raise ValueError(f"{entry.name} has no reference of a kernel family to check")
    family = importlib.import_module(f"{__package__.rsplit('.', 1)[0]}.families.{entry.family}.inputs")
    ref = entry.reference
    kw = family.reference_inputs(ref, Shape(T, B, D), "cpu", torch.Generator().manual_seed(0))
    names = list(kw)
    grad_ok = torch.autograd.gradcheck(lambda *a: ref(**dict(zip(names, a))), tuple(kw.values()),
                                       eps=1e-6, atol=1e-6)
    if hasattr(family, "sequence_check"):  # a family whose references carry more than h0
        seq_err = family.sequence_check(ref, T, B, D)
    else:
        plain = {k: v.detach() for k, v in kw.items()}
        full, h_full = ref(**plain)[:2]
        h, outs = plain["h0"], []
        for t in range(T):
            step = {k: (v[t:t + 1] if family.time_major(k, v) else v) for k, v in plain.items()}
            out, h = ref(**{**step, "h0": h})[:2]
            outs.append(out)
        seq_err = max((torch.cat(outs) - full).abs().max().item(), (h - h_full).abs().max().item())
    return ("| check | result |\n|---|---|\n"
            f"| fp64 gradcheck, every input (T={T}, B={B}, D={D}) | {'pass' if grad_ok else 'FAIL'} |\n"
            f"| sequence vs. {T} single steps, max abs difference | {seq_err:.1e} |")


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
