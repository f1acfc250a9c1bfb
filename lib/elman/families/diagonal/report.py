"""Tables, plots and findings of the diagonal family's chapters, computed from bench records
(`bench.cell_records`: measure "cell", metrics fwd/bwd time, bytes, GB/s and % of the copy
bandwidth measured in the same run). Every number a chapter prints comes from here."""
from __future__ import annotations

TARGET_PCT = 60.0  # committed: forward and backward at >= 60 % of the copy bandwidth
HEADLINE = {"B": 64, "D": 2048, "T": 512}


def cells(recs: list[dict], variants: tuple[str, ...] | list[str]) -> list[dict]:
    """The cell records of these variants (their scans and the baselines beside them)."""
    return [r for r in recs if r.get("kind") == "bench" and r["params"].get("measure") == "cell"
            and r["variant"] in variants]


def _key(r: dict) -> tuple:
    p = r["params"]
    return (r["variant"], r["impl"], p.get("T", 0), p.get("D", 0), p.get("B", 0))


def _bwd_ms(m: dict) -> float:
    return m["bwd_ms"]["median"] if "bwd_ms" in m else m["fwdbwd_ms"]["median"] - m["fwd_ms"]["median"]


def bandwidth_table(recs: list[dict]) -> str:
    """One row per record: time and achieved bandwidth forward and backward, % of copy."""
    lines = ["| variant | implementation | T | B | D | fwd ms | fwd GB/s | fwd % of copy | bwd ms "
             "| bwd GB/s | bwd % of copy | copy GB/s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=_key):
        p, m = r["params"], r["metrics"]
        lines.append(f"| {r['variant']} | {r['impl']} | {p['T']} | {p['B']} | {p['D']} "
                     f"| {m['fwd_ms']['median']:.3f} | {m['fwd_gbs']:.0f} | {m['fwd_pct_copy']:.0f} "
                     f"| {_bwd_ms(m):.3f} | {m['bwd_gbs']:.0f} | {m['bwd_pct_copy']:.0f} | {m['copy_gbs']:.0f} |")
    return "\n".join(lines)


def plot_bandwidth(recs: list[dict], T: int, title: str = ""):
    """% of the copy bandwidth against B * D, forward and backward, one line per (variant,
    implementation), at sequence length T."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    series: dict[tuple, list[tuple[int, float, float]]] = {}
    for r in recs:
        p, m = r["params"], r["metrics"]
        if p.get("T") == T:
            series.setdefault((r["variant"], r["impl"]), []).append(
                (p["B"] * p["D"], m["fwd_pct_copy"], m["bwd_pct_copy"]))
    for ax, idx, name in ((axes[0], 1, "forward"), (axes[1], 2, "backward")):
        for (v, impl), pts in sorted(series.items()):
            pts = sorted(pts)
            ax.plot([x[0] for x in pts], [x[idx] for x in pts], marker="o", label=f"{v} {impl}")
        ax.axhline(TARGET_PCT, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("B * D (channels)")
        ax.set_title(f"{name}, T = {T}")
    axes[0].set_ylabel("% of the measured copy bandwidth")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def headline(recs: list[dict], shape: dict = HEADLINE) -> str:
    """Findings at the committed shape: each implementation's forward and backward % of copy
    and whether each scan meets the target."""
    at = [r for r in recs if all(r["params"].get(k) == v for k, v in shape.items())]
    if not at:
        where = ", ".join(f"{k} = {v}" for k, v in shape.items())
        return f"- No record at {where} yet."
    lines = []
    for r in sorted(at, key=_key):
        m = r["metrics"]
        verdict = ""
        if r["impl"] == "cuda:scan":
            ok = m["fwd_pct_copy"] >= TARGET_PCT and m["bwd_pct_copy"] >= TARGET_PCT
            verdict = (" - meets" if ok else " - misses") + f" the {TARGET_PCT:.0f} % target"
        lines.append(f"- {r['variant']} {r['impl']}: forward {m['fwd_ms']['median']:.3f} ms "
                     f"({m['fwd_pct_copy']:.0f} % of copy), backward {_bwd_ms(m):.3f} ms "
                     f"({m['bwd_pct_copy']:.0f} % of copy){verdict}.")
    ours = {r["variant"]: r for r in at if r["impl"] == "cuda:scan"}
    for r in at:
        if r["impl"] != "cuda:scan" and r["variant"] in ours:
            o = ours[r["variant"]]["metrics"]
            m = r["metrics"]
            lines.append(f"- {r['variant']}: the scan's forward + backward is "
                         f"{m['fwdbwd_ms']['median'] / o['fwdbwd_ms']['median']:.1f}x as fast as {r['impl']}.")
    return "\n".join(lines)


def closing_table(recs: list[dict], variants: tuple[str, ...] | list[str], shape: dict = HEADLINE) -> str:
    """The issue's closing table from one run's records: per variant the worst parity error
    in fp32 and bf16 (every shape, output and gradient), and at `shape` the scan's forward and
    backward time and % of the copy bandwidth; FLA's HGRN kernels and the compiled E68 loop
    as rows of their own."""
    lines = ["| variant | implementation | worst fp32 error | worst bf16 error | fwd ms | fwd % of copy "
             "| bwd ms | bwd % of copy |", "|---|---|---|---|---|---|---|---|"]
    at = {(r["variant"], r["impl"]): r for r in cells(recs, variants)
          if all(r["params"].get(k) == v for k, v in shape.items())}
    for v in variants:
        par = [r for r in recs if r.get("kind") == "parity" and r["variant"] == v]

        def worst(dt):
            errs = [max(r["metrics"]["max_fwd"], r["metrics"]["max_bwd"]) for r in par
                    if r["params"]["dtype"] == dt]
            return f"{max(errs):.1e}" if errs else "-"
        impls = sorted({i for (w, i) in at if w == v}, key=lambda i: (i != "cuda:scan", i)) or ["cuda:scan"]
        for impl in impls:
            r = at.get((v, impl))
            errs = (worst("float32"), worst("bfloat16")) if impl == "cuda:scan" else ("", "")
            if r is None:
                lines.append(f"| {v} | {impl} | {errs[0]} | {errs[1]} | - | - | - | - |")
                continue
            m = r["metrics"]
            lines.append(f"| {v} | {impl} | {errs[0]} | {errs[1]} | {m['fwd_ms']['median']:.3f} "
                         f"| {m['fwd_pct_copy']:.0f} | {_bwd_ms(m):.3f} | {m['bwd_pct_copy']:.0f} |")
    return "\n".join(lines)
