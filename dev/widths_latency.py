"""Per-step forward latency of the dense persistent path against the graph path at every
multiple of 128 from 256 to 2048 (E1's epilogue, bf16), with issue 20's committed numbers:

    python dev/widths_latency.py [--T 256] [--reps 15] [--batches 4 16 64 128]

For each (B, D) it times the raw forward on preallocated buffers (`op.forward_into`, the
median of `reps` launches after three warm-ups, divided by T) on the persistent path where
`op.persistent_size` takes the size and on the graph path (elman.core.timing.timeit), and prints one row per D: the
design, persistent and graph microseconds a step for each B. Then PASS / MISS lines: at no
width is the persistent step slower than at D = 2048 for the same B (B <= 64, where D = 2048
runs persistent); at D = 1280 it is <= 1.5 us at B <= 16 and <= 2.5 us at B = 64. Then the
wide forward at D = 1280 forced to 8 and to 12 batch columns a cluster (op.WIDE_COLUMNS_ENV)
at B = 64 and 128, side by side with the columns the plan takes unforced. Writes the table as
JSON with --json PATH (the side-by-side rows under "wide_columns"). With --trace, last: where a step of the traced persistent
forward spends its time (CTA 0's phase clocks, elman.harness.probes.trace_record; builds the
development extension) at D = 1024 (cluster design) and 1280 (wide design), B = 4 and 16.
Exits 0 (the MISS lines are the verdict).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lib"))

from elman.core.timing import timeit, warm_up  # noqa: E402
from elman.families.dense import op  # noqa: E402

WIDTHS = list(range(256, 2049, 128))
EPILOGUE = "tanh_silu_gate"


def per_step(path: str, T: int, B: int, D: int, reps: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, device="cuda", generator=g)).to(torch.bfloat16)
    w_h, h0 = rand(D, D, scale=0.5 / D ** 0.5), rand(B, D, scale=0.3)
    wx, z, b = rand(T, B, D), rand(T, B, D), rand(D, scale=0.1)
    out, h_all = torch.empty(T, B, D, **kw), torch.empty(T + 1, B, D, **kw)
    ms = timeit(lambda _: op.forward_into(path, EPILOGUE, wx, [z], w_h, b, h0, out, h_all),
                reps=reps, warmup=3)["median"]
    return ms * 1e3 / T


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 16, 64, 128])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--trace", action="store_true", help="phase breakdown at D = 1024 and 1280")
    a = ap.parse_args()
    table: dict[int, dict[int, dict[str, float | None]]] = {}
    warm_up()
    print(f"per-step forward, {EPILOGUE}, bf16, T = {a.T} (us a step: persistent / graph)")
    print(f"{'D':>5} {'design':8} " + " ".join(f"{'B=' + str(B):>15}" for B in a.batches))
    for D in WIDTHS:
        table[D] = {}
        cells = []
        for B in a.batches:
            ok = op.persistent_size(B, D)[0] and op.plan(B, D, torch.bfloat16) == "persistent"
            p = per_step("persistent", a.T, B, D, a.reps) if ok else None
            gr = per_step("graph", a.T, B, D, a.reps)
            table[D][B] = {"persistent": p, "graph": gr}
            cells.append(f"{(f'{p:.2f}' if p is not None else '-'):>6} / {gr:6.2f}")
        print(f"{D:5d} {op.persistent_design(D):8} " + " ".join(f"{c:>15}" for c in cells),
              flush=True)
    misses = 0
    for B in a.batches:
        ref = table[2048][B]["persistent"]
        if ref is None:
            continue
        slower = [D for D in WIDTHS if table[D][B]["persistent"] is not None
                  and table[D][B]["persistent"] > ref]
        verdict = "PASS" if not slower else "MISS"
        misses += verdict == "MISS"
        print(f"{verdict} B={B}: no width slower than D=2048 ({ref:.2f} us)"
              + (f"; slower at D={slower}" if slower else ""))
    for B, limit in ((4, 1.5), (16, 1.5), (64, 2.5)):
        if B not in table[1280]:
            continue
        p = table[1280][B]["persistent"]
        verdict = "PASS" if p is not None and p <= limit else "MISS"
        misses += verdict == "MISS"
        shown = f"{p:.2f}" if p is not None else "not persistent"
        print(f"{verdict} D=1280 B={B}: {shown} us <= {limit} us")
    print(f"{misses} MISS")
    columns = wide_columns(a.T, a.reps)
    if a.json:
        record = {str(D): {str(B): v for B, v in row.items()} for D, row in table.items()}
        record["wide_columns"] = columns
        a.json.write_text(json.dumps(record, indent=1))
    if a.trace:
        trace()
    return 0


def wide_columns(T: int, reps: int, batches=(64, 128)) -> dict[str, dict[str, float]]:
    """The wide forward (D = 1280) forced to 8 and to 12 batch columns a cluster, us a step,
    with the plan's unforced choice: {B: {"8": us, "12": us, "auto": bc}}."""
    ext, eid = op._ext(), op.epilogue_id(EPILOGUE)
    rows: dict[str, dict[str, float]] = {}
    print("wide forward at D=1280 by batch columns a cluster (us a step; clusters, max at once)")
    for B in batches:
        row: dict[str, float] = {"auto": ext.persistent_plan(B, 1280, False, eid)["bc"]}
        cells = []
        for bc in (8, 12):
            os.environ[op.WIDE_COLUMNS_ENV] = str(bc)
            try:
                plan = ext.persistent_plan(B, 1280, False, eid)
                row[str(bc)] = per_step("persistent", T, B, 1280, reps)
            finally:
                del os.environ[op.WIDE_COLUMNS_ENV]
            cells.append(f"{bc:2d} columns {row[str(bc)]:.2f} ({plan['clusters']}, "
                         f"{plan['max_active_clusters']})")
        rows[str(B)] = row
        print(f"B={B:4d}: " + " | ".join(cells) + f" | unforced: {row['auto']} columns",
              flush=True)
    return rows


def trace() -> None:
    """Phase breakdown of a persistent forward step (ns, medians over the steady state)."""
    from elman import registry
    from elman.harness import probes
    e1 = registry.get("E1")
    print("traced forward step, E1 (ns): " + ", ".join(probes.TRACE_PHASES))
    for D in (1024, 1280):
        for B in (4, 16):
            r = probes.trace_record(e1, B, D, T=256)
            if r is None:
                print(f"D={D} B={B}: not persistent")
                continue
            m = r["metrics"]
            print(f"D={D:5d} B={B:3d} {op.persistent_design(D):8} step {m['step_ns']:6.0f} | "
                  + " ".join(f"{v:6.0f}" for v in m["phase_ns"].values()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
