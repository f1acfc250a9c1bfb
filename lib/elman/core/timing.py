"""How every benchmark times (DESIGN.md "Benchmarks"): CUDA events around each repetition,
warm-up first, the median of many repetitions with p20/p80, inputs rotated over enough sets
that the L2 cache does not serve them, and the GPU's clocks out of idle before timing."""
from __future__ import annotations

import statistics
from functools import lru_cache
from typing import Callable

import torch

T_DEFAULT = 512  # the benchmarks' sequence length
COPY_BYTES = 1 << 30  # the tensor `copy_bandwidth` copies: 1 GiB, far beyond the L2


def timeit(fn: Callable[[int], None], reps: int = 30, warmup: int = 5, rotate: int = 1) -> dict:
    """Median / p20 / p80 milliseconds of fn(i) over `reps` calls, i cycling over `rotate`
    input sets, each call between its own pair of CUDA events."""
    for i in range(warmup):
        fn(i % rotate)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i % rotate)
        ends[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    q = statistics.quantiles(ms, n=5) if len(ms) >= 5 else [ms[0]] * 4
    return {"median": statistics.median(ms), "p20": q[0], "p80": q[3], "reps": reps}


def rotation(bytes_per_set: int, l2_bytes: int | None = None) -> int:
    """How many input sets to rotate so that together they exceed twice the L2 cache."""
    l2 = l2_bytes or torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(64, -(-2 * l2 // max(1, bytes_per_set))))


def warm_up(seconds: float = 0.5) -> None:
    """Keep the GPU busy for a moment so that its clocks leave the idle state."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > 1000 * seconds:
            return


def layer_timings(layer: torch.nn.Module, B: int, T: int, d: int, dtype: torch.dtype,
                  reps: int, sets: int) -> tuple[dict, dict, float]:
    """A layer's forward (no grad) and forward + backward on [B, T, d] inputs under autocast to
    `dtype`, rotated over `sets` input sets, and the peak memory (MiB) of one forward + backward
    above what was allocated before it: (forward, forward + backward, peak)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    ys = [torch.randn(B, T, d, device="cuda", generator=g).requires_grad_() for _ in range(sets)]
    grad = torch.randn(B, T, d, device="cuda", dtype=dtype, generator=g)
    autocast = torch.autocast("cuda", dtype=dtype)

    def fwd(i):
        with torch.no_grad(), autocast:
            layer(ys[i])

    def fwdbwd(i):
        with autocast:
            out, _ = layer(ys[i])
        out.backward(grad.to(out.dtype))

    tf = timeit(fwd, reps, 3, sets)
    fwdbwd(0)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwdbwd(1 % sets)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return tf, timeit(fwdbwd, reps, 3, sets), peak


@lru_cache(maxsize=1)
def copy_bandwidth(reps: int = 20) -> dict:
    """The device copy bandwidth in GB/s (1e9 bytes/s): a 1 GiB bf16 tensor copied into
    another, bytes read plus written over the median time. {"gbs", "ms", "bytes"}."""
    src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = timeit(lambda i: dst.copy_(src), reps, 3, 1)
    del src, dst
    torch.cuda.empty_cache()
    return {"gbs": 2 * COPY_BYTES / (t["median"] * 1e6), "ms": t, "bytes": 2 * COPY_BYTES}
