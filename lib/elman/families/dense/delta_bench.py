"""Cell benchmarks of the nonlinear-delta op (E63; bf16, random inputs, timed as core.timing
times), in the records and measure ("cell") of the dense family's cell benchmark so that
`compare.cells` reads both.

`cell_records`: the recurrence alone on precomputed input pre-activations (the stacked
[W_x; W_alpha; (W_beta)] x + biases), forward and forward + its own backward of the raw op.
Implementations: `cuda:persistent` (modes a, b, d where the dense family's persistent kernels
take the size: the whole sequence in one launch with W_h on chip), `cuda:steps` (one cuBLAS
GEMM and one fused kernel per step, from the stream), `cuda:steps+graph` (the same captured in
a CUDA graph: the op's `graph` path) and `torch:eager` (the same schedule as a sequential
PyTorch loop, `delta.emulate_forward`). `versus_table`: each E63 mode's persistent and graph
steps beside E1's graph and persistent steps.
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


def _persistent_fns(mode: str, sets: list[dict]):
    T, B, GD = sets[0]["pre"].shape
    G = delta.CHANNELS[mode]
    D = GD // G
    like = sets[0]["pre"]
    planes = [s["pre"].view(T, B, G, D).permute(2, 0, 1, 3).contiguous() for s in sets]
    out, h_all, v_all = like.new_empty(T, B, D), like.new_empty(T + 1, B, D), like.new_empty(T, B, D)
    dv, dh0 = like.new_empty(T, B, D), like.new_empty(B, D)
    d_gates = [like.new_empty(T, B, D) for _ in range(G - 1)]

    def fwd(i):
        s = sets[i]
        delta.persistent_forward_into(mode, planes[i], s["w_rec"], s["h0"], out, h_all, v_all)

    def fwdbwd(i):
        fwd(i)
        s = sets[i]
        delta.persistent_backward_into(mode, s["w_rec"], h_all, v_all, planes[i], s["d_out"], s["d_hT"],
                                       dv, d_gates, dh0)
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
    fns: dict[str, tuple] = {}
    if delta.persistent_supported(mode, B, D, torch.bfloat16)[0]:
        fns[PERSISTENT] = _persistent_fns(mode, sets)
    fns["cuda:steps"] = _op_fns(mode, sets)
    f, fb = _op_fns(mode, sets)
    fns[GRAPH] = (_graphed(f, n), _graphed(fb, n))
    fns["torch:eager"] = _eager_fns(mode, sets)
    parity_of = {PERSISTENT: "cuda:persistent", "cuda:steps": "cuda:steps", GRAPH: "cuda:graph"}
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
    """One row per shape with a cell of any of `variants`: each one's per-step forward on the
    graph path (key v) and on the persistent path (key v + ":persistent"), and `base`'s graph
    and persistent per-step forward."""
    ours = {v: cells(recs, v, GRAPH) for v in variants}
    mine = {v: cells(recs, v, PERSISTENT) for v in variants}
    base_graph, base_persistent = cells(recs, base, GRAPH), cells(recs, base, PERSISTENT)
    rows = []
    for D, B in sorted({k for c in (*ours.values(), *mine.values()) for k in c}):
        row = {"D": D, "B": B, "base_graph_us": base_graph.get((D, B), {}).get("per_step_us"),
               "base_persistent_us": base_persistent.get((D, B), {}).get("per_step_us")}
        for v in variants:
            row[v] = ours[v].get((D, B), {}).get("per_step_us")
            row[v + ":persistent"] = mine[v].get((D, B), {}).get("per_step_us")
        rows.append(row)
    return rows


def versus_table(recs: list[dict], variants: tuple[str, ...], base: str = "E1") -> str:
    """`versus` as a markdown table: per-step forward (us) of each variant on the persistent
    path (where it runs) and its ratio to `base`'s persistent step (what the epilogue costs),
    then on the graph path and its ratio to `base`'s graph step, and `base`'s two steps."""
    rows = versus(recs, variants, base)
    if not rows:
        return "No cell benchmark of " + ", ".join(variants) + " is recorded in these runs."
    f = lambda v, spec: "—" if v is None else format(v, spec)
    ratio = lambda a, b: a / b if a is not None and b else None
    head = ["D", "B", *(f"{v} persistent (us)" for v in variants),
            *(f"{v} / {base} persistent" for v in variants), *(f"{v} graph (us)" for v in variants),
            *(f"{v} / {base} graph" for v in variants), f"{base} persistent (us)", f"{base} graph (us)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        p, g = r["base_persistent_us"], r["base_graph_us"]
        cols = [str(r["D"]), str(r["B"]), *(f(r[v + ":persistent"], ".2f") for v in variants),
                *(f(ratio(r[v + ":persistent"], p), ".2f") for v in variants),
                *(f(r[v], ".2f") for v in variants), *(f(ratio(r[v], g), ".2f") for v in variants),
                f(p, ".2f"), f(g, ".2f")]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def speed_findings(recs: list[dict], variants: tuple[str, ...], base: str = "E1") -> str:
    """Sentences on each variant's persistent step against `base`'s (the family's goal: within
    10 %) and its graph step against `base`'s graph and persistent steps."""
    rows = versus(recs, variants, base)
    out = []
    for v in variants:
        for ours, key, what in ((v + ":persistent", "base_persistent_us", f"{base}'s persistent kernel"),
                                (v, "base_graph_us", f"{base}'s per-step loop in a CUDA graph"),
                                (v, "base_persistent_us", f"{base}'s persistent kernel")):
            ratios = sorted(r[ours] / r[key] for r in rows if r[ours] is not None and r[key])
            if ratios:
                path = "persistent path" if ours.endswith(":persistent") else "graph path"
                out.append(f"- {v} ({path}) costs {ratios[0]:.2f}x to {ratios[-1]:.2f}x "
                           f"of {what} per forward step (median {ratios[len(ratios) // 2]:.2f}x "
                           f"over {len(ratios)} shapes).")
    if not out:
        return ("- The GPU results of " + ", ".join(variants) + " are not yet recorded (no pinned "
                "run for this chapter): the speed questions stay open until the GPU pass records them.")
    return "\n".join(out)


def plot_versus(recs: list[dict], variants: tuple[str, ...], base: str = "E1",
                metric: str = "per_step_us", title: str = ""):
    """Each variant's persistent and graph paths and `base`'s graph and persistent paths
    against B, one panel per D. None when nothing is recorded."""
    series = [(v, PERSISTENT, f"{v} persistent", f"C{k}", "D") for k, v in enumerate(variants)]
    series += [(v, GRAPH, f"{v} cuBLAS per step, CUDA graph", f"C{k}", "o") for k, v in enumerate(variants)]
    series += [(base, GRAPH, f"{base} cuBLAS per step, CUDA graph", "C7", "s"),
               (base, PERSISTENT, f"{base} persistent", "k", "x")]
    return plot_series(recs, series, metric, title)
