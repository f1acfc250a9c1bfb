"""Write the job files of the leaderboard's tables (the 10-minute protocol, one model a GPU, the
same windows in the same order): every row sized by `elman dims` to the table's parameter
count, so that no width is typed in. The tables' rows, depth, batch and corpus are
`elman.results.leaderboard.TABLES`, which the Leaderboard chapter reads records by.

    python scripts/make_jobs.py 50m  > scripts/train_50m.jobs
    python scripts/make_jobs.py 100m > scripts/train_100m.jobs
    python scripts/make_jobs.py 100m --top 5 runs/<run> > second_seeds.jobs
    python scripts/make_jobs.py 50m --missing > next.jobs

A table's file runs every row of the seed study at seed 42, then E1 again at seed 43, then the
table's further rows (the 100M table: every other registered variant, GRU and LSTM) at seed 42,
but none for a row the table says cannot run at its protocol (E14 at 100M). Once the first seeds have
run, `--top K` reads their records (the given run folders, else the chapter's pinned runs),
ranks the table by validation loss and writes seed-43 jobs for the first K models that have
no seed-43 run yet (E1's is in the table's file). `--missing` writes the jobs the table still
needs: every row with no run at seed 42 and E1 at seed 43 unless it ran, from the same records
(a session's job file once runs are pinned). `--levels` and `--seed` write any subset.

The 50M table: E1 at d1280 x 6 sets the count; every other row at depth 6 takes the width whose
count is closest, except E42, which the seed study ran at d1536 x 6; batch 64. The 100M table:
depth 20, expansion 2 for the recurrent layers (llama and mamba2 at 1, fla-gdn at 2 in both
tables), batch 32, the width whose count is closest to 100M. Every run replays its forward,
backward and clipping from a CUDA graph (`--graph`: the eager step's arithmetic without its
launch gaps, so no row trains faster than another for want of it), reads the packed default
corpus and resumes from its checkpoint when the same file runs again (`--resume auto`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from elman.core import records
from elman.results import leaderboard, pins, training
from elman.training import dims

SIZING = {
    "50m": dict(anchor=("E1", 1280, 1.0), fixed={"E42": 1536}),
    "100m": dict(target=100_000_000, expansion=2.0),
}
# Expansions that do not follow the table's: llama and mamba2 at 1 (mamba2's block has its own
# expand of 2; llama's FFN sets its width), fla-gdn at FLA's default expand_v of 2 everywhere.
OWN_EXPANSION = {"llama": 1.0, "mamba2": 1.0, "fla-gdn": 2.0}
ALWAYS_SECOND = ("E1",)  # the levels whose second seed is in the table's job file


def jobs(table: str, levels: list[str] | None, seed: int, minutes: int) -> list[str]:
    spec, size = leaderboard.TABLES[table], SIZING[table]
    levels = list(levels or spec.levels)
    if "anchor" in size:
        level, dim, e = size["anchor"]
        target = dims.count(level, dim, spec.depth, e)
    else:
        target = size["target"]
    lr = f"{spec.lr:.0e}".replace("e-0", "e-")  # 3e-4
    out = [f"# {table} table: {len(levels)} run{'s' * (len(levels) != 1)} of {minutes} minutes, seed {seed}, "
           f"depth {spec.depth}, batch {spec.batch}, about {target / 1e6:.1f}M parameters (elman dims)"]
    for level in levels:
        e = OWN_EXPANSION.get(level, size.get("expansion", 1.0))
        dim = size.get("fixed", {}).get(level) or dims.width_for(level, target, spec.depth, e)
        n = dims.count(level, dim, spec.depth, e)
        out.append(f"# {level}: {n:,} parameters")
        out.append(f"python3 -m elman train --level {level} --dim {dim} --depth {spec.depth} --expansion {e} "
                   f"--batch {spec.batch} --seq {spec.seq} --lr {lr} --seed {seed} --minutes {minutes} --graph "
                   f"--data {leaderboard.DATA} --name {leaderboard.run_name(level, dim, spec.depth, seed)} "
                   f"--resume auto")
    return out


def table_jobs(table: str, minutes: int = 10) -> list[str]:
    """The table's job file: the seed study's rows at the protocol's seed, ALWAYS_SECOND at the
    second, then the further rows."""
    t = leaderboard.TABLES[table]
    further = [lv for lv in t.runnable if lv not in t.levels]
    return (jobs(table, None, leaderboard.SEED, minutes)
            + jobs(table, list(ALWAYS_SECOND), leaderboard.SECOND_SEED, minutes)
            + (jobs(table, further, leaderboard.SEED, minutes) if further else []))


def second_seeds(table: str, rows: list[dict], k: int, minutes: int = 10) -> list[str]:
    """Seed-43 jobs for the first k models of the table's ranking (from `training.rows`) that
    have no seed-43 run and are not in the table's file already."""
    b = {x.table.key: x for x in leaderboard.boards(rows)[0]}[table]
    done = {runs[leaderboard.SEED]["level"].lower() for runs in b.seeds.values()
            if leaderboard.SEED in runs and leaderboard.SECOND_SEED in runs}
    skip = done | {lv.lower() for lv in ALWAYS_SECOND}
    levels = [lv for lv in leaderboard.top_levels(b, k) if lv.lower() not in skip]
    if not levels:
        return [f"# {table} table: no second seed to add among the first {k} of {len(b.ranked)} ranked models"]
    return jobs(table, levels, leaderboard.SECOND_SEED, minutes)


def missing_jobs(table: str, rows: list[dict], minutes: int = 10) -> list[str]:
    """The table's jobs with no run in `rows` (from `training.rows`): the rows missing at the
    protocol's seed, then ALWAYS_SECOND at the second seed where it has no run, then the further
    rows with no run."""
    b = {x.table.key: x for x in leaderboard.boards(rows)[0]}[table]
    ran = {(r["level"].lower(), r.get("seed")) for r in b.rows}
    first = [lv for lv in b.table.levels if (lv.lower(), leaderboard.SEED) not in ran]
    second = [lv for lv in ALWAYS_SECOND if (lv.lower(), leaderboard.SECOND_SEED) not in ran]
    further = [lv for lv in b.table.runnable if lv not in b.table.levels and (lv.lower(), leaderboard.SEED) not in ran]
    lines = (jobs(table, first, leaderboard.SEED, minutes) if first else []) + \
        (jobs(table, second, leaderboard.SECOND_SEED, minutes) if second else []) + \
        (jobs(table, further, leaderboard.SEED, minutes) if further else [])
    return lines or [f"# {table} table: every row has its runs"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", choices=sorted(leaderboard.TABLES))
    p.add_argument("--levels", nargs="*", help="only these rows (default: the table's file)")
    p.add_argument("--seed", type=int, default=leaderboard.SEED)
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--top", type=int, metavar="K", help="second-seed jobs for the first K ranked models")
    p.add_argument("--missing", action="store_true", help="the jobs of rows with no run yet")
    p.add_argument("runs", nargs="*", type=Path,
                   help="with --top or --missing: run folders (default: the chapter's pins)")
    args = p.parse_args()
    if args.top or args.missing:
        rows = training.rows(records.read(args.runs or pins.runs("leaderboard"), kind="train"))
        lines = (second_seeds(args.table, rows, args.top, args.minutes) if args.top
                 else missing_jobs(args.table, rows, args.minutes))
    elif args.levels or args.seed != leaderboard.SEED:
        lines = jobs(args.table, args.levels, args.seed, args.minutes)
    else:
        lines = table_jobs(args.table, args.minutes)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
