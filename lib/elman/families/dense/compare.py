"""What the dense variants' chapters compute from records: a variant's cell beside E1's at
the same shape (the issue's "within 10 % of E1" question), beside the per-step cuBLAS loop
in a CUDA graph, whole-layer times of several variants side by side, and the gradient flow
of a reference through time (a CPU measurement, made when the chapter runs).

Every function takes the records it reports on (a run's or the pinned ones) and returns
markdown, a figure or plain numbers; nothing is typed in.
"""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import torch

from ...core.entry import Shape
from . import inputs

PERSISTENT, GRAPH = "cuda:persistent", "cuda:steps+graph"
WITHIN = 0.10  # the issue's bound: a variant's persistent step within 10 % of E1's


def _median(m: dict, key: str) -> float:
    v = m[key]
    return v["median"] if isinstance(v, dict) else v


def cells(recs: list[dict], variant: str, impl: str) -> dict[tuple[int, int], dict]:
    """{(D, B): metrics} of the variant's cell records of one implementation."""
    return {(r["params"]["D"], r["params"]["B"]): r["metrics"] for r in recs
            if r["params"].get("measure") == "cell" and r["variant"] == variant and r["impl"] == impl}


def versus(recs: list[dict], variant: str, base: str = "E1") -> list[dict]:
    """One row per shape where the variant's persistent (or, where the size has none, graph)
    cell is recorded: its per-step forward and forward+backward, the same of `base`, and of
    its own per-step cuBLAS loop in a CUDA graph, with the ratios."""
    rows = []
    for impl in (PERSISTENT, GRAPH):
        ours, theirs, graph = cells(recs, variant, impl), cells(recs, base, impl), cells(recs, variant, GRAPH)
        for (D, B), m in sorted(ours.items()):
            if impl == GRAPH and (D, B) in cells(recs, variant, PERSISTENT):
                continue
            row = {"D": D, "B": B, "impl": impl, "step_us": m["per_step_us"],
                   "fwdbwd_ms": _median(m, "fwdbwd_ms")}
            if (D, B) in theirs:
                row["base_step_us"] = theirs[(D, B)]["per_step_us"]
                row["base_fwdbwd_ms"] = _median(theirs[(D, B)], "fwdbwd_ms")
            if impl == PERSISTENT and (D, B) in graph:
                row["graph_step_us"] = graph[(D, B)]["per_step_us"]
            rows.append(row)
    return rows


def versus_table(recs: list[dict], variant: str, base: str = "E1") -> str:
    """`versus` as a markdown table."""
    rows = versus(recs, variant, base)
    if not rows:
        return f"No cell benchmark of {variant} is recorded in these runs."
    f = lambda v, spec: "—" if v is None else format(v, spec)
    lines = [f"| D | B | path | {variant} per step (us) | {base} per step (us) | {variant} / {base} "
             f"| {variant} fwd+bwd (ms) | {base} fwd+bwd (ms) | cuBLAS graph per step (us) "
             "| cuBLAS graph / ours |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base_us, graph_us = r.get("base_step_us"), r.get("graph_step_us")
        lines.append(
            f"| {r['D']} | {r['B']} | {r['impl'].removeprefix('cuda:')} | {r['step_us']:.2f} | "
            f"{f(base_us, '.2f')} | {f(base_us and r['step_us'] / base_us, '.2f')} | "
            f"{r['fwdbwd_ms']:.2f} | {f(r.get('base_fwdbwd_ms'), '.2f')} | {f(graph_us, '.2f')} | "
            f"{f(graph_us and graph_us / r['step_us'], '.1f')} |")
    return "\n".join(lines)


def plot_versus(recs: list[dict], variant: str, base: str = "E1", metric: str = "per_step_us",
                title: str = ""):
    """The variant's persistent kernel, E1's, and the variant's cuBLAS-in-a-graph loop against
    B, one panel per D. None when nothing is recorded."""
    series = [(variant, PERSISTENT, f"{variant} persistent", "C3", "o"),
              (base, PERSISTENT, f"{base} persistent", "C7", "x"),
              (variant, GRAPH, f"{variant} cuBLAS per step, CUDA graph", "C0", "s")]
    return plot_series(recs, series, metric, title)


def plot_series(recs: list[dict], series: list[tuple], metric: str = "per_step_us", title: str = ""):
    """Cell records against B, one panel per recorded D, one line per (variant, impl, label,
    color, marker) of `series`. None when nothing is recorded."""
    dims = sorted({D for v, i, *_ in series for (D, _) in cells(recs, v, i)})
    if not dims:
        return None
    ylabel = {"per_step_us": "forward per step (us)",
              "fwdbwd_ms": "forward + backward, T = 512 (ms)"}.get(metric, metric)
    fig, axes = plt.subplots(1, len(dims), figsize=(4.2 * len(dims), 3.6), sharey=True, squeeze=False)
    for k, (ax, D) in enumerate(zip(axes[0], dims)):
        for v, impl, label, color, marker in series:
            pts = sorted((B, _median(m, metric)) for (d, B), m in cells(recs, v, impl).items() if d == D)
            if pts:
                ax.plot(*zip(*pts), marker=marker, color=color, label=label)
        ax.set(xscale="log", yscale="log", xlabel="batch B", title=f"D = {D}",
               ylabel=ylabel if k == 0 else None)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def speed_findings(recs: list[dict], variant: str, base: str = "E1") -> str:
    """Sentences on the variant's persistent step against E1's (within 10 %?) and against the
    per-step cuBLAS graph, from the records."""
    rows = [r for r in versus(recs, variant, base) if r["impl"] == PERSISTENT]
    if not rows:
        return (f"- The GPU results of {variant} are not yet recorded (no pinned run for this "
                "chapter): the speed questions stay open until the GPU pass records them.")
    out = []
    paired = [r for r in rows if "base_step_us" in r]
    if paired:
        ratios = [r["step_us"] / r["base_step_us"] for r in paired]
        worst = max(paired, key=lambda r: r["step_us"] / r["base_step_us"])
        slow = [r for r in paired if r["step_us"] > (1 + WITHIN) * r["base_step_us"]]
        out.append(f"- Per forward step, {variant}'s persistent kernel costs {min(ratios):.2f}x to "
                   f"{max(ratios):.2f}x of {base}'s at the same shape (median "
                   f"{statistics.median(ratios):.2f}x over {len(paired)} shapes; the largest at "
                   f"D = {worst['D']}, B = {worst['B']}).")
        out.append(f"- Within {WITHIN:.0%} of {base} at every recorded shape." if not slow else
                   f"- More than {WITHIN:.0%} slower than {base} at " +
                   ", ".join(f"(B, D) = ({r['B']}, {r['D']})" for r in slow) + ".")
    graphed = [r["graph_step_us"] / r["step_us"] for r in rows if "graph_step_us" in r]
    if graphed:
        out.append(f"- Against its own per-step cuBLAS loop in a CUDA graph the persistent kernel is "
                   f"{min(graphed):.1f}x to {max(graphed):.1f}x faster per step.")
    return "\n".join(out)


def layer_rows(recs: list[dict], variants: tuple[str, ...]) -> dict[tuple[int, int], dict[str, float]]:
    """{(D, B): {variant: layer forward+backward ms}} of the layer records of `variants`."""
    out: dict[tuple[int, int], dict[str, float]] = {}
    for r in recs:
        if r["params"].get("measure") == "layer" and r["variant"] in variants:
            out.setdefault((r["params"]["D"], r["params"]["B"]), {})[r["variant"]] = \
                _median(r["metrics"], "fwdbwd_ms")
    return out


def fastest_layer(recs: list[dict], variants: tuple[str, ...]) -> str:
    """Which of `variants` has the fastest layer forward+backward at each recorded shape."""
    rows = layer_rows(recs, variants)
    if not rows:
        return "- No layer benchmark of " + ", ".join(variants) + " is recorded in these runs yet."
    out = []
    for (D, B), times in sorted(rows.items()):
        best = min(times, key=times.get)
        others = ", ".join(f"{v} {t / times[best]:.2f}x" for v, t in sorted(times.items()) if v != best)
        out.append(f"- D = {D}, B = {B}: fastest layer forward + backward is {best} "
                   f"({times[best]:.2f} ms)" + (f"; {others}" if others else "") + ".")
    return "\n".join(out)


def gradient_flow(references: dict, lags: tuple[int, ...] = (8, 32, 128), D: int = 32,
                  seed: int = 0) -> dict[str, dict[int, float]]:
    """{name: {lag: ||d h_lag / d h_0||_2}}: the spectral norm of the Jacobian of the state
    after `lag` steps with respect to the initial state, for each reference on the same fresh
    inputs of the dense family (B = 1, W_h of spectral norm 0.99, fp64, CPU). How much of a
    gradient survives `lag` steps back."""
    out: dict[str, dict[int, float]] = {}
    for name, ref in references.items():
        out[name] = {}
        for lag in lags:
            kw = inputs.reference_inputs(ref, Shape(lag, 1, D), "cpu", torch.Generator().manual_seed(seed))
            kw = {k: v.detach() for k, v in kw.items()}
            h0 = kw.pop("h0")
            jac = torch.autograd.functional.jacobian(lambda h: ref(**kw, h0=h)[1], h0)
            out[name][lag] = torch.linalg.matrix_norm(jac.reshape(D, D), ord=2).item()
    return out


def gradient_flow_table(flow: dict[str, dict[int, float]]) -> str:
    lags = sorted({lag for v in flow.values() for lag in v})
    lines = ["| cell | " + " | ".join(f"lag {lag}" for lag in lags) + " |",
             "|---|" + "---|" * len(lags)]
    for name, v in flow.items():
        lines.append(f"| {name} | " + " | ".join(f"{v[lag]:.2e}" for lag in lags) + " |")
    return "\n".join(lines)


def closing_table(recs: list[dict], variants: tuple[str, ...],
                  shapes: tuple[tuple[int, int], ...] = ((4, 1024), (64, 1024)), base: str = "E1") -> str:
    """The issue's closing table, from one run's records: per variant the CUDA paths its parity
    covered, the worst relative error (forward or gradient) in fp32 and in bf16, and at each
    (B, D) of `shapes` the persistent per-step forward with its ratio to `base` and to its own
    cuBLAS-per-step loop in a CUDA graph."""
    head = ["variant", "paths", "worst fp32", "worst bf16"]
    for B, D in shapes:
        head += [f"step (us) B={B} D={D}", f"/ {base}", "cuBLAS graph / ours"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        par = [r for r in recs if r["kind"] == "parity" and r["variant"] == v]
        worst = {dt: max((max(r["metrics"]["max_fwd"], r["metrics"]["max_bwd"]) for r in par
                          if r["params"]["dtype"] == dt), default=None) for dt in ("float32", "bfloat16")}
        paths = ", ".join(sorted({r["impl"].removeprefix("cuda:") for r in par})) or "—"
        row = [v, paths, *("—" if worst[dt] is None else f"{worst[dt]:.1e}" for dt in worst)]
        by_shape = {(r["B"], r["D"]): r for r in versus(recs, v, base) if r["impl"] == PERSISTENT}
        for B, D in shapes:
            r = by_shape.get((B, D))
            if r is None:
                row += ["—"] * 3
                continue
            base_us, graph_us = r.get("base_step_us"), r.get("graph_step_us")
            row += [f"{r['step_us']:.2f}", "—" if not base_us else f"{r['step_us'] / base_us:.2f}",
                    "—" if not graph_us else f"{graph_us / r['step_us']:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
