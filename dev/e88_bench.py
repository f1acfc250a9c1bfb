"""The E88 recurrence at the seed study's 480M shape (B = 16, T = 512, H = 83, n = v = 32, bf16),
every kernel layout the op takes (the warp kernels, fed one step ahead in registers or by their
cp.async input ring, the tiled kernels beside them, the column groups), and the floor numbers
measured on the same GPU: the time to copy the bytes the forward must move (q, k, v, decay in,
o out) and the backward's (q, k, v, decay, d_o in, dq, dk, dv, d decay out). Run by dev/e88_gpu_check.sh; prints a table."""
from __future__ import annotations

import argparse

import torch

from elman.core.timing import timeit, warm_up
from elman.families.matrix import bench, op
from elman.harness import probes


def _copy_ms(nbytes: int) -> float:
    """Milliseconds of a device-to-device copy that reads nbytes / 2 and writes nbytes / 2."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return timeit(lambda i: dst.copy_(src), 30, 5)["median"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=512)
    p.add_argument("--H", type=int, default=83)
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--v", type=int, default=32)
    p.add_argument("--K", type=int, nargs="+", default=[16, 8])
    a = p.parse_args()
    B, T, H, n, v = a.B, a.T, a.H, a.n, a.v
    warm_up()
    moved = bench.traffic_bytes(T, B, H, n, v, False)
    sets = bench._sets(T, B, H, n, v, "scalar", 2, torch.bfloat16)
    print(f"E88 recurrence, B={B} T={T} H={H} n={n} v={v}, bf16 q/k/v, fp32 state and decay")
    print(f"{'layout':<28} {'K':>3} {'fwd ms':>8} {'bwd ms':>8} {'bwd/fwd':>8} {'fwd+bwd':>8} {'peak MB':>8}")
    for K in a.K:
        for group, slots in _layouts(n, v, K):
            rec = _time(sets, T, B, H, n, v, K, group, slots)
            print(f"{bench.impl_name(group, n, v, slots):<28} {K:>3} {rec[0]:8.3f} {rec[1]:8.3f} "
                  f"{rec[1] / rec[0]:8.2f} {rec[2]:8.3f} {rec[3]:8.0f}")
    fwd_copy, bwd_copy = _copy_ms(moved["fwd_bytes"]), _copy_ms(moved["bwd_bytes"])
    print(f"floor, memory: forward moves {moved['fwd_bytes'] / 1e6:.0f} MB -> {fwd_copy:.3f} ms at the measured "
          f"copy bandwidth ({moved['fwd_bytes'] / fwd_copy / 1e6:.0f} GB/s, read + write); backward "
          f"{moved['bwd_bytes'] / 1e6:.0f} MB -> {bwd_copy:.3f} ms")
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    rate = {r["params"]["op"]: r["metrics"]["per_clock_per_sm"] for r in probes.throughput_records()}
    print("measured issue rates per SM per clock: " + ", ".join(f"{k} {v:.1f}" for k, v in rate.items()))
    tanh = B * H * T * n * v
    print(f"floor, tanh: {tanh / 1e6:.0f} M tanh.approx a pass at {rate['tanh_approx']:.1f} a clock per SM x {sm} "
          f"SMs = {tanh / (rate['tanh_approx'] * sm) / 1e3:.0f} k clocks (ms = that / SM clock in kHz); forward "
          "one pass, backward one more when slots >= K, plus (K / slots - 1) / 2 passes when fewer")
    print(f"floor, FP32 issue: forward ~3, backward ~13 FMA-pipe ops a state element a step at "
          f"{rate['fma']:.0f} a clock per SM = {tanh * 16 / (rate['fma'] * sm) / 1e3:.0f} k clocks for forward + backward")


def _layouts(n: int, v: int, K: int) -> list[tuple[int, int]]:
    """(group, slots): the default; the warp kernels with K slots (one recompute a chunk) and with
    K / 4; the same fed by the cp.async ring with automatic slots, K and K / 4; the tiled kernels
    with their automatic slots and K / 4; the column groups."""
    out = [(0, 0)]
    if op.warp(n, v):
        out += [(op.WARP, K), (op.WARP, max(1, K // 4))]
        out += [(op.RING, 0), (op.RING, K), (op.RING, max(1, K // 4))]
    if op.TILED in op.layouts(n, v):
        out += [(op.TILED, 0), (op.TILED, max(1, K // 4))]
    return out + [(op.COLUMNS, 0)]


def _time(sets, T, B, H, n, v, K, group, slots):
    step = "tanh"
    ckpts = [op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)[2] for s in sets]

    def fwd(i):
        s = sets[i]
        op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)

    def bwd(i):
        s = sets[i]
        op.backward(s["q"], s["k"], s["v"], s["decay"], None, ckpts[i], s["d_o"], s["d_ST"], step, K, group, slots)

    def both(i):
        s = sets[i]
        ck = op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)[2]
        op.backward(s["q"], s["k"], s["v"], s["decay"], None, ck, s["d_o"], s["d_ST"], step, K, group, slots)

    tf, tb, tfb = (timeit(f, 30, 3, len(sets))["median"] for f in (fwd, bwd, both))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    both(0)
    torch.cuda.synchronize()
    return tf, tb, tfb, (torch.cuda.max_memory_allocated() - base) / 2**20


if __name__ == "__main__":
    main()
