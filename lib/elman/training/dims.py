"""`elman dims`: parameter counts of LadderLM models by instantiating them (on the meta
device, so nothing is allocated), and the 128-aligned width that reaches a target.

    elman dims --level E1 --params 50M --depth 6
    elman dims --level E1 --dim 1280 --depth 6 --json

The width search takes the smallest multiple of 128 whose count reaches the target,
unless the multiple below it is closer (VARIANTS.md 5.5, counted, not estimated).
"""
from __future__ import annotations

import argparse
import json

import torch

from .lm import LadderLM, n_params
from .train import parse_options

ALIGN = 128
MAX_DIM = 16384


def count(level: str, dim: int, depth: int, expansion: float = 1.0, **options) -> int:
    """Parameters of LadderLM(level, dim, depth, expansion, **options), tied embedding once."""
    with torch.device("meta"):
        model = LadderLM(level, dim, depth, expansion, backend="reference", norm="torch", **options)
    return n_params(model)


def width_for(level: str, target: int, depth: int, expansion: float = 1.0, **options) -> int:
    """The 128-aligned width whose parameter count is closest to target (ties go up)."""
    lo, hi = 1, MAX_DIM // ALIGN
    if count(level, hi * ALIGN, depth, expansion, **options) < target:
        raise ValueError(f"{level} at depth {depth} does not reach {target:,} parameters "
                         f"below width {MAX_DIM}")
    while lo < hi:  # smallest multiple of 128 whose count reaches the target
        mid = (lo + hi) // 2
        if count(level, mid * ALIGN, depth, expansion, **options) >= target:
            hi = mid
        else:
            lo = mid + 1
    d = lo * ALIGN
    if d > ALIGN:
        above = count(level, d, depth, expansion, **options) - target
        below = target - count(level, d - ALIGN, depth, expansion, **options)
        if below < above:
            d -= ALIGN
    return d


def parse_count(text: str) -> int:
    """'50M', '1.3B', '500K' or a plain integer."""
    units = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
    t = text.strip().upper()
    return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(float(t))


def table(level: str, depth: int, expansion: float, dims: list[int], target: int | None,
          **options) -> list[dict]:
    out = []
    for d in dims:
        n = count(level, d, depth, expansion, **options)
        row = {"level": level, "dim": d, "depth": depth, "expansion": expansion, "params": n}
        if target:
            row["vs_target"] = n / target - 1
        out.append(row)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--level", required=True, help="registered level, e.g. E1")
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--expansion", type=float, default=1.0)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--params", help="target count, e.g. 50M: find the 128-aligned width")
    g.add_argument("--dim", type=int, help="count this width")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="layer option, repeatable")
    p.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    options = parse_options(args.option)
    target = parse_count(args.params) if args.params else None
    try:
        if target:
            d = width_for(args.level, target, args.depth, args.expansion, **options)
            dims = [x for x in (d - ALIGN, d, d + ALIGN) if x > 0]
        else:
            d, dims = args.dim, [args.dim]
        rows = table(args.level, args.depth, args.expansion, dims, target, **options)
    except (KeyError, ValueError, TypeError) as exc:
        print(f"elman dims: {exc}")
        return 1
    for r in rows:
        r["chosen"] = r["dim"] == d
    if args.json:
        print(json.dumps(rows if target else rows[0], indent=2))
        return 0
    print(f"{'level':>8} {'dim':>6} {'depth':>5} {'exp':>5} {'params':>14}" + (f" {'vs target':>10}" if target else ""))
    for r in rows:
        line = f"{r['level']:>8} {r['dim']:>6} {r['depth']:>5} {r['expansion']:>5g} {r['params']:>14,}"
        if target:
            line += f" {r['vs_target']:>+10.2%}"
        print(line + ("  <-" if r["chosen"] and target else ""))
    return 0
