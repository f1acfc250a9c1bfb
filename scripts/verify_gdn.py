"""Verify the fla-gdn path on the GPU before any timing is recorded.

For each chunk_bwd_dqkwg mode (see elman.baselines.gdn), dtype and shape of
gdn.VERIFY_SHAPES (T = 512, B 4-16; D = 512, 1024, 2048 with their head counts and value
width 2 K as in training; D = 1024 with value width K, as `elman bench` runs the layer) it
runs FLA's chunked Gated DeltaNet exactly as the layer calls it, forward and backward,
against FLA's own naive recurrent reference, and prints the relative error of the output,
the final state and every gradient (q, k, v, the gate and beta logits, A_log, dt_bias, the
initial state).

    python scripts/verify_gdn.py                      # modes auto and triton-unguarded
    python scripts/verify_gdn.py --modes auto triton --dtypes bfloat16

("triton" runs FLA unchanged, which on Hopper with Triton < 3.7.1 refuses the backward.)

The first mode (default "auto", the one the layer uses) decides the exit status: 0 when
every one of its rows passed, 1 when one failed, 2 without a GPU. Its rows are written as
parity records of fla-gdn to the current run (`elman.records.run_dir()`), and every row of
every mode to verify_gdn.json beside them, which the Baselines chapter reads.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from elman.core import records
from elman.baselines import gdn
from elman.results import baselines as report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="*", default=list(gdn.VERIFY_MODES), choices=gdn.DQKWG_MODES)
    p.add_argument("--dtypes", nargs="*", default=list(gdn.VERIFY_DTYPES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true", help="print only; write nothing to runs/")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("verify_gdn: no CUDA device; the check runs on a GPU only")
        return 2
    gdn.fla()
    print(f"GPU {torch.cuda.get_device_name()}, {report.versions()}")
    print(f"FLA refuses its gated Triton chunk_bwd_dqkwg here: {gdn.fla_refuses()}")
    rows = gdn.verify(dtypes=args.dtypes, modes=args.modes, seed=args.seed)
    print(report.verify_table(rows))
    chosen = [r for r in rows if r["mode"] == args.modes[0]]
    if not args.no_record:
        recs = [records.make("parity", "fla-gdn", r["impl"],
                             {"T": r["T"], "B": r["B"], "D": r["D"], "expansion": r["expansion"],
                              "dtype": r["dtype"], "seed": r["seed"], "check": "verify_gdn"},
                             {k: r[k] for k in ("errors", "max_fwd", "max_bwd", "tol_fwd", "tol_bwd",
                                                "passed", "torch_dqkwg_calls", "error") if k in r})
                for r in chosen]
        if recs:
            print(f"records: {records.write(recs)}")
        out = records.run_dir() / report.VERIFY_FILE
        out.write_text(json.dumps({"env": records.env(), "rows": rows}, indent=1, sort_keys=True))
        print(f"all rows: {out}")
    failed = [r for r in chosen if not r["passed"]]
    print(f"{len(chosen) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not chosen else 0


if __name__ == "__main__":
    sys.exit(main())
