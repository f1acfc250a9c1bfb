"""The Leaderboard chapter's tables, read from `train` records: book/chapters/leaderboard.ipynb.

Two tables, each one protocol (scripts/make_jobs.py writes their jobs): the 50M table (depth 6,
batch 64) and the 100M table (depth 20, batch 32), both T 512, lr 3e-4, 10 minutes, on the
jobs' corpus. The 100M table also holds every other registered variant (and the GRU and LSTM
baselines) as `further` rows, run at its protocol after the seed study's. A record belongs to a table when its configuration is the table's: depth, global
batch, sequence length, minutes, learning rate and the name of its data file (`membership`);
any other record is listed apart with the reason; a level outside a table's list joins the
table when its record matches the protocol. Within a table a model is a level at one
width, depth, expansion and option set; its row is the run at the protocol's seed (42), a run
at another seed measures the seed-to-seed noise. Where two pinned runs hold the same model and
seed, the later run folder counts.

A row's level is the table's spelling of it (E37v2, not the registry's E37, which a profile
record carries), so that the table's level list, its seed figures and its job files name it alike.

The headline is the validation loss in bits/byte with its standard error; rows are ranked by
it. Gaps between models are judged against the evaluation noise (twice the standard error of
the difference, sqrt(se_a^2 + se_b^2), which ignores that every model sees the same windows)
and against the largest seed-to-seed difference of the table, where a model has two seeds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import training

CORPUS = "debian-mix-1200M.txt.xz"  # the jobs' data file; a record is matched by the file's name
DATA = f".cache/data/{CORPUS}"
SEED, SECOND_SEED = 42, 43
SLOW_PATHS = ("reference", "graph", "steps", "schedule")  # "schedule": a matrix op's PyTorch engine


# E14's state is D x k a sequence with k = D; at the 100M width (D = 1024) one layer's state
# alone is 4 MiB a sequence, beyond the gated kernels' on-chip state, and the reference loop
# keeps every step's state for the backward (T B D^2 floats a layer). The 128 is the largest of
# families.matrix.gated_op.SIZES (tests check it).
E14_TOO_WIDE = ("its state is D x D a sequence (k = D); at this width D is above the gated kernels' 128 "
                "and the reference loop keeps every step's D x D state for the backward "
                "(the preflight's error is in the pinned log)")


@dataclass(frozen=True)
class Table:
    key: str
    title: str
    depth: int
    batch: int  # global: per-GPU batch x world size
    levels: tuple[str, ...]             # the seed study's rows
    seed_configs: tuple[str, ...] = ()  # configs of book/data/seed_results.csv this table compares with
    seq: int = 512
    minutes: float | None = 10.0
    lr: float = 3e-4
    further: tuple[str, ...] = ()       # rows beyond the seed study's, run after them
    cannot_run: tuple[tuple[str, str], ...] = ()  # (level, why): rows no run can fill at this protocol

    @property
    def all_levels(self) -> tuple[str, ...]:
        return self.levels + self.further

    @property
    def runnable(self) -> tuple[str, ...]:
        """The rows that jobs are written for: every level but those that cannot run."""
        skip = {lv.lower() for lv, _ in self.cannot_run}
        return tuple(lv for lv in self.all_levels if lv.lower() not in skip)


TABLES = {
    "50m": Table("50m", "50M table", 6, 64,
                 ("E1", "E0", "E33", "E34", "E36", "E37v2", "E39", "E42", "mamba2", "fla-gdn", "llama"),
                 ("d1280x6", "d1536x6")),
    "100m": Table("100m", "100M table", 20, 32,
                  ("fla-gdn", "mamba2", "E68", "E67", "E1", "E42", "E56", "E65", "E64", "llama",
                   "E61", "E63", "E62", "E66", "E88d_h12", "E75"),
                  ("100M",),
                  further=("E0", "E4", "E5", "E14", "E23", "E33", "E34", "E36", "E37v2", "E38", "E39",
                           "E70", "E71", "E72", "E73", "E74v2", "gru", "lstm"),
                  cannot_run=(("E14", E14_TOO_WIDE),)),
}


def mismatch(table: Table, row: dict) -> str | None:
    """Why `row` is not a run of `table`'s protocol (the first field that differs), or None."""
    data = Path(row.get("data") or "").name
    checks = (("depth", row["depth"], table.depth), ("batch", row["batch"], table.batch),
              ("seq", row.get("seq"), table.seq), ("minutes", row.get("minutes"), table.minutes),
              ("lr", row.get("lr"), table.lr), ("data", data, CORPUS))
    for name, got, want in checks:
        if got != want:
            return f"{name} {got}, not {want}"
    return None


# Levels a table spells as the seed study did, by the registry's name of each (an lm_profile
# record names the registry's entry, and the level as typed only in its params where it has one;
# tests/test_leaderboard.py checks these against the registry).
SPELLINGS = {"e37": "E37v2"}


def table_level(table: Table, level: str) -> str:
    """The table's spelling of `level` (E37v2 for the registry's E37), else `level`."""
    name = SPELLINGS.get(level.lower(), level).lower()
    return next((lv for lv in table.all_levels if lv.lower() == name), level)


def membership(rows: list[dict]) -> tuple[dict[str, list[dict]], list[tuple[dict, str]]]:
    """The rows of each table, and the rows of neither with the reason (their mismatch with the
    table of their depth, or the depth)."""
    tables: dict[str, list[dict]] = {key: [] for key in TABLES}
    others = []
    for row in rows:
        misses = {key: mismatch(t, row) for key, t in TABLES.items()}
        hit = [key for key, why in misses.items() if why is None]
        if hit:
            tables[hit[0]].append({**row, "level": table_level(TABLES[hit[0]], row["level"])})
            continue
        same_depth = [misses[k] for k, t in TABLES.items() if t.depth == row["depth"]]
        depths = " or ".join(str(t.depth) for t in TABLES.values())
        others.append((row, same_depth[0] if same_depth else f"depth {row['depth']}, not {depths}"))
    return tables, others


def bits(row: dict) -> float | None:
    """Validation loss in bits/byte (from nats where the record predates bits)."""
    if row.get("val_bits") is not None:
        return row["val_bits"]
    return row["val_loss"] / math.log(2) if row.get("val_loss") is not None else None


def bits_se(row: dict) -> float | None:
    if row.get("val_bits_se") is not None:
        return row["val_bits_se"]
    return row["val_se"] / math.log(2) if row.get("val_se") is not None else None


def model_key(row: dict) -> tuple:
    """One model of a table: level, width, depth, expansion and options (seeds apart)."""
    return (row["level"].lower(), row["dim"], row["depth"], row.get("expansion"),
            tuple(row.get("option") or ()))


@dataclass
class Board:
    table: Table
    rows: list[dict]                    # every run of the table, all seeds
    ranked: list[dict]                  # one row a model (its seed-42 run), by validation bits/byte
    seeds: dict[tuple, dict[int, dict]]  # model (model_key) -> seed -> row
    missing: list[str]                  # the table's runnable rows (levels, then further) with no run
    noise: float | None                 # the largest seed-to-seed difference, bits/byte


def board(table: Table, rows: list[dict]) -> Board:
    """The table's models, ranked, with their seeds, missing levels and seed noise."""
    seeds: dict[tuple, dict[int, dict]] = {}
    for row in sorted(rows, key=lambda r: r.get("run", "")):
        seeds.setdefault(model_key(row), {})[row.get("seed")] = row
    primary = [runs.get(SEED) or runs[min(runs)] for runs in seeds.values()]
    ranked = sorted(primary, key=lambda r: (bits(r) is None, bits(r) or 0.0))
    measured = {r["level"].lower() for r in ranked}
    diffs = [d for d in (seed_difference(runs) for runs in seeds.values()) if d is not None]
    return Board(table, rows, ranked, seeds, [lv for lv in table.runnable if lv.lower() not in measured],
                 max(diffs) if diffs else None)


def boards(rows: list[dict]) -> tuple[list[Board], list[tuple[dict, str]]]:
    """Both tables' boards from table rows (`training.rows`), and the rows of neither."""
    tables, others = membership(rows)
    return [board(TABLES[key], tables[key]) for key in TABLES], others


def seed_difference(runs: dict[int, dict]) -> float | None:
    """Largest minus smallest validation bits/byte over a model's seeds (None with one seed)."""
    values = [bits(r) for r in runs.values() if bits(r) is not None]
    return max(values) - min(values) if len(values) > 1 else None


def run_name(level: str, dim: int, depth: int, seed: int) -> str:
    """The jobs' run name: level, width and depth, and the seed where it is not the protocol's."""
    return f"{level}_d{dim}x{depth}" + (f"_s{seed}" if seed != SEED else "")


def top_levels(b: Board, k: int) -> list[str]:
    """The levels of the first k ranked models (the second seed's candidates)."""
    return [r["level"] for r in b.ranked[:k] if bits(r) is not None]


# ---- seed study figures ---------------------------------------------------------------------

def seed_figures(level: str, configs: tuple[str, ...]) -> dict[str, dict]:
    """The seed study's last-100 loss ('loss') and tokens/s ('tokens') of `level` in one of
    `configs`: {'text': a value or a low-high range, 'source', 'config', 'notes'}."""
    out = {}
    for what, prefix, fmt in (("loss", "last-100 loss", "{:g}"), ("tokens", "tokens/s", "{:,.0f}")):
        found = [r for r in training.seed_results(level) if r["config"] in configs
                 and r["metric"].startswith(prefix)]
        if found:
            values = sorted(r["value"] for r in found)
            text = fmt.format(values[0]) + (f"–{fmt.format(values[-1])}" if values[-1] != values[0] else "")
            out[what] = {"text": text, "source": found[0]["source"], "config": found[0]["config"],
                         "notes": found[0]["notes"]}
    return out


class Notes:
    """The sources of the seed figures shown in one table, numbered in order of first use: one
    note a source and config, with each level's own notes."""

    def __init__(self) -> None:
        self.notes: dict[tuple[str, str], dict[str, list[str]]] = {}

    def mark(self, level: str, figure: dict | None) -> str:
        if not figure:
            return "-"
        key = (figure["source"], figure["config"])
        levels = self.notes.setdefault(key, {})
        if figure["notes"] and figure["notes"] not in levels.setdefault(level, []):
            levels[level].append(figure["notes"])
        return f"{figure['text']} [{list(self.notes).index(key) + 1}]"

    def markdown(self) -> str:
        lines = []
        for i, ((source, config), levels) in enumerate(self.notes.items(), 1):
            own = "; ".join(f"{lv}: {'; '.join(ns)}" for lv, ns in levels.items() if ns)
            lines.append(f"[{i}] {source}, {config}." + (f" {own}." if own else "") + "  ")
        return "\n".join(lines)


# ---- table cells ----------------------------------------------------------------------------

def path_names(layer: dict) -> set[str]:
    f = layer.get("forward")
    return set(f.values()) if isinstance(f, dict) else {f}


def kernel_flag(row: dict) -> str:
    """'⚠' where a layer ran the reference, per-step launches (graph, steps) or a PyTorch
    schedule instead of its fast path, '?' where a variant's layers ran no family op that
    records its path, '' else."""
    layers = (row.get("kernel_paths") or {}).get("layers") or []
    names = set().union(*(path_names(layer) for layer in layers)) if layers else set()
    if names & set(SLOW_PATHS) or any(layer.get("backend") == "reference" for layer in layers):
        return "⚠"
    if "pytorch" in names and row.get("family") is not None:  # a variant (a baseline has no family)
        return "?"
    return ""


# A baseline layer names the library path it runs in its `impl`, which the trainer records; a
# record written before the trainer read it says "pytorch" for every baseline layer. For the
# baselines whose path is fixed, the table names it beside such a record's label (each is the
# baseline's IMPL, written out because results import only the core; tests check them).
LIBRARY_PATHS = {"mamba2": "mamba-ssm-2.3.2:ssd-triton"}


def kernels_text(row: dict) -> str:
    """The record's kernel-path summary; for a fixed-path baseline recorded as 'pytorch', with
    the library path its layer runs."""
    text = row.get("kernels") or "-"
    impl = LIBRARY_PATHS.get(row["level"].lower())
    if impl and row.get("family") is None and text.startswith("pytorch"):
        text += f" (the record's label; the layer runs {impl})"
    return text


def bits_text(row: dict) -> str:
    v, se = bits(row), bits_se(row)
    return "-" if v is None else f"{v:.4f} ± {se:.4f}" if se is not None else f"{v:.4f}"


def _num(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def _params(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


CELLS = {
    "model": lambda r: r["name"],
    "bits/byte ± se": bits_text,
    "nats/byte": lambda r: training.cell("val_loss", r),
    "last-100": lambda r: training.cell("last100", r),
    "last-1000": lambda r: training.cell("last1000", r),
    "tokens/s": lambda r: training.cell("tokens_per_s", r),
    "params": lambda r: _params(r.get("params")),
    "peak GiB": lambda r: _num(r.get("peak_memory_mb") and r["peak_memory_mb"] / 1024, "{:.1f}"),
    "steps": lambda r: _num(r.get("steps"), "{:,}"),
    "data passes": lambda r: training.cell("data_passes", r),
    "kernel paths": lambda r: " ".join(x for x in (kernel_flag(r), kernels_text(r)) if x),
}
FULL = ("model", "bits/byte ± se", "nats/byte", "last-100", "last-1000", "seed last-100",
        "tokens/s", "seed tokens/s", "params", "peak GiB", "steps", "data passes", "kernel paths")
CLOSING = ("model", "bits/byte ± se", "last-1000", "seed last-100", "tokens/s", "seed tokens/s")


def markdown_table(b: Board, columns: tuple[str, ...] = FULL) -> str:
    """The board as markdown: measured models ranked, then the table's levels not run yet; the
    seed study's figures beside each with numbered sources under the table."""
    notes = Notes()
    lines = ["| # | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    entries = [(r["level"], r) for r in b.ranked] + [(lv, None) for lv in b.missing]
    entries += [(lv, None) for lv, _ in b.table.cannot_run if lv.lower() not in {r["level"].lower() for r in b.ranked}]
    for i, (level, row) in enumerate(entries, 1):
        seed = seed_figures(level, b.table.seed_configs)
        cells = []
        for c in columns:
            if c == "seed last-100":
                cells.append(notes.mark(level, seed.get("loss")))
            elif c == "seed tokens/s":
                cells.append(notes.mark(level, seed.get("tokens")))
            elif row is None:
                cells.append(level if c == "model" else "" if c != "bits/byte ± se"
                             else "cannot run at this protocol" if level not in b.missing else "not run yet")
            else:
                cells.append(CELLS[c](row))
        lines.append(f"| {i if row else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n" + notes.markdown() if notes.notes else "")


# ---- preflight ------------------------------------------------------------------------------

def preflight_table(b: Board, profiles: list[dict]) -> str | None:
    """Markdown: the preflight of the table's models (`lm_profile` records of its protocol's
    batch, depth and T in the step `elman train --graph` takes: a few steps of the model its job
    builds, on random bytes; gpu_pass.sh's preflight stage), each with its parameters, tokens/s,
    step time, peak memory and kernel paths, and the 10-minute run's tokens/s where the model has
    one; a model whose preflight failed (an `lm_profile_failed` record) shows the error; None
    without such a record. The later run folder counts for a model profiled twice.
    A record's `family` param, where it has one, lets the kernel paths take kernel_flag's '?'."""
    t = b.table
    latest = {}
    for r in sorted(profiles, key=lambda r: r.get("run", "")):
        p = r["params"]
        if p.get("measure") in ("lm_profile", "lm_profile_failed") and \
                (p.get("mode"), p.get("setup"), p["depth"], p["B"], p["T"]) == \
                ("trainer-graph", "after", t.depth, t.batch, t.seq):
            latest[(table_level(t, p.get("level", r["variant"])), p["dim"], p["expansion"])] = r
    if not latest:
        return None
    runs = {(r["level"], r["dim"], r.get("expansion")): r for r in b.ranked}
    order = {lv: i for i, lv in enumerate(t.all_levels)}
    lines = ["| model | params | tokens/s | 10-minute run's tokens/s | step ms | peak GiB | kernel paths |",
             "|---|---|---|---|---|---|---|"]
    for (level, dim, e), r in sorted(latest.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
        m, run = r["metrics"], runs.get((level, dim, e))
        name = f"| {level} d{dim} x {t.depth}" + (f" (e {e:g})" if e != 1 else "")
        if r["params"]["measure"] == "lm_profile_failed":
            error = m["error"].replace("|", "\\|")  # a table cell
            lines.append(f"{name} | - | failed | - | - | - | {error} |")
            continue
        flag = kernel_flag({"kernel_paths": m.get("kernel_paths"), "family": r["params"].get("family")})
        lines.append(name + f" | {_params(r['params'].get('n_params'))} | {m['tokens_per_s']:,.0f} | "
                     + (f"{run['tokens_per_s']:,.0f}" if run else "not run yet")
                     + f" | {m['phase_ms']['step']:.1f} | {m['peak_mem_mb'] / 1024:.1f} | "
                     + " ".join(x for x in (flag, kernels_text({"level": level, "family": r["params"].get("family"),
                                                                "kernels": m.get("kernels")})) if x) + " |")
    return "\n".join(lines)


# ---- seeds and gaps -------------------------------------------------------------------------

def seed_table(b: Board) -> str | None:
    """Models with more than one seed: bits/byte per seed and their difference (None if none)."""
    pairs = {k: runs for k, runs in b.seeds.items() if seed_difference(runs) is not None}
    if not pairs:
        return None
    seeds = sorted({s for runs in pairs.values() for s in runs})
    lines = ["| model | " + " | ".join(f"seed {s}" for s in seeds) + " | difference |",
             "|---" * (len(seeds) + 2) + "|"]
    for runs in pairs.values():
        name = (runs.get(SEED) or next(iter(runs.values())))["name"]
        lines.append(f"| {name} | " + " | ".join(_num(runs.get(s) and bits(runs[s]), "{:.4f}") for s in seeds)
                     + f" | {seed_difference(runs):.4f} |")
    return "\n".join(lines)


def gap(upper: dict, lower: dict, noise: float | None) -> dict:
    """How far `lower` trails `upper` (bits/byte) and whether that exceeds the evaluation noise
    (twice the standard error of the difference) and the seed-to-seed noise (None: unknown)."""
    d = bits(lower) - bits(upper)
    ses = [bits_se(upper), bits_se(lower)]
    two_se = 2 * math.sqrt(sum(s * s for s in ses)) if None not in ses else None
    return {"upper": upper["name"], "lower": lower["name"], "gap": d, "two_se": two_se,
            "beyond_se": None if two_se is None else d > two_se,
            "beyond_seed": None if noise is None else d > noise}


def gaps(b: Board) -> list[dict]:
    rows = [r for r in b.ranked if bits(r) is not None]
    return [gap(u, l, b.noise) for u, l in zip(rows, rows[1:])]


def _yes(v: bool | None) -> str:
    return "-" if v is None else "yes" if v else "no"


def gap_table(b: Board) -> str:
    lines = ["| ahead | behind | gap (bits/byte) | 2 se of the gap | beyond 2 se | beyond seed noise |",
             "|---|---|---|---|---|---|"]
    for g in gaps(b):
        lines.append(f"| {g['upper']} | {g['lower']} | {g['gap']:.4f} | {_num(g['two_se'], '{:.4f}')} | "
                     f"{_yes(g['beyond_se'])} | {_yes(g['beyond_seed'])} |")
    return "\n".join(lines)


# ---- status ---------------------------------------------------------------------------------

def status(bs: list[Board], others: list[tuple[dict, str]]) -> str:
    """Markdown lines: per table what is measured and missing, mixed corpora or GPUs, and the
    pinned train records of neither table."""
    lines = []
    for b in bs:
        n, m = len(b.ranked), len(b.table.runnable)
        second = [f"{runs[min(runs)]['name']} x{len(runs)}" for runs in b.seeds.values() if len(runs) > 1]
        line = f"- **{b.table.title}**: {n} of {m} models measured"
        line += f"; several seeds: {', '.join(second)}" if second else ""
        seed_rows = [lv for lv in b.missing if lv in b.table.levels]
        further = [lv for lv in b.missing if lv not in b.table.levels]
        if seed_rows:
            line += f"; not run yet: {', '.join(seed_rows)}"
        if further:
            line += f"; further variants not run yet: {', '.join(further)}"
        line += "".join(f"; {lv} cannot run at this protocol: {why}" for lv, why in b.table.cannot_run)
        line += "."
        for what, key in (("data files", "data_sha256"), ("GPUs", "gpu")):
            kinds = sorted({str(r.get(key)) for r in b.rows})
            if len(kinds) > 1:
                line += f" Its runs used {len(kinds)} different {what}: {', '.join(kinds)}."
        lines.append(line)
    for row, why in others:
        lines.append(f"- Pinned but in neither table: {row['name']} (run {row['run']}): {why}.")
    return "\n".join(lines)


# ---- CPU demo -------------------------------------------------------------------------------

DEMO = Table("demo", "CPU demo (not a result)",
             2, 8, ("E1", "E0", "E42"), seq=64, minutes=None, lr=3e-3)
DEMO_RUNS = (("E1", SEED), ("E1", SECOND_SEED), ("E0", SEED), ("E42", SEED))


def demo_args(folder: Path, data: Path) -> list[list[str]]:
    """`elman train` arguments of DEMO_RUNS on the CPU (d32 x 2, 60 steps on `data`, a small
    slice) into folder/demo; `demo_board(folder)` reads them back: the page's parts before any
    record is pinned."""
    out = []
    for level, seed in DEMO_RUNS:
        out.append(["--level", level, "--dim", "32", "--depth", str(DEMO.depth), "--batch", str(DEMO.batch),
                    "--seq", str(DEMO.seq), "--lr", str(DEMO.lr), "--warmup", "20", "--steps", "60",
                    "--seed", str(seed), "--log-every", "10", "--val-every", "30", "--val-windows", "16",
                    "--data", str(data), "--device", "cpu", "--name", run_name(level, 32, DEMO.depth, seed),
                    "--runs-dir", str(folder / "demo"), "--checkpoint-dir", str(folder / "checkpoints")])
    return out


def demo_board(folder: Path) -> Board:
    """The board of the demo runs `demo_args(folder, ...)` trained."""
    from ..core import records

    return board(DEMO, training.rows(records.read([folder / "demo"], kind="train")))
