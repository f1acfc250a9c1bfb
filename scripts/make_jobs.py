"""Write the job files of the leaderboard's tables (the 10-minute protocol, one model a GPU, the
same windows in the same order): every row sized by `elman dims` to the table's parameter
count, so that no width is typed in.

    python scripts/make_jobs.py 50m  > scripts/train_50m.jobs
    python scripts/make_jobs.py 100m > scripts/train_100m.jobs
    python scripts/make_jobs.py 100m --seed 43 --levels E1 E68 > second_seeds.jobs

The 50M table: E1 at d1280 x 6 sets the count; every other row at depth 6 takes the width whose
count is closest, except E42, which the seed study ran at d1536 x 6; batch 64. The 100M table:
depth 20, expansion 2 for the recurrent layers (llama and mamba2 at 1, fla-gdn at 2 in both
tables), batch 32, the width whose count is
closest to 100M. Runs read the packed default corpus and resume from their checkpoint when the
same file runs again (`--resume auto`).
"""
from __future__ import annotations

import argparse
import sys

from elman.training import dims

DATA = ".cache/data/debian-mix-1200M.txt.xz"
TABLES = {
    "50m": dict(depth=6, batch=64, anchor=("E1", 1280, 1.0), fixed={"E42": 1536},
                levels=["E1", "E0", "E33", "E34", "E36", "E37v2", "E39", "E42", "mamba2", "fla-gdn", "llama"]),
    "100m": dict(depth=20, batch=32, target=100_000_000, expansion=2.0,
                 levels=["fla-gdn", "mamba2", "E68", "E67", "E1", "E42", "E56", "E65", "E64", "llama",
                         "E61", "E63", "E62", "E66", "E88d_h12", "E75"]),
}
# Expansions that do not follow the table's: llama and mamba2 at 1 (mamba2's block has its own
# expand of 2; llama's FFN sets its width), fla-gdn at FLA's default expand_v of 2 everywhere.
OWN_EXPANSION = {"llama": 1.0, "mamba2": 1.0, "fla-gdn": 2.0}


def jobs(table: str, levels: list[str] | None, seed: int, minutes: int) -> list[str]:
    spec = TABLES[table]
    depth = spec["depth"]
    if "anchor" in spec:
        level, dim, e = spec["anchor"]
        target = dims.count(level, dim, depth, e)
    else:
        target = spec["target"]
    out = [f"# {table} table: {len(levels or spec['levels'])} runs of {minutes} minutes, seed {seed}, "
           f"depth {depth}, batch {spec['batch']}, about {target / 1e6:.1f}M parameters (elman dims)"]
    for level in levels or spec["levels"]:
        e = OWN_EXPANSION.get(level, spec.get("expansion", 1.0))
        dim = spec.get("fixed", {}).get(level) or dims.width_for(level, target, depth, e)
        n = dims.count(level, dim, depth, e)
        name = f"{level}_d{dim}x{depth}" + (f"_s{seed}" if seed != 42 else "")
        out.append(f"# {level}: {n:,} parameters")
        out.append(f"python3 -m elman train --level {level} --dim {dim} --depth {depth} --expansion {e} "
                   f"--batch {spec['batch']} --seq 512 --lr 3e-4 --seed {seed} --minutes {minutes} "
                   f"--data {DATA} --name {name} --resume auto")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", choices=sorted(TABLES))
    p.add_argument("--levels", nargs="*", help="only these rows (default: the table's)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--minutes", type=int, default=10)
    args = p.parse_args()
    print("\n".join(jobs(args.table, args.levels, args.seed, args.minutes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
