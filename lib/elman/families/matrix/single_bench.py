"""Benchmarks of the single-state matrix variants (E70-E74, E73cp, E14) for their chapters: the
recurrence core alone (bf16 q, k, v; forward, forward + backward, peak memory of forward +
backward) and the whole layer at (dim, expansion) under bf16 autocast (forward, forward +
backward, peak training memory). Records of kind 'bench' with measure 'single_recurrence' or
'single_layer'; `table` and `plot` read them back."""
from __future__ import annotations

import torch

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, layer_timings, timeit, warm_up

SHAPE_100M = dict(dim=1408, expansion=2.0, n=96)  # the seed study's 100M shape for E70-E73


def _peak(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def recurrence_record(entry: Entry, B: int, n: int, T: int = T_DEFAULT, reps: int = 30,
                      quick: bool = False) -> dict:
    """The entry's core case (its parity builder's first case) at (T, B, H = 1, n) in bf16."""
    g = torch.Generator(device="cuda").manual_seed(5)
    sets = []
    for _ in range(2):
        case = entry.parity(Shape(T, B, 0, 1, n, n), torch.bfloat16, "cuda", g)[0]
        sets.append({k: t.detach().to(torch.bfloat16).requires_grad_(t.requires_grad)
                     for k, t in case.inputs.items()})
    fast = case.fast
    grads = [torch.randn_like(o.float()).to(o.dtype) for o in fast(**sets[0])]

    def fwd(i):
        with torch.no_grad():
            fast(**sets[i])

    def fwdbwd(i):
        outs = fast(**sets[i])
        torch.autograd.backward(outs, [gr.to(o.dtype) for gr, o in zip(grads, outs)])

    warm_up()
    reps = 3 if quick else reps
    tf, tfb = timeit(fwd, reps, 2, 2), timeit(fwdbwd, reps, 2, 2)
    peak = _peak(lambda: fwdbwd(0))
    return records.make("bench", entry.name, case.impl,
                        {"measure": "single_recurrence", "T": T, "B": B, "H": 1, "n": n, "v": n,
                         "dtype": "bfloat16"},
                        {"fwd_ms": tf, "fwdbwd_ms": tfb, "peak_mem_mb": peak,
                         "per_step_us": 1000 * tf["median"] / T})


def layer_record(entry: Entry, B: int, dim: int, expansion: float, n: int | None = None,
                 T: int = T_DEFAULT, reps: int = 20, quick: bool = False) -> dict:
    """The whole layer at (dim, expansion[, n_state]) on backend 'cuda', bf16 autocast."""
    torch.manual_seed(0)
    kw = {} if n is None else {"n_state": n}
    layer = entry.layer(dim, expansion, backend="cuda", **kw).cuda()
    warm_up()
    tf, tfb, peak = layer_timings(layer, B, T, dim, torch.bfloat16, 3 if quick else reps, 2)
    return records.make("bench", entry.name, "cuda:layer",
                        {"measure": "single_layer", "T": T, "B": B, "D": dim, "expansion": expansion,
                         "n": n or getattr(layer, "n", None), "dtype": "bfloat16",
                         "layer_params": sum(p.numel() for p in layer.parameters())},
                        {"fwd_ms": tf, "fwdbwd_ms": tfb, "peak_mem_mb": peak,
                         "tokens_per_s": B * T / (tfb["median"] / 1000)})


def chapter_records(entries: list[Entry], B: int, dim: int, expansion: float, sizes: list[int],
                    T: int = T_DEFAULT, headline: tuple[str, ...] = (), quick: bool = False) -> list[dict]:
    """A chapter's runs: every entry with a kernel at its own state size n, the `headline` levels
    also at every n of `sizes` (the seed study's shapes); the recurrence and the whole layer at
    (dim, expansion). E14's state is D x D at D = int(dim * expansion)."""
    out = []
    for e in entries:
        if e.parity is None:
            continue
        if e.name == "E14":
            D = int(dim * expansion)
            out += [recurrence_record(e, B, D, T, quick=quick), layer_record(e, B, dim, expansion, None, T, quick=quick)]
            continue
        own = e.layer(16, backend="reference").n
        for n in sorted({own, *sizes}) if e.name in headline else [own]:
            out.append(recurrence_record(e, B, n, T, quick=quick))
            out.append(layer_record(e, B, dim, expansion, n, T, quick=quick))
    return out


def table(recs: list[dict]) -> str:
    """One row per single-state bench record (recurrence or layer) and per whole-layer record of
    `elman bench` (measure 'layer', e.g. E88 beside them), in record order."""
    rows = [r for r in recs if r["params"].get("measure") in ("single_recurrence", "single_layer", "layer")]
    lines = ["| level | measure | B | d | e | n | forward (ms) | fwd + bwd (ms) | peak memory (MB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, m = r["params"], r["metrics"]
        lines.append(f"| {r['variant']} | {p['measure'].removeprefix('single_')} | {p.get('B', '')} "
                     f"| {p.get('D', '')} | {p.get('expansion', '')} | {p.get('n', '')} "
                     f"| {m['fwd_ms']['median']:.3f} | {m['fwdbwd_ms']['median']:.3f} | {m['peak_mem_mb']:.0f} |")
    return "\n".join(lines)


def plot(recs: list[dict], measure: str = "single_recurrence", title: str = ""):
    """Bars of forward and forward + backward per level for one measure; None without records."""
    rows = [r for r in recs if r["params"].get("measure") == measure]
    if not rows:
        return None
    import matplotlib.pyplot as plt

    labels = [f"{r['variant']} n={r['params'].get('n')}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(rows)), 3.2))
    ax.bar([i - 0.2 for i in x], [r["metrics"]["fwd_ms"]["median"] for r in rows], 0.4, label="forward")
    ax.bar([i + 0.2 for i in x], [r["metrics"]["fwdbwd_ms"]["median"] for r in rows], 0.4, label="fwd + bwd")
    ax.set_xticks(list(x), labels, rotation=30, ha="right")
    ax.set_ylabel("ms (median)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_grid(recs: list[dict], measure: str = "single_layer", title: str = ""):
    """Forward + backward (ms) against n, one line per level; None without records."""
    rows = [r for r in recs if r["params"].get("measure") == measure and r["params"].get("n")]
    if not rows:
        return None
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for level in dict.fromkeys(r["variant"] for r in rows):
        pts = sorted((r["params"]["n"], r["metrics"]["fwdbwd_ms"]["median"]) for r in rows if r["variant"] == level)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=level)
    ax.set_xlabel("n (state size)")
    ax.set_ylabel("fwd + bwd (ms, median)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def memory_lines(recs: list[dict], a: str, b: str, n: int) -> str:
    """E73 beside E73cp (or any two levels) from their layer records at state size n: peak
    memory and time."""
    layer = {r["variant"]: r for r in recs if r["params"].get("measure") == "single_layer"
             and r["params"].get("n") == n}
    if a not in layer or b not in layer:
        return f"- No layer records of both {a} and {b} at n = {n}: no memory comparison yet."
    ma, mb = layer[a]["metrics"], layer[b]["metrics"]
    ta, tb = ma["fwdbwd_ms"]["median"], mb["fwdbwd_ms"]["median"]
    return (f"- At n = {n}, peak training memory of one layer: {a} {ma['peak_mem_mb']:.0f} MB, {b} "
            f"{mb['peak_mem_mb']:.0f} MB ({ma['peak_mem_mb'] / max(mb['peak_mem_mb'], 1e-9):.2f}x).\n"
            f"- Forward + backward: {a} {ta:.2f} ms, {b} {tb:.2f} ms ({b} is "
            f"{abs(100 * (tb / ta - 1)):.1f} % {'slower' if tb > ta else 'faster'}).")
