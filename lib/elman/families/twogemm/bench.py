"""The two-GEMM family's cell benchmarks (bf16, random inputs, timed as core.timing times).

`cell_records` times the variant's cell, as its parity cases call it (the time-parallel input
projections inside, every gradient in the backward), on each path of the op: `cuda:graph`
(the per-step loop replayed from a CUDA graph), `cuda:steps` (launched from the stream) and
`torch:eager` (the reference, a sequential PyTorch loop, in bf16). `per_step_us` = forward / T.
Passed `beside` (E1's registry entry, which the harness or chapter looks up), it adds E1's
persistent cell at the same shape from the dense family's benchmark, so ratios come from one
run. E23's records carry its peak backward memory and the size a stored tape history
[T + 1, B, N, D] would take.
"""
from __future__ import annotations

import torch

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, rotation, timeit
from ..dense import bench as dense_bench
from . import op


def has_cell(entry: Entry) -> bool:
    """Whether the entry's cell runs the two-GEMM op (so the cell benchmark applies)."""
    return entry.family == "twogemm" and entry.parity is not None


def _shape(entry: Entry, B: int, D: int, T: int) -> Shape:
    n = entry.test_shapes[0].n
    return Shape(T, B, D, None, n)


def _sets(entry: Entry, shape: Shape, n: int):
    g = torch.Generator(device="cuda").manual_seed(1234)
    sets, cases = [], None
    for _ in range(n):
        cases = entry.parity(shape, torch.bfloat16, "cuda", g)
        leaves = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in cases[0].inputs.items()}
        sets.append(leaves)
    return cases, sets


def _fns(call, sets, grads):
    def fwd(i):
        with torch.no_grad():
            call(**sets[i])

    def fwdbwd(i):
        outs = call(**sets[i])
        torch.autograd.grad(outs, list(sets[i].values()), grads[:len(outs)])
    return fwd, fwdbwd


def _peak_mb(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(0)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def cell_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                 quick: bool = False, impls: tuple[str, ...] | None = None,
                 gate: dict[str, bool] | None = None, beside: Entry | None = None) -> list[dict]:
    """Time every implementation of the entry's cell at one shape (module docstring).
    `gate` ({impl: parity passed}) skips the CUDA paths that did not pass in this run."""
    shape = _shape(entry, B, D, T)
    n = 2 if quick else min(8, rotation(6 * T * B * D * 2))
    cases, sets = _sets(entry, shape, n)
    ref = sets[0]
    g = torch.Generator(device="cuda").manual_seed(99)
    out_shapes = [(T, B, D), (B, D)] + ([tuple(ref["tape0"].shape)] if "tape0" in ref else [])
    grads = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in out_shapes]
    fns = {c.impl: _fns(c.fast, sets, grads) for c in cases}
    fns["torch:eager"] = _fns(cases[0].reference, sets, grads)
    params = {"measure": "cell", **shape.params(), "dtype": "bfloat16"}
    out = []
    for impl, (fwd, fwdbwd) in fns.items():
        if impls and impl not in impls:
            continue
        if gate is not None and impl.startswith("cuda:") and not gate.get(impl, False):
            print(f"bench: skipping {entry.name} {impl} at B={B} D={D}: no passing parity in this run")
            continue
        r = max(3, reps // 6) if impl == "torch:eager" else reps
        tf, tfb = timeit(fwd, r, 2, n), timeit(fwdbwd, r, 2, n)
        metrics = {"fwd_ms": tf, "fwdbwd_ms": tfb, "per_step_us": 1000 * tf["median"] / T,
                   "per_step_fwdbwd_us": 1000 * tfb["median"] / T,
                   "peak_mem_mb": _peak_mb(fwdbwd)}
        if "tape0" in ref:
            metrics["tape_history_mb"] = (T + 1) * ref["tape0"].numel() * 2 / 2**20
        out.append(records.make("bench", entry.name, impl, params, metrics))
    if beside is not None:
        out += dense_bench.cell_records(beside, B, D, T, reps, quick, impls=("cuda:persistent",))
    del sets, fns
    torch.cuda.empty_cache()
    return out


def recurrent_layer_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False, gate: dict[str, bool] | None = None) -> list[dict]:
    """No library RNN computes these recurrences, so there is no layer-level library
    baseline to time beside them: the cell records already include the input projections
    and every gradient, and whole layers are timed by the harness."""
    return []


def last_impl() -> str:
    """What the op's last forward ran, for a layer record: "cuda:<path>"."""
    return "cuda:" + op.last_path.get("forward", "?")
