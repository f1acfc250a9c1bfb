"""E63 on the GPU in one command (H100, under 3 minutes once the dense extension is built):

    python3 -c "from elman.core import extension; extension.load('dense')"
    .venv/bin/python dev/e63_gpu_check.py

1. runs tests/test_e63_gpu.py (the persistent path of E63a/b/d against the epilogue's schedule
   at D in {256, 1024} with B in {1, 64} and odd T, and on the grid design at D = 2048, B = 4,
   forward and backward; persistent against graph; the registry's parity on every path the op
   lists, bf16 and fp32 (graph, steps); the layers; bad operands);
2. prints the per-step forward latency of the persistent path for E63, E63b, E63d beside E1's
   (the tanh_silu_gate epilogue) at (B, D) = (4, 1024) and (64, 1024), T = 256, bf16: the median
   of 20 launches on preallocated buffers divided by T, and the ratio to E1.
Exits non-zero if a test fails.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
T, REPS = 256, 20


def _median_us(fn) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def per_step_forward(B: int, D: int) -> dict[str, float]:
    """Microseconds a step of the persistent forward, E1 and E63 a, b, d."""
    from elman.families.dense import delta, op
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, device="cuda", generator=g)).to(torch.bfloat16)
    w_h = rand(D, D, scale=0.5 / D ** 0.5)
    h0 = rand(B, D, scale=0.3)
    out, h_all = torch.empty(T, B, D, **kw), torch.empty(T + 1, B, D, **kw)
    wx, z, b = rand(T, B, D), rand(T, B, D), rand(D, scale=0.1)
    res = {"E1": _median_us(lambda: op.forward_into("persistent", "tanh_silu_gate", wx, [z], w_h, b,
                                                    h0, out, h_all)) / T}
    v_all = torch.empty(T, B, D, **kw)
    for name, mode in (("E63", "a"), ("E63b", "b"), ("E63d", "d")):
        planes = rand(delta.CHANNELS[mode], T, B, D)
        res[name] = _median_us(lambda: delta.persistent_forward_into(mode, planes, w_h, h0, out,
                                                                     h_all, v_all)) / T
    return res


def main() -> int:
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-x", "tests/test_e63_gpu.py"],
                         cwd=ROOT)
    print(f"\nper-step forward, persistent path, bf16, T = {T} (us a step; ratio to E1)")
    for B, D in ((4, 1024), (64, 1024)):
        res = per_step_forward(B, D)
        e1 = res["E1"]
        cells = "  ".join(f"{k} {v:.3f} ({v / e1:.2f}x)" for k, v in res.items())
        print(f"B={B:3d} D={D}: {cells}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
