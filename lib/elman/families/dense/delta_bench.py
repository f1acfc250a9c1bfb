"""Cell benchmarks of the nonlinear-delta op (E63; bf16, random inputs, timed as core.timing
times), in the records and measure ("cell") of the dense family's cell benchmark so that
`compare.cells` reads both.

`cell_records`: the recurrence alone on precomputed input pre-activations (the stacked
[W_x; W_alpha; (W_beta)] x + biases), forward and forward + its own backward of the raw op.
Implementations: `cuda:steps` (one cuBLAS GEMM and one fused kernel per step, from the
stream), `cuda:steps+graph` (the same captured in a CUDA graph: the op's `graph` path) and
`torch:eager` (the same schedule as a sequential PyTorch loop, `delta.emulate_forward`).
`versus_table`: each E63 mode's graph step beside E1's graph and persistent steps.
"""
from __future__ import annotations

import torch

from ...core.entry import Entry
from ...core.timing import T_DEFAULT, rotation
from . import delta
from .bench import _graphed, cell_record
from .compare import GRAPH, PERSISTENT, cells, plot_series


def _inputs(mode: str, T: int, B: int, D: int, n: int, dtype=torch.bfloat16) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(1234)
    G, R = delta.CHANNELS[mode], delta.RECURRENT[mode]
    sets = []
    for _ in range(n):
        w = torch.randn(R * D, D, device="cuda", generator=g)
        sets.append({
            "pre": torch.randn(T, B, G * D, device="cuda", generator=g).to(dtype),
            "w_rec": (w * (0.9 / torch.linalg.matrix_norm(w[:D], ord=2))).to(dtype),
            "h0": (torch.rand(B, D, device="cuda", generator=g) - 0.5).to(dtype),
            "d_out": torch.randn(T, B, D, device="cuda", generator=g).to(dtype),
            "d_hT": torch.randn(B, D, device="cuda", generator=g).to(dtype),
        })
    return sets


def _op_fns(mode: str, sets: list[dict]):
    T, B, GD = sets[0]["pre"].shape
    like = sets[0]["pre"]
    D = GD // delta.CHANNELS[mode]
    out, h_all, act = like.new_empty(T, B, D), like.new_empty(T + 1, B, D), torch.empty_like(like)
    d_pre, dh0 = torch.empty_like(like), like.new_empty(B, D)

    def fwd(i):
        s = sets[i]
        delta.forward_into("steps", mode, s["pre"], s["w_rec"], s["h0"], out, h_all, act)

    def fwdbwd(i):
        fwd(i)
        s = sets[i]
        delta.backward_into("steps", mode, s["w_rec"], h_all, act, s["d_out"], s["d_hT"], d_pre, dh0)
    return fwd, fwdbwd


def _eager_fns(mode: str, sets: list[dict]):
    def fwd(i):
        s = sets[i]
        with torch.no_grad():
            delta.emulate_forward(mode, s["pre"], s["w_rec"], s["h0"])

    def fwdbwd(i):
        s = sets[i]
        leaves = [s[k].detach().requires_grad_() for k in ("pre", "w_rec", "h0")]
        out, h_all, _ = delta.emulate_forward(mode, *leaves)
        torch.autograd.grad((out, h_all[-1]), leaves, (s["d_out"], s["d_hT"]))
    return fwd, fwdbwd


def cell_records(entry: Entry, mode: str, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                 quick: bool = False, impls: tuple[str, ...] | None = None,
                 gate: dict[str, bool] | None = None) -> list[dict]:
    """Time each implementation of the entry's recurrence (nonlinear-delta `mode`) at one
    shape. `gate` ({impl: parity passed}) skips the CUDA paths that did not pass in this run
    (`cuda:steps+graph` runs the op's `graph` path)."""
    delta.check_mode(mode)
    G = delta.CHANNELS[mode]
    per_set = (2 * G + 3) * T * B * D * 2
    n = 2 if quick else rotation(per_set)
    sets = _inputs(mode, T, B, D, n)
    fns: dict[str, tuple] = {"cuda:steps": _op_fns(mode, sets)}
    f, fb = _op_fns(mode, sets)
    fns[GRAPH] = (_graphed(f, n), _graphed(fb, n))
    fns["torch:eager"] = _eager_fns(mode, sets)
    parity_of = {"cuda:steps": "cuda:steps", GRAPH: "cuda:graph"}
    out = []
    for impl, (fwd, fwdbwd) in fns.items():
        if impls and impl not in impls:
            continue
        if gate is not None and impl in parity_of and not gate.get(parity_of[impl], False):
            print(f"bench: skipping {entry.name} {impl} at B={B} D={D}: no passing parity in this run")
            continue
        out.append(cell_record(entry, impl, fwd, fwdbwd, B, D, T,
                               max(5, reps // 4) if impl == "torch:eager" else reps, n))
    del sets, fns
    torch.cuda.empty_cache()
    return out


def versus(recs: list[dict], variants: tuple[str, ...], base: str = "E1") -> list[dict]:
    """One row per shape with a graph cell of any of `variants`: each one's per-step forward
    and forward+backward, and `base`'s graph and persistent per-step forward."""
    ours = {v: cells(recs, v, GRAPH) for v in variants}
    base_graph, base_persistent = cells(recs, base, GRAPH), cells(recs, base, PERSISTENT)
    rows = []
    for D, B in sorted({k for c in ours.values() for k in c}):
        row = {"D": D, "B": B, "base_graph_us": base_graph.get((D, B), {}).get("per_step_us"),
               "base_persistent_us": base_persistent.get((D, B), {}).get("per_step_us")}
        for v in variants:
            m = ours[v].get((D, B))
            row[v] = None if m is None else m["per_step_us"]
        rows.append(row)
    return rows


def versus_table(recs: list[dict], variants: tuple[str, ...], base: str = "E1") -> str:
    """`versus` as a markdown table: per-step forward (us) of each variant on the graph path,
    its ratio to `base`'s graph step (the same method: what the wider GEMM and the gates
    cost) and `base`'s persistent step."""
    rows = versus(recs, variants, base)
    if not rows:
        return "No cell benchmark of " + ", ".join(variants) + " is recorded in these runs."
    f = lambda v, spec: "—" if v is None else format(v, spec)
    head = ["D", "B", *(f"{v} graph (us)" for v in variants), *(f"{v} / {base} graph" for v in variants),
            f"{base} graph (us)", f"{base} persistent (us)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        g = r["base_graph_us"]
        cols = [str(r["D"]), str(r["B"]), *(f(r[v], ".2f") for v in variants),
                *(f(r[v] / g if r[v] is not None and g else None, ".2f") for v in variants),
                f(g, ".2f"), f(r["base_persistent_us"], ".2f")]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def speed_findings(recs: list[dict], variants: tuple[str, ...], base: str = "E1") -> str:
    """Sentences on each variant's graph step against `base`'s graph and persistent steps."""
    rows = versus(recs, variants, base)
    out = []
    for v in variants:
        for key, what in (("base_graph_us", f"{base}'s per-step loop in a CUDA graph"),
                          ("base_persistent_us", f"{base}'s persistent kernel")):
            ratios = [r[v] / r[key] for r in rows if r[v] is not None and r[key]]
            if ratios:
                out.append(f"- {v} (graph path) costs {min(ratios):.2f}x to {max(ratios):.2f}x "
                           f"of {what} per forward step (median {sorted(ratios)[len(ratios) // 2]:.2f}x "
                           f"over {len(ratios)} shapes).")
    if not out:
        return ("- The GPU results of " + ", ".join(variants) + " are not yet recorded (no pinned "
                "run for this chapter): the speed questions stay open until the GPU pass records them.")
    return "\n".join(out)


def plot_versus(recs: list[dict], variants: tuple[str, ...], base: str = "E1",
                metric: str = "per_step_us", title: str = ""):
    """Each variant's graph path and `base`'s graph and persistent paths against B, one panel
    per D. None when nothing is recorded."""
    series = [(v, GRAPH, f"{v} cuBLAS per step, CUDA graph", f"C{k}", "o") for k, v in enumerate(variants)]
    series += [(base, GRAPH, f"{base} cuBLAS per step, CUDA graph", "C7", "s"),
               (base, PERSISTENT, f"{base} persistent", "k", "x")]
    return plot_series(recs, series, metric, title)
