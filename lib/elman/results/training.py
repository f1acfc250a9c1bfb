"""`elman results`: a table over training runs, read from `train` records (and their logs).

One row per run name in each run folder (the latest record wins, so a resumed run counts
once): parameters, steps, last-100 loss (mean over the last 100 optimizer steps),
last-1000, validation loss, tokens/s, peak memory, GPU. Markdown, CSV or JSON.

The headline (`--headline`, `HEADLINE`) is the validation loss in bits/byte with its
standard error, beside last-100 and last-1000 (nats/byte), tokens/s without evaluation
time, how many passes over the training split the run made (flagged past one) and the
kernel paths its layers ran. Rows are sorted by validation loss (last-100 for records
without one).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from ..core import records

COLUMNS = ("name", "level", "params", "dim", "depth", "batch", "steps", "last100", "last1000",
           "val_loss", "tokens_per_s", "peak_memory_mb", "gpu", "run")
HEADLINE = ("name", "level", "params", "steps", "val_bits", "last100", "last1000", "tokens_per_s",
            "data_passes", "peak_memory_mb", "kernels", "gpu")


def rows(recs: list[dict]) -> list[dict]:
    """Table rows from train records, the latest per (run, name), sorted by validation loss
    (by last-100 where a record has none)."""
    latest: dict[tuple[str, str], dict] = {}
    for r in recs:
        if r["kind"] == "train":
            latest[(r.get("run", ""), r["params"]["name"])] = r
    out = []
    for r in latest.values():
        p, m = r["params"], r["metrics"]
        out.append({"name": p["name"], "level": r["variant"], "params": p["n_params"],
                    "dim": p["dim"], "depth": p["depth"], "batch": p["batch"] * p.get("world_size", 1),
                    "seq": p.get("seq"),
                    "steps": m["steps"], "last100": m["last100"], "last1000": m["last1000"],
                    "val_loss": m["val_loss"], "tokens_per_s": m["tokens_per_s"],
                    "peak_memory_mb": m["peak_memory_mb"], "gpu": r["env"].get("gpu") or "cpu",
                    "run": r.get("run", ""), "log": m["log"],
                    "val_bits": m.get("val_bits"), "val_bits_se": m.get("val_bits_se"),
                    "val_se": m.get("val_se"), "val_windows": m.get("val_windows"),
                    "val_per_source": m.get("val_per_source"), "data_passes": m.get("data_passes"),
                    "tokens_per_s_mean": m.get("tokens_per_s_mean"), "elapsed_s": m.get("elapsed_s"),
                    "kernels": m.get("kernels"), "kernel_paths": m.get("kernel_paths"),
                    "seed": p.get("seed"), "minutes": p.get("minutes"), "lr": p.get("lr"),
                    "expansion": p.get("expansion"), "option": p.get("option") or [],
                    "data": p.get("data"), "data_sha256": p.get("data_sha256"),
                    "family": p.get("family")})

    def key(row: dict) -> tuple:
        v = row["val_loss"] if row["val_loss"] is not None else row["last100"]
        return (v is None, v or 0.0)
    return sorted(out, key=key)


def read_log(runs: Path, row: dict) -> dict[str, list]:
    """A table row's JSONL log as columns: train lines (step, loss, tokens_per_s, lr,
    grad_norm, elapsed_s: training seconds without evaluation pauses; None where a line lacks
    it) and val lines (step, val_loss, val_se, per-source loss); a step logged twice (after a
    resume) keeps its last line.
    `runs` is the row's run folder or the folder that holds it."""
    folder = Path(runs) / row["run"] if (Path(runs) / row["run"]).is_dir() else Path(runs)
    train, val = {}, {}
    for line in (folder / row["log"]).read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "train":
            train[e["step"]] = e
        elif e["kind"] == "val":
            val[e["step"]] = e
    cols: dict[str, list] = {k: [] for k in ("step", "loss", "tokens_per_s", "lr", "grad_norm", "elapsed_s")}
    for s in sorted(train):
        for k in cols:
            cols[k].append(train[s].get(k))
    cols["val_step"] = sorted(val)
    cols["val_loss"] = [val[s]["val_loss"] for s in sorted(val)]
    cols["val_se"] = [val[s].get("val_se") for s in sorted(val)]
    cols["val_per_source"] = [val[s].get("per_source", {}) for s in sorted(val)]
    return cols


def cell(key: str, row: dict) -> str:
    """A row's value `key` as the tables print it."""
    v = row.get(key)
    if key == "val_bits" and v is not None and row.get("val_bits_se") is not None:
        return f"{v:.4f} ± {row['val_bits_se']:.4f}"
    if key == "data_passes" and v is not None:
        return f"{v:.2f}" + (" (past one pass)" if v > 1 else "")
    return _fmt(key, v)


def _fmt(key: str, v) -> str:
    if v is None:
        return "-"
    if key == "params":
        return f"{v / 1e6:.2f}M"
    if key in ("last100", "last1000", "val_loss", "val_bits"):
        return f"{v:.4f}"
    if key in ("tokens_per_s", "peak_memory_mb"):
        return f"{v:,.0f}"
    return str(v)


def markdown(table: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(cell(c, r) for c in columns) + " |\n" for r in table)


def to_csv(table: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(table)
    return buf.getvalue()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", type=Path,
                   help="run folders or records.jsonl files (default: every run in runs/)")
    p.add_argument("--format", choices=("md", "csv", "json"), default="md")
    p.add_argument("--level", action="append", help="only these levels (repeatable)")
    p.add_argument("--headline", action="store_true",
                   help="the headline columns: validation bits/byte with its standard error first")


def main(args: argparse.Namespace) -> int:
    table = rows(records.read(args.paths or None, kind="train"))
    if args.level:
        wanted = {lv.lower() for lv in args.level}
        table = [r for r in table if r["level"].lower() in wanted]
    if not table:
        print("no train records found")
        return 1
    columns = HEADLINE if args.headline else COLUMNS
    if args.format == "json":
        print(json.dumps(table, indent=2))
    elif args.format == "csv":
        print(to_csv(table, columns), end="")
    else:
        print(markdown(table, columns), end="")
    return 0


SEEDS = records.ROOT / "book" / "data" / "seed_results.csv"


def seed_results(level: str | None = None, config: str | None = None) -> list[dict]:
    """The seed documents' reported figures (book/data/seed_results.csv: level, config,
    metric, value, unit, source, notes), optionally of one level and config. They are the
    seed's claims on other data and GPUs, quoted for comparison, not measurements here."""
    with open(SEEDS, newline="") as f:
        rows = [{**r, "value": float(r["value"])} for r in csv.DictReader(f)]
    return [r for r in rows if (level is None or r["level"] == level)
            and (config is None or r["config"] == config)]
