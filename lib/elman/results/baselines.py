"""What the Baselines chapter shows, computed here so that the chapter stays thin: library
versions, the GDN verification, parity and layer benchmark tables and the plot, all read
from the records of the chapter's pinned runs. Parameter counts need the registry, which a
reader of records does not import: the chapter takes them from `elman.registry`."""
from __future__ import annotations

import html
import importlib.metadata as md
import json
from pathlib import Path
from typing import Callable

import torch


LEVELS = ("E1", "mamba2", "fla-gdn", "gru", "lstm", "llama")
BASELINES = LEVELS[1:]
PACKAGES = ("torch", "triton", "mamba-ssm", "flash-linear-attention", "fla-core", "transformers")
VERIFY_FILE = "verify_gdn.json"


def versions() -> dict[str, str]:
    """Installed versions of the packages the baselines run on (and the GPU, if any)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return out


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    """A markdown table of dict rows (columns: the first row's keys unless given)."""
    if not rows:
        return ""
    cols = columns or list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


class Table:
    """Rows shown as a table: HTML in notebooks and the book, markdown as text."""

    def __init__(self, rows: list[dict], columns: list[str] | None = None):
        self.rows, self.columns = rows, columns or (list(rows[0]) if rows else [])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in self.columns)
                       + "</tr>" for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __str__(self) -> str:
        return markdown(self.rows, self.columns)

    _repr_markdown_ = __str__


def kernel_names(fn: Callable[[], None]) -> list[str]:
    """The CUDA kernels fn() launches (torch.profiler), e.g. to show which cuDNN algorithm ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()
                   if e.device_type == torch.autograd.DeviceType.CUDA})


# ---- records ------------------------------------------------------------------------------
def layer_benchmarks(recs: list[dict]) -> list[dict]:
    """Layer benchmark rows of E1 and the baselines from the one run that has the most
    baselines (numbers are compared within a run only); none where no run has a baseline."""
    recs = [r for r in recs if r["kind"] == "bench" and r["params"].get("measure") == "layer"
            and r["variant"] in LEVELS]
    runs: dict[str, set] = {}
    for r in recs:
        runs.setdefault(r["run"], set()).add(r["variant"])
    runs = {run: levels for run, levels in runs.items() if levels - {"E1"}}
    if not runs:
        return []
    best = max(runs, key=lambda run: (len(runs[run] - {"E1"}), "E1" in runs[run], run))
    rows = []
    for r in recs:
        if r["run"] != best:
            continue
        p, m = r["params"], r["metrics"]
        rows.append({"level": r["variant"], "impl": r["impl"], "dtype": p["dtype"], "B": p["B"],
                     "T": p["T"], "D": p["D"], "params": p.get("layer_params"),
                     "fwd_ms": m["fwd_ms"]["median"], "fwdbwd_ms": m["fwdbwd_ms"]["median"],
                     "tokens_per_s": m["tokens_per_s"], "peak_mem_mb": m["peak_mem_mb"],
                     "gpu": r["env"].get("gpu"), "run": r["run"]})
    order = {n: i for i, n in enumerate(LEVELS)}
    return sorted(rows, key=lambda r: (r["D"], r["B"], order[r["level"]], r["dtype"]))


def with_ratio_to_e1(rows: list[dict]) -> list[dict]:
    """Adds `vs_E1`: tokens/s relative to E1 at the same (B, T, D) of the same run."""
    e1 = {(r["B"], r["T"], r["D"]): r["tokens_per_s"] for r in rows if r["level"] == "E1"}
    return [{**r, "vs_E1": r["tokens_per_s"] / e1[(r["B"], r["T"], r["D"])]
             if (r["B"], r["T"], r["D"]) in e1 else None} for r in rows]


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


def beside_e1(rows: list[dict]) -> list[dict]:
    """One row per (B, D) of `with_ratio_to_e1` rows: E1's tokens/s (forward + backward)
    and every other level's (and dtype's) tokens/s as a multiple of E1's."""
    dtypes: dict[str, set] = {}
    for r in rows:
        dtypes.setdefault(r["level"], set()).add(r["dtype"])
    out: dict[tuple, dict] = {}
    for r in rows:
        row = out.setdefault((r["B"], r["D"]), {"B": r["B"], "T": r["T"], "D": r["D"]})
        if r["level"] == "E1":
            row["E1 tokens/s"] = r["tokens_per_s"]
        else:
            name = r["level"] if len(dtypes[r["level"]]) == 1 else f"{r['level']} {_short(r['dtype'])}"
            row[f"{name} / E1"] = r["vs_E1"]
    return [out[k] for k in sorted(out, key=lambda k: (k[1], k[0]))]


DQKWG_PATHS = {"torch": "PyTorch (elman.baselines.gdn.chunk_bwd_dqkwg)", "triton": "FLA's Triton kernel",
               "triton-unguarded": "FLA's Triton kernel, guard lifted"}


def fla_gdn_runs(recs: list[dict], verified: list[dict], run: str | None = None) -> list[dict]:
    """Exactly what ran for fla-gdn in one run (default: the newest with fla-gdn records or
    verification rows): per check (each mode of scripts/verify_gdn.py, `elman parity`,
    `elman bench`) the implementation, who computed chunk_bwd_dqkwg, the cases and how
    many passed."""
    mine = [r for r in recs if r["variant"] == "fla-gdn" and r["kind"] in ("parity", "bench")]
    run = run or max([r["run"] for r in mine] + [r["run"] for r in verified], default=None)
    groups: dict[tuple, list] = {}
    for r in verified:
        if r["run"] == run:
            groups.setdefault(("scripts/verify_gdn.py", r["mode"], r["impl"]), []).append(
                (r["passed"], r.get("torch_dqkwg_calls")))
    for r in mine:
        if r["run"] == run and r["params"].get("check") != "verify_gdn":
            check = "elman parity" if r["kind"] == "parity" else "elman bench"
            groups.setdefault((check, "", r["impl"]), []).append(
                (r["metrics"].get("passed") if r["kind"] == "parity" else None, None))
    rows = []
    for (check, mode, impl), cases in groups.items():
        path = impl.rsplit("dqkwg-", 1)[-1]
        calls = [c for _, c in cases if c is not None]
        rows.append({"check": check, "mode": mode, "impl": impl, "chunk_bwd_dqkwg": DQKWG_PATHS.get(path, path),
                     "cases": len(cases),
                     "passed": None if cases[0][0] is None else sum(bool(p) for p, _ in cases),
                     "PyTorch dqkwg calls": sum(calls) if calls else None, "run": run})
    return rows


def plot_layers(rows: list[dict]):
    """Tokens/s (forward + backward) against D, one panel per batch size, one line per level
    and dtype."""
    import matplotlib.pyplot as plt

    batches = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.5 * len(batches), 3.6), squeeze=False)
    for ax, B in zip(axes[0], batches):
        lines: dict[str, list] = {}
        for r in rows:
            if r["B"] == B:
                lines.setdefault(f"{r['level']} ({r['dtype']})", []).append((r["D"], r["tokens_per_s"]))
        for label, pts in lines.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="D (model width)", title=f"B = {B}, T = {rows[0]['T']}")
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_xticks(sorted({r["D"] for r in rows}), [str(d) for d in sorted({r["D"] for r in rows})])
    axes[0][0].set_ylabel("tokens/s, one layer fwd+bwd")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def parity_rows(recs: list[dict]) -> list[dict]:
    """Parity records of the baselines (latest run first), as the parity table shows them."""
    return sorted((r for r in recs if r["kind"] == "parity" and r["variant"] in BASELINES),
                  key=lambda r: (r["run"], r["variant"]), reverse=True)


def parity_summary(recs: list[dict]) -> list[dict]:
    """One row per parity record: the worst forward and gradient errors and the verdict."""
    return [{"level": r["variant"], "impl": r["impl"], "dtype": r["params"]["dtype"],
             "T": r["params"]["T"], "B": r["params"]["B"], "D": r["params"]["D"],
             "max fwd err": f"{r['metrics']['max_fwd']:.2e}", "max grad err": f"{r['metrics']['max_bwd']:.2e}",
             "tolerance": f"{r['metrics']['tol_fwd']:.0e} / {r['metrics']['tol_bwd']:.0e}",
             "result": "pass" if r["metrics"]["passed"] else "FAIL", "run": r["run"]} for r in recs]


def verify_rows(run_dirs: list[Path]) -> list[dict]:
    """The rows scripts/verify_gdn.py saved (every mode it ran) in the given run folders
    (`pins.runs("baselines")`), newest run first."""
    rows = []
    for d in sorted(run_dirs, reverse=True):
        f = Path(d) / VERIFY_FILE
        if f.is_file():
            data = json.loads(f.read_text())
            rows += [{**r, "run": Path(d).name, "gpu": data["env"].get("gpu")} for r in data["rows"]]
    return rows


def verify_summary(rows: list[dict]) -> list[dict]:
    """One line per (mode, dtype, shape): the worst forward and gradient errors, or why the
    path was refused."""
    out = []
    for r in rows:
        worst = ""
        if "errors" in r:
            name, err = max(((k, v) for k, v in r["errors"].items() if k.startswith("grad:")),
                            key=lambda kv: kv[1], default=("", 0.0))
            worst = f"{name} {err:.2e}"
        if r["passed"]:
            result = "pass"
        elif "refused" in r:
            result = "refused: " + r["refused"]
        else:
            result = "FAIL" + (": " + r["error"] if "error" in r else "")
        out.append({"mode": r["mode"], "dqkwg": r["path"], "dtype": r["dtype"], "T": r["T"],
                    "B": r["B"], "D": r["D"], "expansion": r.get("expansion", 2.0), "heads": r["heads"],
                    "max fwd err": f"{r['max_fwd']:.2e}" if "max_fwd" in r else "",
                    "max grad err": f"{r['max_bwd']:.2e}" if "max_bwd" in r else "",
                    "worst gradient": worst, "result": result})
    return out


def verify_table(rows: list[dict]) -> str:
    return markdown(verify_summary(rows))
