"""The E88 recurrence at the seed study's 480M shape (B = 16, T = 512, H = 83, n = v = 32, bf16)
on every kernel layout the op takes, each also with the backward's slots set (K: one recompute a
chunk; K / 4), and the floor measured on the same GPU (elman.families.matrix.bench: the copy
bandwidth, the tanh.approx and FMA issue rates, the SM clock). The chapter times the layouts at
their automatic slots; this sweeps the slots beside them. Run by dev/e88_gpu_check.sh; prints
tables."""
from __future__ import annotations

import argparse

import torch

from elman.core.timing import warm_up
from elman.families.matrix import bench, op
from elman.harness import probes


def _layouts(n: int, v: int, K: int) -> list[tuple[int, int]]:
    """(group, slots): every layout at its automatic slots; the warp kernels, their ring and the
    tiled kernels also with K slots and with K / 4."""
    out = []
    for g in bench.layouts(n, v):
        out.append((g, 0))
        if g != op.COLUMNS:
            out += [(g, K), (g, max(1, K // 4))]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=512)
    p.add_argument("--D", type=int, default=1920)
    p.add_argument("--H", type=int, default=83)
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--v", type=int, default=32)
    p.add_argument("--K", type=int, nargs="+", default=[16, 8])
    a = p.parse_args()
    warm_up()
    sets = bench._sets(a.T, a.B, a.H, a.n, a.v, "scalar", 2, torch.bfloat16)
    print(f"E88 recurrence, B={a.B} T={a.T} H={a.H} n={a.n} v={a.v}, bf16 q/k/v, fp32 state and decay")
    recs = [bench.recurrence_record("E88", sets, a.D, K, g, slots) for K in a.K for g, slots in _layouts(a.n, a.v, K)]
    print(bench.recurrence_table(recs))
    recs += probes.floor_records()
    print(bench.primitive_lines(recs))
    print(bench.floor_table(recs))


if __name__ == "__main__":
    main()
