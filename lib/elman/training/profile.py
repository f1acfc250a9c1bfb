"""Where a training step's time goes: one LadderLM training step as the trainer runs it (its own
model and optimizer, bf16 autocast, clipping, schedule-free AdamW) split two ways.

- By phase, with CUDA events: forward, backward, gradient clipping, optimizer step.
- By kernel, with torch.profiler: the GPU time of every kernel, grouped into categories by
  name (the recurrence's own kernels, GEMMs, normalisation, elementwise and reductions,
  copies and casts, the rest), and the largest kernels by name.

One record of kind 'bench', measure 'lm_profile'. `python -m elman.training.profile --level E1
--dim 1280 --depth 6 --batch 64` prints the breakdown (issue 20: E1 d1280 x 6 at B 64, T 512).
"""
from __future__ import annotations

import argparse
import re
import sys

import torch

from ..core import records
from . import memory, train

# First match wins; names are CUDA kernel names as the profiler reports them. Every kernel this
# project compiles is in namespace elman::; cuBLAS runs its nvjet kernels on Hopper.
CATEGORIES = (
    ("recurrence", re.compile(r"\belman::|persistent|grid_step|scan_(forward|backward)|recurrence|tiled|"
                              r"warp_(forward|backward)|gated_|matrix_|dense_step|lowrank|tape", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|sm90_|cublas|ampere_|Kernel2", re.I)),
    ("norm", re.compile(r"norm|rms", re.I)),
    ("copy and cast", re.compile(r"copy|cast|convert|memcpy|memset|fill|to_copy", re.I)),
    ("elementwise and reductions", re.compile(r"elementwise|vectorized|reduce|unrolled|foreach|"
                                              r"softmax|cross_entropy|nll|tanh|sigmoid|silu|mul|add", re.I)),
)


def category(kernel: str) -> str:
    for name, pattern in CATEGORIES:
        if pattern.search(kernel):
            return name
    return "other"


def lm_profile_record(level: str, dim: int, depth: int, expansion: float = 1.0, batch: int = 64,
                      seq: int = 512, options: dict | None = None, steps: int = 5, top: int = 15) -> dict:
    """Warm up two steps, time `steps` steps by phase, then profile one step by kernel."""
    if not torch.cuda.is_available():
        raise RuntimeError("lm_profile_record profiles GPU kernels: it needs a CUDA device")
    model, opt, data, cfg = memory.setup(level, dim, depth, expansion, batch, seq, options)
    clip = cfg["grad_clip"]
    for _ in range(2):
        memory.train_step(model, opt, data, clip)
    phases = {"forward": [], "backward": [], "clip": [], "optimizer": [], "step": []}
    for _ in range(steps):
        marks: list = []
        memory.train_step(model, opt, data, clip, marks)
        marks[-1].synchronize()
        for name, a, b in zip(("forward", "backward", "clip", "optimizer"), marks, marks[1:]):
            phases[name].append(a.elapsed_time(b))
        phases["step"].append(marks[0].elapsed_time(marks[-1]))
    median = {k: sorted(v)[len(v) // 2] for k, v in phases.items()}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        memory.train_step(model, opt, data, clip)
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.device_type != torch.autograd.DeviceType.CUDA:  # kernels, copies and fills only
            continue
        us = evt.device_time_total
        if us > 0 and evt.key:
            kernels[evt.key] = kernels.get(evt.key, 0.0) + us / 1000
    by_category: dict[str, float] = {}
    for name, ms in kernels.items():
        by_category[category(name)] = by_category.get(category(name), 0.0) + ms
    largest = sorted(kernels.items(), key=lambda kv: -kv[1])[:top]
    return records.make("bench", model.level, f"lm:{model.backend}",
                        memory.step_params("lm_profile", model, cfg, options),
                        {"phase_ms": median, "tokens_per_s": batch * seq / (median["step"] / 1000),
                         "kernel_ms_by_category": by_category, "kernel_ms_total": sum(kernels.values()),
                         "largest_kernels_ms": largest})


def summary(rec: dict) -> str:
    m, p = rec["metrics"], rec["params"]
    lines = [f"{rec['variant']} d{p['dim']} x {p['depth']} e {p['expansion']}, B {p['B']}, T {p['T']}: "
             f"{m['phase_ms']['step']:.1f} ms a step, {m['tokens_per_s']:,.0f} tokens/s",
             "phases (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in m["phase_ms"].items() if k != "step"),
             f"GPU kernel time by category (ms, of {m['kernel_ms_total']:.2f}):"]
    for name, ms in sorted(m["kernel_ms_by_category"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:28s} {ms:8.2f}  {100 * ms / max(m['kernel_ms_total'], 1e-9):5.1f} %")
    lines.append("largest kernels (ms):")
    lines += [f"  {ms:8.2f}  {name[:110]}" for name, ms in m["largest_kernels_ms"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--level", default="E1")
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--expansion", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--record", action="store_true", help="also write the record into the run folder")
    args = p.parse_args(argv)
    rec = lm_profile_record(args.level, args.dim, args.depth, args.expansion, args.batch, args.seq,
                            train.parse_options(args.option))
    print(summary(rec))
    if args.record:
        records.write([rec])
    return 0


if __name__ == "__main__":
    sys.exit(main())
