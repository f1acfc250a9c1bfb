"""The two-GEMM family's cell benchmarks (bf16, random inputs, timed as core.timing times).

`cell_records` times the variant's cell, as its parity cases call it (the time-parallel input
projections inside, every gradient in the backward), on each path of the op:
`cuda:persistent` (one launch for the whole sequence, where the kernel takes the size),
`cuda:steps+graph` (the per-step loop replayed from a CUDA graph: the op's path "graph"),
`cuda:steps` (launched from the stream) and
`torch:eager` (the reference, a sequential PyTorch loop, in bf16). `per_step_us` = forward / T.
E23's records carry its peak backward memory and the size a stored tape history
[T + 1, B, N, D] would take.

A chapter's run is `chapter_plan` (which variant, shape and path) and `chapter_records` (runs
it shape by shape into the run folder, resuming, with E1's persistent cell from the dense
family's benchmark at every shape, so ratios come from one run). The fast paths (persistent, graph: 1-40 us a
step on an H100) are timed at every shape of the chapter's grid; the slow ones (steps: 45-200
us a step, the PyTorch loop: 90-500 us, a few seconds each at T = 512) and whole layers at the
issue's shape B = 4, D = 512 only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, rotation, timeit
from ..dense import bench as dense_bench
from . import op

BENCH_IMPL = {"cuda:graph": "cuda:steps+graph"}  # bench records name the graph path as dense's do

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
                 gate: dict[str, bool] | None = None) -> list[dict]:
    """Time every implementation of the entry's cell at one shape (module docstring).
    `gate` ({impl: parity passed}) skips the CUDA paths that did not pass in this run."""
    shape = _shape(entry, B, D, T)
    n = 2 if quick else min(8, rotation(6 * T * B * D * 2))
    cases, sets = _sets(entry, shape, n)
    ref = sets[0]
    g = torch.Generator(device="cuda").manual_seed(99)
    out_shapes = [(T, B, D), (B, D)] + ([tuple(ref["tape0"].shape)] if "tape0" in ref else [])
    grads = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in out_shapes]
    fns = {c.impl: _fns(c.fast, sets, grads) for c in cases}  # by the parity record's impl
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
        out.append(records.make("bench", entry.name, BENCH_IMPL.get(impl, impl), params, metrics))
    del sets, fns
    torch.cuda.empty_cache()
    return out


# ---- a chapter's run ---------------------------------------------------------------------
FAST = ("cuda:persistent", "cuda:graph")  # parity impl names (cell records: BENCH_IMPL)
SLOW = ("cuda:steps", "torch:eager")
AT = (4, 512)  # (B, D) of the targets


@dataclass(frozen=True)
class Planned:
    """One variant at one shape: its cell on `impls` (those it has there), its whole layer if
    `layer`."""
    variant: str
    B: int
    D: int
    impls: tuple[str, ...]
    layer: bool


def chapter_plan(variants: list[str], batches: list[int], dims: list[int],
                 grid: list[str] | None = None, at: tuple[int, int] = AT,
                 quick: bool = False) -> list[Planned]:
    """What a chapter's run times, in order: at `at` (B, D), every variant's fast paths and
    whole layer and the `grid` variants' slow paths; then the `grid` variants' fast paths at
    every other (B, D) of batches x dims, D by D. `grid` defaults to every variant; `quick`
    keeps `at` only."""
    grid = list(variants) if grid is None else list(grid)
    plan = [Planned(v, *at, FAST + (SLOW if v in grid else ()), True) for v in variants]
    if quick:
        return plan
    return plan + [Planned(v, B, D, FAST, False) for D in dims for B in batches
                   if (B, D) != tuple(at) for v in grid]


def impls_at(entry: Entry, B: int, D: int) -> list[str]:
    """The implementations `cell_records` has for the entry at (B, D), by their parity names,
    from the op's plan (no inputs are made): the fastest first."""
    paths = entry.parity.paths(_shape(entry, B, D, 1), torch.bfloat16)
    return ["cuda:" + p for p in paths] + ["torch:eager"]


def _key(r: dict) -> tuple:
    p = r["params"]
    return (r["variant"], p["measure"], p.get("T"), p.get("B"), p.get("D"),
            r["impl"] if p["measure"] == "cell" else None)


def chapter_records(plan: list[Planned], entries: list[Entry], beside: Entry,
                    layer_record: Callable[..., dict], parity_of: Callable[[Entry, str], dict],
                    T: int = T_DEFAULT, quick: bool = False) -> list[dict]:
    """Run a `chapter_plan` of these `entries` into the current run folder shape by shape, with
    `beside`'s persistent cell (its family's benchmark) at every shape. The harness gives
    `layer_record(entry, B, D, T, quick=)` (a whole layer) and `parity_of(entry, dtype)`
    ({impl: passed} in this run), which gates the variants' CUDA paths. Each shape's records
    are written when the shape is done, and what the run already holds is not measured again:
    a chapter stopped by a time limit keeps every finished shape, and a rerun into the same
    folder resumes. Returns the new records."""
    run = records.run_dir()
    done = {_key(r) for r in records.read([run], kind="bench")}
    by_name = {e.name: e for e in entries}
    gates: dict[str, dict] = {}
    new: list[dict] = []
    for B, D in dict.fromkeys((p.B, p.D) for p in plan):
        recs: list[dict] = []
        for p in (p for p in plan if (p.B, p.D) == (B, D)):
            e = by_name[p.variant]
            todo = tuple(i for i in p.impls if i in impls_at(e, B, D)
                         and (e.name, "cell", T, B, D, BENCH_IMPL.get(i, i)) not in done)
            if todo:
                if e.name not in gates:
                    gates[e.name] = parity_of(e, "bfloat16")
                recs += cell_records(e, B, D, T, quick=quick, impls=todo, gate=gates[e.name])
            if p.layer and (e.name, "layer", T, B, D, None) not in done:
                recs.append(layer_record(e, B, D, T, quick=quick))
        if (beside.name, "cell", T, B, D, "cuda:persistent") not in done:
            recs += dense_bench.cell_records(beside, B, D, T, quick=quick, impls=("cuda:persistent",))
        if recs:
            records.write(recs, run)
        done.update(_key(r) for r in recs)
        new += recs
    return new


def recurrent_layer_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False, gate: dict[str, bool] | None = None) -> list[dict]:
    """No library RNN computes these recurrences, so there is no layer-level library
    baseline to time beside them: the cell records already include the input projections
    and every gradient, and whole layers are timed by the harness."""
    return []


def last_impl() -> str:
    """What the op's last forward ran, for a layer record: "cuda:<path>"."""
    return "cuda:" + op.last_path.get("forward", "?")


# ---- tables of a chapter (from records) ----------------------------------------------------
def _cells(recs: list[dict], variant: str) -> list[dict]:
    return [r for r in recs if r["params"].get("measure") == "cell" and r["variant"] == variant]


def comparison_table(recs: list[dict], variant: str, beside: str = "E1") -> str:
    """Per shape and implementation: forward per step, forward + backward, their ratio, and
    the per-step ratio to `beside`'s persistent cell at the same (B, D) in these records;
    E23 adds peak memory of forward + backward and the size of a stored tape history."""
    ref = {(r["params"]["B"], r["params"]["D"]): r["metrics"] for r in _cells(recs, beside)
           if r["impl"] == "cuda:persistent"}
    tape = any("tape_history_mb" in r["metrics"] for r in _cells(recs, variant))
    lines = ["| D | B | implementation | forward per step (us) | forward + backward (ms) "
             f"| fwd+bwd / fwd | per step vs {beside} persistent |"
             + (" peak memory (MB) | tape history (MB) |" if tape else ""),
             "|---" * (7 + 2 * tape) + "|"]
    for r in sorted(_cells(recs, variant), key=lambda r: (r["params"]["D"], r["params"]["B"], r["impl"])):
        p, m = r["params"], r["metrics"]
        e1 = ref.get((p["B"], p["D"]))
        vs = "—" if e1 is None else f"{m['per_step_us'] / e1['per_step_us']:.2f}x"
        row = (f"| {p['D']} | {p['B']} | {r['impl']} | {m['per_step_us']:.2f} | "
               f"{m['fwdbwd_ms']['median']:.2f} | {m['fwdbwd_ms']['median'] / m['fwd_ms']['median']:.2f} | {vs} |")
        if tape:
            row += f" {m['peak_mem_mb']:.1f} | {m['tape_history_mb']:.1f} |"
        lines.append(row)
    return "\n".join(lines)


def target_lines(recs: list[dict], variant: str, B: int, D: int, beside: str = "E1",
                 per_step_us: float | None = None, vs_beside: float | None = None,
                 bwd_over_fwd: float | None = None) -> str:
    """The issue's targets at one shape, met or not, from the fastest CUDA path recorded."""
    mine = [r for r in _cells(recs, variant) if r["impl"].startswith("cuda:")
            and (r["params"]["B"], r["params"]["D"]) == (B, D)]
    if not mine:
        return f"No {variant} cell benchmark at B = {B}, D = {D} is recorded."
    best = min(mine, key=lambda r: r["metrics"]["per_step_us"])
    m = best["metrics"]
    fwd, fb = m["per_step_us"], m["fwdbwd_ms"]["median"] / m["fwd_ms"]["median"]
    out = [f"- {variant} at B = {B}, D = {D} ({best['impl']}): {fwd:.2f} us per forward step; "
           f"forward + backward is {fb:.2f}x the forward."]
    if per_step_us is not None:
        out.append(f"- Target forward per step <= {per_step_us} us: {'met' if fwd <= per_step_us else 'not met'}.")
    e1 = [r for r in _cells(recs, beside) if r["impl"] == "cuda:persistent"
          and (r["params"]["B"], r["params"]["D"]) == (B, D)]
    if vs_beside is not None:
        if e1:
            ratio = fwd / e1[0]["metrics"]["per_step_us"]
            out.append(f"- Target within {vs_beside}x of {beside}'s persistent step "
                       f"({e1[0]['metrics']['per_step_us']:.2f} us): {ratio:.2f}x, "
                       f"{'met' if ratio <= vs_beside else 'not met'}.")
        else:
            out.append(f"- {beside}'s persistent cell at this shape is not in these records.")
    if bwd_over_fwd is not None:
        bwd = fb - 1
        out.append(f"- Target backward <= {bwd_over_fwd}x forward: backward is {bwd:.2f}x, "
                   f"{'met' if bwd <= bwd_over_fwd else 'not met'}.")
    return "\n".join(out)
