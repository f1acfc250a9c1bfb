"""The diagonal scan's achieved bandwidth against the measured device copy, per step of the
table, at one shape (default B = 64, D = 2048, T = 512, issue 21's committed point: >= 60 %
of the copy forward and backward for every variant).

For each step: the launcher's own width ("auto") and, with --widths, every other width the
shape allows (elements per thread; 16 bytes = 8 bf16 or 4 fp32), forward and backward timed
separately on rotated input sets (as elman bench does), bytes = op.forward_bytes /
op.backward_bytes (inputs read once, outputs and saved states written once). Prints one row a
(step, width) and a verdict line per step for the auto width.

    PYTHONPATH=lib python3 dev/diagonal_bandwidth.py [--B 64 --D 2048 --T 512] [--widths] [--fp32]
"""
from __future__ import annotations

import argparse

import torch

from elman.core.timing import copy_bandwidth, rotation, timeit, warm_up
from elman.families.diagonal import bench, op

TARGET = 60.0


def widths(dtype: torch.dtype, B: int, D: int) -> list[int]:
    most = 16 // torch.empty(0, dtype=dtype).element_size()
    return [v for v in (1, 2, 4, 8) if v <= most and (B * D) % v == 0]


def measure(step: str, B: int, D: int, T: int, dtype: torch.dtype, vec: int, copy_gbs: float,
            reps: int) -> dict:
    info = op.step_info(step)
    per_set = (2 * info["inputs"] + 3) * T * B * D * torch.empty(0, dtype=dtype).element_size()
    n = rotation(per_set)
    fwd, bwd, _, fb, bb = bench._scan_fns(step, T, B, D, n, dtype, vec)
    tf, tb = timeit(fwd, reps, 3, n), timeit(bwd, reps, 3, n)
    plan = op.plan(step, B, D, dtype, vec)
    del fwd, bwd
    torch.cuda.empty_cache()
    f_gbs, b_gbs = fb / (tf["median"] * 1e6), bb / (tb["median"] * 1e6)
    return {"fwd_ms": tf["median"], "bwd_ms": tb["median"], "fwd_gbs": f_gbs, "bwd_gbs": b_gbs,
            "fwd_pct": 100 * f_gbs / copy_gbs, "bwd_pct": 100 * b_gbs / copy_gbs, "plan": plan}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--D", type=int, default=2048)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--widths", action="store_true", help="also time every other allowed width")
    ap.add_argument("--fp32", action="store_true", help="fp32 instead of bf16")
    ap.add_argument("--steps", nargs="*", help="step names (default: the whole table)")
    args = ap.parse_args()
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    B, D, T = args.B, args.D, args.T
    warm_up()
    copy = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth (1 GiB copy, read + written): "
          f"{copy['gbs']:.0f} GB/s")
    print(f"shape: B={B} D={D} T={T} {str(dtype).replace('torch.', '')}; target >= {TARGET:.0f} % "
          f"of the copy, forward and backward")
    print(f"{'step':6} {'width':>6} {'fwd ms':>8} {'fwd GB/s':>9} {'fwd %':>6} {'bwd ms':>8} "
          f"{'bwd GB/s':>9} {'bwd %':>6}  launch fwd / bwd (vec x threads x blocks)")
    verdicts = []
    for step in args.steps or sorted(op.steps(), key=lambda s: op.step_info(s)["id"]):
        chosen = op.plan(step, B, D, dtype)["fwd"]["vec"]
        for vec in [0] + ([v for v in widths(dtype, B, D) if v != chosen] if args.widths else []):
            m = measure(step, B, D, T, dtype, vec, copy["gbs"], args.reps)
            pf, pb = m["plan"]["fwd"], m["plan"]["bwd"]
            launch = (f"{pf['vec']}x{pf['threads']}x{pf['blocks']} / "
                      f"{pb['vec']}x{pb['threads']}x{pb['blocks']}")
            label = "auto" if vec == 0 else str(vec)
            print(f"{step:6} {label:>6} {m['fwd_ms']:8.4f} {m['fwd_gbs']:9.0f} {m['fwd_pct']:6.1f} "
                  f"{m['bwd_ms']:8.4f} {m['bwd_gbs']:9.0f} {m['bwd_pct']:6.1f}  {launch}", flush=True)
            if vec == 0:
                ok = m["fwd_pct"] >= TARGET and m["bwd_pct"] >= TARGET
                verdicts.append((step, ok, m["fwd_pct"], m["bwd_pct"]))
    print()
    for step, ok, f, b in verdicts:
        print(f"{'PASS' if ok else 'MISS'} {step}: forward {f:.1f} %, backward {b:.1f} % of the copy "
              f"(target {TARGET:.0f} %)")
    missed = [s for s, ok, _, _ in verdicts if not ok]
    print(f"summary: {len(verdicts) - len(missed)}/{len(verdicts)} steps at >= {TARGET:.0f} % "
          f"forward and backward" + (f"; below: {', '.join(missed)}" if missed else ""))


if __name__ == "__main__":
    main()
