"""What the chapters show: tables and plots read from `runs/` records (never typed in).

Every function takes the records it reports on, so a chapter executed on a GPU shows the run
it just made (`records.run_dir()`) and one executed anywhere else shows its pinned runs
(`elman.results.pins.records_of`)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from ..core import records
from ..core.entry import tolerance_text

# Phases of a persistent forward step in the order of the kernel's trace marks
# (lib/csrc/dense/persistent.cuh); records store them by name, in sorted order.
TRACE_PHASES = ("wait for state", "multiply", "inputs + partials", "epilogue", "send")

IMPL_STYLE = {
    "cuda:persistent": ("persistent kernel (ours)", "C3", "o"),
    "cuda:steps+graph": ("cuBLAS per step, CUDA graph", "C0", "s"),
    "cuda:steps": ("cuBLAS per step, stream", "C9", "^"),
    "cudnn:fp16": ("cuDNN nn.RNN fp16", "C2", "D"),
    "cudnn:bf16": ("cuDNN nn.RNN bf16", "C1", "v"),
    "torch:eager": ("PyTorch eager loop", "C7", "x"),
}


def provenance(run: Path, env: dict) -> str:
    """How the run's code relates to its commit: from the source blobs its run.json records
    (checked against the commit with git where it is available), else the dirty flag."""
    f = Path(run) / "run.json"
    sources = json.loads(f.read_text()).get("sources") if f.exists() else None
    changed = records.source_changes(sources, str(env.get("commit"))) if sources else None
    if changed is None:
        return " (dirty)" if env.get("dirty") else ""
    if not changed:
        return " (sources as committed)"
    return f" ({len(changed)} source files differ from it: {', '.join(changed[:4])})"


def describe(run: Path | str | None) -> str:
    """One line on a run: its folder name (never a host path), GPU, driver, torch, CUDA,
    commit and how the code it ran relates to that commit. A folder that gathers records of
    several commits (the consolidated kernel versions) gives their number and dates."""
    if run is None:
        return "No GPU run with these records exists yet."
    run = Path(run)
    recs = records.read([run]) if run.is_dir() and records.file(run) else []
    commits = {str(r["env"].get("commit")) for r in recs}
    if len(commits) > 1:
        days = sorted(r["time"][:10] for r in recs)
        gpus = ", ".join(sorted({str(r["env"].get("gpu")) for r in recs}))
        return (f"Run `{run.name}`: {len(recs)} records of {len(commits)} commits and working trees, "
                f"{days[0]} to {days[-1]}, on {gpus}.")
    e = recs[0]["env"] if recs else {}
    return (f"Run `{run.name}`: {e.get('gpu')}, driver {e.get('driver')}, torch {e.get('torch')}, "
            f"CUDA {e.get('cuda')}, commit {e.get('commit')}{provenance(run, e)}.")


# ---- tables (markdown) -----------------------------------------------------------------
def parity_summary(recs: list[dict]) -> str:
    """One row per (variant, impl, dtype): shapes checked, worst errors, verdict."""
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault((r["variant"], r["impl"], r["params"]["dtype"]), []).append(r)
    lines = ["| variant | implementation | dtype | shapes | worst forward error | worst gradient error "
             "| tolerance (fwd / grad) | result |", "|---|---|---|---|---|---|---|---|"]
    for (v, impl, dt), rs in sorted(groups.items()):
        f = max(r["metrics"]["max_fwd"] for r in rs)
        b = max(r["metrics"]["max_bwd"] for r in rs)
        ok = all(r["metrics"]["passed"] for r in rs)
        m = next((r["metrics"] for r in rs if "reference_fwd" in r["metrics"]), rs[0]["metrics"])
        lines.append(f"| {v} | {impl} | {dt} | {len(rs)} | {f:.2e} | {b:.2e} | {tolerance_text(m, values=False)} "
                     f"| {'pass' if ok else 'FAIL'} |")
    return "\n".join(lines)


def cell_table(recs: list[dict]) -> str:
    """Per-step forward latency (us) and forward+backward (ms) of every implementation."""
    cells = [r for r in recs if r["params"].get("measure") == "cell"]
    shapes = sorted({(r["params"]["D"], r["params"]["B"]) for r in cells})
    impls = [i for i in IMPL_STYLE if any(r["impl"] == i for r in cells)]
    head = "| D | B | " + " | ".join(IMPL_STYLE[i][0] for i in impls) + " |"
    lines = [head, "|---|---|" + "---|" * len(impls)]  # cells: fwd us per step / fwd+bwd ms
    for D, B in shapes:
        row = []
        for i in impls:
            r = next((r for r in cells if r["impl"] == i and (r["params"]["D"], r["params"]["B"]) == (D, B)), None)
            row.append("—" if r is None else
                       f"{r['metrics']['per_step_us']:.2f} us / {r['metrics']['fwdbwd_ms']['median']:.2f} ms")
        lines.append(f"| {D} | {B} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def ratio_table(recs: list[dict], ours: str = "cuda:persistent",
                others: tuple[str, ...] = ("cuda:steps+graph", "cudnn:fp16", "cudnn:bf16")) -> str:
    """How many times faster `ours` is per forward step (and forward+backward) than others."""
    cells = {(r["impl"], r["params"]["D"], r["params"]["B"]): r["metrics"]
             for r in recs if r["params"].get("measure") == "cell"}
    shapes = sorted({(D, B) for (i, D, B) in cells if i == ours})
    lines = ["| D | B | " + " | ".join(f"vs {IMPL_STYLE[o][0]}" for o in others) + " |",
             "|---|---|" + "---|" * len(others)]
    for D, B in shapes:
        m = cells[(ours, D, B)]
        row = []
        for o in others:
            n = cells.get((o, D, B))
            row.append("—" if n is None else
                       f"{n['per_step_us'] / m['per_step_us']:.1f}x fwd, "
                       f"{n['fwdbwd_ms']['median'] / m['fwdbwd_ms']['median']:.1f}x fwd+bwd")
        lines.append(f"| {D} | {B} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def layer_table(recs: list[dict], variants: tuple[str, ...] | None = None) -> str:
    rows = [r for r in recs if r["params"].get("measure") == "layer"
            and (variants is None or r["variant"] in variants)]
    lines = ["| layer | implementation | dtype | D | B | forward (ms) | forward+backward (ms) | tokens/s "
             "| peak memory (MB) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["variant"], r["params"]["D"], r["params"]["B"], r["impl"])):
        p, m = r["params"], r["metrics"]
        lines.append(f"| {r['variant']} | {r['impl']} | {p['dtype']} | {p['D']} | {p['B']} | "
                     f"{m['fwd_ms']['median']:.3f} | {m['fwdbwd_ms']['median']:.3f} | "
                     f"{m['tokens_per_s']:,.0f} | {m['peak_mem_mb']:.0f} |")
    return "\n".join(lines)


PRIMITIVE_ORDER = ("launch_from_stream_us", "kernel_in_graph_us", "cublas_gemm_4x512x512_in_graph_us",
                   "grid_sync_cg_us", "grid_barrier_atomic_us", "l2_flag_one_way_us",
                   "cluster_barrier_2_us", "cluster_barrier_8_us", "cluster_barrier_16_us",
                   "dsmem_one_way_us")


def primitive_table(recs: list[dict]) -> str:
    rows = sorted((r for r in recs if r["params"].get("measure") == "primitive"),
                  key=lambda r: PRIMITIVE_ORDER.index(r["impl"]) if r["impl"] in PRIMITIVE_ORDER else 99)
    lines = ["| primitive | cost (us) |", "|---|---|"]
    lines += [f"| {r['impl'].removesuffix('_us').replace('_', ' ')} | {r['metrics']['us']:.3f} |" for r in rows]
    return "\n".join(lines)


CLOCK_LABELS = {"fma": "FMAs, no tensor work", "mma": "mma.sync back to back",
                "mma_bursts": "mma.sync bursts every 2 us"}


def clock_table(recs: list[dict]) -> str:
    """SM clock (GHz, median over the CTAs) by the kind of work, one column per SM count."""
    rows = [r for r in recs if r["params"].get("measure") == "clock"]
    if not rows:
        return "No SM-clock records in this run (`elman bench --primitives` writes them)."
    sms = sorted({r["params"]["sms"] for r in rows})
    lines = ["| work | " + " | ".join(f"{n} SMs" for n in sms) + " |",
             "|---|" + "---|" * len(sms)]
    for work, label in CLOCK_LABELS.items():
        by = {r["params"]["sms"]: r["metrics"]["ghz"] for r in rows if r["params"]["work"] == work}
        if by:
            lines.append(f"| {label} | " + " | ".join(f"{by[n]:.2f}" if n in by else "not measured"
                                                      for n in sms) + " |")
    return "\n".join(lines)


# ---- plots -----------------------------------------------------------------------------
def plot_cells(recs: list[dict], metric: str = "per_step_us", title: str = ""):
    """Per-step latency (or fwd+bwd time) against B, one panel per D, one line per impl."""
    cells = [r for r in recs if r["params"].get("measure") == "cell"]
    dims = sorted({r["params"]["D"] for r in cells})
    fig, axes = plt.subplots(1, max(1, len(dims)), figsize=(4.2 * max(1, len(dims)), 3.6),
                             sharey=True, squeeze=False)
    for ax, D in zip(axes[0], dims):
        for impl, (label, color, marker) in IMPL_STYLE.items():
            pts = sorted((r["params"]["B"], _metric(r, metric)) for r in cells
                         if r["impl"] == impl and r["params"]["D"] == D)
            if pts:
                ax.plot(*zip(*pts), marker=marker, color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch B")
        ax.set_title(f"D = {D}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel({"per_step_us": "forward per step (us)",
                           "fwdbwd_ms": "forward + backward, T = 512 (ms)"}.get(metric, metric))
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _metric(r: dict, metric: str) -> float:
    v = r["metrics"][metric]
    return v["median"] if isinstance(v, dict) else v


def plot_trace(recs: list[dict]):
    """Stacked phases of one persistent forward step, per (B, D)."""
    rows = sorted((r for r in recs if r["params"].get("measure") == "trace"),
                  key=lambda r: (r["params"]["D"], r["params"]["B"]))
    fig, ax = plt.subplots(figsize=(7, 3.4))
    if not rows:
        return fig
    labels = [f"B={r['params']['B']}\nD={r['params']['D']}" for r in rows]
    bottom = [0.0] * len(rows)
    for k, phase in enumerate(TRACE_PHASES):
        vals = [r["metrics"]["phase_ns"][phase] for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=phase, color=f"C{k}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ns per step (median, CTA 0)")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def speed_summary(recs: list[dict], ours: str = "cuda:persistent") -> str:
    """Bullet sentences with the measured per-step latency of `ours` and its ratios to the
    per-step cuBLAS graph and cuDNN fp16 at every recorded shape."""
    cells = {(r["impl"], r["params"]["D"], r["params"]["B"]): r["metrics"]
             for r in recs if r["params"].get("measure") == "cell"}
    out = []
    for (impl, D, B), m in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if impl != ours:
            continue
        parts = [f"- D = {D}, B = {B}: {m['per_step_us']:.2f} us per forward step, "
                 f"{m['fwdbwd_ms']['median']:.2f} ms forward + backward over T = 512"]
        for other in ("cuda:steps+graph", "cudnn:fp16"):
            n = cells.get((other, D, B))
            if n:
                parts.append(f"{n['per_step_us'] / m['per_step_us']:.1f}x faster per step than "
                             f"{IMPL_STYLE[other][0]}")
        out.append("; ".join(parts) + ".")
    return "\n".join(out) or "No persistent-kernel benchmark is recorded in this run."


TARGETS = (  # issue "Persistent recurrent kernels": (measure, shape, committed, moonshot)
    ("forward per step (us)", [(B, D) for D in (512, 1024) for B in (4, 16, 64)], 1.0, 0.5),
    ("forward per step (us)", [(64, 2048)], 2.5, 2.0),
    # "one layer" as cuDNN's RNN layer counts one (the comparison): input GEMM W_x x,
    # recurrence and every gradient; measure `recurrent_layer` of elman bench.
    ("recurrent layer forward+backward (ms)", [(64, 1024)], 3.0, 1.5),
    ("recurrent layer forward+backward (ms)", [(64, 2048)], 8.0, 5.0),
)


def target_table(recs: list[dict]) -> str:
    """The kernel targets against what this run measured (E1, bf16, T = 512)."""
    cell = {(r["params"]["B"], r["params"]["D"]): r for r in recs
            if r["params"].get("measure") == "cell" and r["impl"] == "cuda:persistent"}
    steps = {(r["params"]["B"], r["params"]["D"]): r for r in recs
             if r["params"].get("measure") == "cell" and r["impl"] == "cuda:steps+graph"}
    layer = {(r["params"]["B"], r["params"]["D"]): r for r in recs
             if r["params"].get("measure") == "recurrent_layer" and r["impl"].startswith("cuda:")}
    lines = ["| measure | B | D | committed | moonshot | measured | path | committed met | moonshot met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for measure, shapes, committed, moon in TARGETS:
        for B, D in shapes:
            if measure.startswith("forward"):
                r = cell.get((B, D)) or steps.get((B, D))
                value = r["metrics"]["per_step_us"] if r else None
            else:
                r = layer.get((B, D))
                value = r["metrics"]["fwdbwd_ms"]["median"] if r else None
            path = r["impl"] if r else "—"
            # three decimals: a value just over a limit must not print as the limit itself
            shown = "not measured" if value is None else f"{value:.3f}"
            met = lambda lim: "—" if value is None else ("yes" if value <= lim else "no")
            lines.append(f"| {measure} | {B} | {D} | <= {committed} | <= {moon} | {shown} | {path} "
                         f"| {met(committed)} | {met(moon)} |")
    return "\n".join(lines)


def lm_step_table(recs: list[dict]) -> str:
    """One row per training-step record (measure 'lm_step', elman.training.memory)."""
    rows = [r for r in recs if r["params"].get("measure") == "lm_step"]
    lines = ["| level | d | depth | e | parameters | B | T | step (ms) | tokens/s | peak memory (MB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, m = r["params"], r["metrics"]
        lines.append(f"| {r['variant']} | {p['dim']} | {p['depth']} | {p['expansion']} | {p['n_params']:,} "
                     f"| {p['B']} | {p['T']} | {m['step_ms']:.1f} | {m['tokens_per_s']:,.0f} "
                     f"| {m['peak_mem_mb']:,.0f} |")
    return "\n".join(lines)


def lm_memory_line(recs: list[dict], level: str, baseline: str, limit: float) -> str:
    """The level's peak training memory against the baseline's, and whether it is within limit x."""
    step = {r["variant"]: r for r in recs if r["params"].get("measure") == "lm_step"}
    if level not in step or baseline not in step:
        return f"- No training-step records of both {level} and {baseline}: the memory target cannot be stated."
    a, b = step[level], step[baseline]
    ratio = a["metrics"]["peak_mem_mb"] / b["metrics"]["peak_mem_mb"]
    return (f"- Peak training memory: {level} ({a['params']['n_params'] / 1e6:.0f}M parameters) "
            f"{a['metrics']['peak_mem_mb'] / 1024:.1f} GB, {baseline} ({b['params']['n_params'] / 1e6:.0f}M) "
            f"{b['metrics']['peak_mem_mb'] / 1024:.1f} GB: {ratio:.2f}x (target <= {limit}x: "
            f"{'met' if ratio <= limit else 'not met'}).")


WIDTH_IMPLS = ("cuda:persistent", "cuda:steps+graph")


def _width_points(recs: list[dict], variant: str, impl: str, B: int) -> list[tuple[int, float]]:
    return sorted((r["params"]["D"], r["metrics"]["per_step_us"]) for r in recs
                  if r["params"].get("measure") == "cell" and r["variant"] == variant
                  and r["impl"] == impl and r["params"]["B"] == B)


def plot_widths(recs: list[dict], variant: str = "E1"):
    """Forward per step against D, one line per (path, B): the persistent kernels and the
    per-step graph beside them. None without cell records of the variant."""
    Bs = sorted({r["params"]["B"] for r in recs if r["params"].get("measure") == "cell"
                 and r["variant"] == variant})
    if not Bs:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for impl, style in zip(WIDTH_IMPLS, ("-", ":")):
        for i, B in enumerate(Bs):
            pts = _width_points(recs, variant, impl, B)
            if pts:
                ax.plot(*zip(*pts), style, marker="o" if style == "-" else "s", color=f"C{i}",
                        label=f"{IMPL_STYLE[impl][0]}, B = {B}", markersize=4)
    ax.set_xlabel("width D")
    ax.set_ylabel("forward per step (us)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best", ncol=2)
    ax.set_title(f"{variant}: forward latency of one time step against width (bf16, T = 512)")
    fig.tight_layout()
    return fig


def width_table(recs: list[dict], variant: str = "E1", dims: tuple[int, ...] = (1280, 1536, 1792, 2048)) -> str:
    """Per-step forward (us) at the given widths: persistent and graph at each B."""
    Bs = sorted({r["params"]["B"] for r in recs if r["params"].get("measure") == "cell"
                 and r["variant"] == variant})
    head = "| D | " + " | ".join(f"persistent B={B} | graph B={B}" for B in Bs) + " |"
    lines = [head, "|---|" + "---|" * (2 * len(Bs))]
    for D in dims:
        cells = []
        for B in Bs:
            for impl in WIDTH_IMPLS:
                v = dict(_width_points(recs, variant, impl, B)).get(D)
                cells.append("" if v is None else f"{v:.2f}")
        lines.append(f"| {D} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def width_targets(recs: list[dict], variant: str = "E1", at: int = 1280, small_b_us: float = 1.5,
                  b64_us: float = 2.5) -> str:
    """The fast path at every width, stated from the records: no width's persistent step slower
    than at D = 2048 for the same B, and the step at D = `at` within its budget."""
    out = []
    for B in sorted({r["params"]["B"] for r in recs if r["params"].get("measure") == "cell"
                     and r["variant"] == variant}):
        pts = dict(_width_points(recs, variant, "cuda:persistent", B))
        if 2048 not in pts:
            out.append(f"- B = {B}: no persistent record at D = 2048; the comparison cannot be stated.")
            continue
        slower = [D for D, us in pts.items() if us > pts[2048]]
        out.append(f"- B = {B}: {len(pts)} widths on the persistent path; "
                   + (f"slower than D = 2048 ({pts[2048]:.2f} us): D = {', '.join(map(str, sorted(slower)))} (not met)."
                      if slower else f"none slower than D = 2048 ({pts[2048]:.2f} us) (met)."))
        if at in pts and (B <= 16 or B == 64):
            limit = small_b_us if B <= 16 else b64_us
            out.append(f"- D = {at}, B = {B}: {pts[at]:.2f} us per step (target <= {limit} us: "
                       f"{'met' if pts[at] <= limit else 'not met'}).")
    return "\n".join(out) or f"- No cell records of {variant}: the targets cannot be stated."
