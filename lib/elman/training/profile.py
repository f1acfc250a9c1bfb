"""Where a training step's time goes: one LadderLM training step as the trainer runs it (its own
model and optimizer, bf16 autocast, clipping, schedule-free AdamW; `step.TrainStep`) split
three ways, in one of three modes and two setups.

- By phase, with CUDA events over `steps` back-to-back steps (one host wait at the end):
  forward, backward, gradient clipping, optimizer step; tokens/s over the whole run.
- By kernel, with torch.profiler over one step: the GPU time of every kernel, grouped into
  categories by name (the recurrence's own kernels, the spectral norm's matrix-vector
  products, GEMMs, normalisation, copies and casts, elementwise work and reductions, the
  rest), the largest kernels by name, and the step time no kernel covers (`idle_ms`: launch
  gaps and host waits).
- By host op, with a dispatch mode over one eager step: the aten ops each phase issues, how
  many of them copy (copy_, _to_copy, clone) and the megabytes those copies write.
Besides, the spectral normalisation's forward alone (`spectral_forward_ms`: every layer's
parametrised W_h under autocast, as the forward computes it, its buffers put back).

Modes: `trainer` reads the loss and gradient norm on the host once the optimizer step is
queued, as `elman train` does every step to stop at a non-finite step (one host wait a step); `lean` reads nothing; `graph` replays forward, backward and clipping from a CUDA
graph (`TrainStep(graph=True)`), the optimizer outside it, and reads nothing;
`trainer-graph` is the graph with the trainer's read, the step `elman train --graph` takes.

Setups: `after` is the model as `elman train` builds it: a time-major residual stream
(`LadderLM.time_major`), each layer's input made contiguous once (`RecurrentLayer.time_major`),
the spectral norm in fp32 with one power iteration per training step (`core.spectral`),
schedule-free AdamW's update fused (`optim`). `before` turns those off: a batch-major stream,
whose layers transpose their input and output (the input GEMMs copy the strided input, the
norms and the output GEMM's backward copy the strided output), the spectral norm's three
iterations per forward under autocast (bf16 matrix-vector products, W cast for each), and the
library's ten foreach passes a step. Both run in one call, so one GPU run compares them.

Records: one of kind 'bench', measure 'lm_profile', per configuration, setup and mode. params:
measure, dim, depth, expansion, B, T, dtype, options, n_params, mode, setup, steps. metrics:
phase_ms (median per phase and `step`), tokens_per_s (over the timed run),
tokens_per_s_median_step, kernel_ms_by_category, kernel_ms_total, idle_ms,
spectral_forward_ms, largest_kernels_ms ([name, ms] pairs), host_ops ({phase: {ops, copies,
copy_mb}}), peak_mem_mb, kernel_paths and kernels (the path every layer's forward ran and
each family's backward, `paths.PathProbe`, taken on the first pass: in graph mode, the capture).
With --record, a configuration that fails writes a record of measure 'lm_profile_failed' (the
same params as far as they are known: level, dim, depth, expansion, B, T, options, mode, setup,
norm; metrics: error), so that a preflight's failure is read from the run like its results.
`python -m elman.training.profile --level E1 --dim 1280 --depth 6 --batch 64` prints the
breakdown; `--preset issue20` runs issue 20's four configurations (E0, E1, E42 at d1280 x 6,
B 64, T 512; E1 at d640, expansion 2, depth 20, B 32) in every setup and mode; `--norm elman
fused` compares add + RMSNorm implementations (`lm.NORMS`; params: norm); `--jobs FILE` runs
the configuration of every `elman train` line of a job file, the check before a round of
10-minute runs (does every row capture in a graph, which kernels does it run, how fast).
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import records
from ..core.layer import RecurrentLayer
from ..core.spectral import spectral_weights
from . import lm, memory, paths, sched, train
from .optim import AdamWScheduleFree
from .step import TrainStep, loss_of

MODES = ("trainer", "lean", "graph", "trainer-graph")
SETUPS = ("before", "after")
COPY_OPS = ("copy_", "_to_copy", "clone")  # .contiguous(), .to() and casts dispatch to these
# (level, dim, depth, expansion, batch): issue 20's configurations, T = 512.
PRESETS = {"issue20": (("E0", 1280, 6, 1.0, 64), ("E1", 1280, 6, 1.0, 64), ("E42", 1280, 6, 1.0, 64),
                       ("E1", 640, 20, 2.0, 32))}

# First match wins; names are CUDA kernel names as the profiler reports them. Every kernel this
# project compiles is in namespace elman::; cuBLAS runs its nvjet kernels on Hopper; the only
# matrix-vector products of a step are the spectral norm's power iterations.
CATEGORIES = (
    ("recurrence", re.compile(r"\belman::|persistent|grid_step|scan_(forward|backward)|recurrence|tiled|"
                              r"warp_(forward|backward)|gated_|matrix_|dense_step|lowrank|tape", re.I)),
    ("spectral norm (gemv, dot)", re.compile(r"gemv|dot_kernel", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|sm90_|cublas|ampere_|Kernel2", re.I)),
    ("optimizer (fused)", re.compile(r"_sf_adamw")),  # optim.AdamWScheduleFree's kernel
    ("torch.compile", re.compile(r"^triton_(poi|per|red|tem)_")),  # Inductor's kernels
    ("norm", re.compile(r"rms|layer_norm", re.I)),  # the add + RMSNorm (Triton or PyTorch)
    ("copy and cast", re.compile(r"copy|cast|convert|memcpy|memset|fill|to_copy", re.I)),
    ("elementwise and reductions", re.compile(r"elementwise|vectorized|reduce|unrolled|foreach|"
                                              r"softmax|cross_entropy|nll|tanh|sigmoid|silu|mul|add", re.I)),
)


def category(kernel: str) -> str:
    for name, pattern in CATEGORIES:
        if pattern.search(kernel):
            return name
    return "other"


def _phases(marks: list, mode: str) -> dict[str, float]:
    """Phase times (ms) of one step from its marks (TrainStep's: eager start, forward,
    backward, clip, optimizer; graph start, replay, optimizer)."""
    names = ("forward+backward+clip", "optimizer") if _graph(mode) else \
        ("forward", "backward", "clip", "optimizer")
    out = {n: a.elapsed_time(b) for n, a, b in zip(names, marks, marks[1:])}
    out["step"] = marks[0].elapsed_time(marks[-1])
    return out


def _graph(mode: str) -> bool:
    return mode.endswith("graph")


def _run(step: TrainStep, data: torch.Tensor, mode: str, marks: list | None = None):
    loss, gnorm = step(data, marks)
    step.update(marks)
    if mode.startswith("trainer"):  # the trainer's per-step host read, after it queues the update
        torch.stack([loss.float(), gnorm.float()]).tolist()
    return loss


def apply_setup(model: torch.nn.Module, opt: AdamWScheduleFree, setup: str) -> None:
    """Put a model and optimizer that `train.build` made into a profile setup (SETUPS; module
    docstring)."""
    if setup not in SETUPS:
        raise ValueError(f"setup must be one of {SETUPS}, got {setup!r}")
    if setup == "after":
        return
    opt.fused = False
    model.time_major = False
    for m in model.modules():
        if isinstance(m, RecurrentLayer):
            m.contiguous_input = False
    for w in spectral_weights(model):
        w.step_iterations, w.fp32 = None, False


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched while active (`phase` names where they go), the copies
    among them and the megabytes the copies write."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.counts: dict[str, dict[str, float]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        c = self.counts.setdefault(self.phase, {"ops": 0, "copies": 0, "copy_mb": 0.0})
        c["ops"] += 1
        if func.overloadpacket.__name__ in COPY_OPS:
            c["copies"] += 1
            if isinstance(out, torch.Tensor):
                c["copy_mb"] += out.numel() * out.element_size() / 2 ** 20
        return out


def host_ops(step: TrainStep, data: torch.Tensor) -> dict[str, dict[str, float]]:
    """The aten ops of one eager training step by phase (forward, backward, clip, optimizer;
    `OpCount`). A graph-mode step replays these ops' kernels; this runs them eagerly once more
    (the graph's gradient tensors are overwritten by its next replay)."""
    counter = OpCount()
    with counter:
        with step._amp(data.device.type):
            loss = loss_of(step.forward, data)
        counter.phase = "backward"
        loss.backward()
        counter.phase = "clip"
        torch.nn.utils.clip_grad_norm_(step.params, step.clip)
        counter.phase = "optimizer"
        step.update()
    return counter.counts


def spectral_forward_ms(model: torch.nn.Module, reps: int = 20) -> float:
    """The spectral normalisation's forward per training step (ms): every spectrally
    normalised recurrent weight evaluated once under bf16 autocast with gradient, as the
    forward does; the power-iteration vectors are put back afterwards. 0 when there are none."""
    weights = spectral_weights(model)
    if not weights:
        return 0.0
    saved = [w.u.clone() for w in weights]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for w in weights:
            w()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            for w in weights:
                w()
        end.record()
    end.synchronize()
    with torch.no_grad():
        for w, u in zip(weights, saved):
            w.u.copy_(u)
    return start.elapsed_time(end) / reps


def lm_profile_record(level: str, dim: int, depth: int, expansion: float = 1.0, batch: int = 64,
                      seq: int = 512, options: dict | None = None, steps: int = 10, top: int = 15,
                      mode: str = "trainer", setup: str = "after", norm: str = "auto") -> dict:
    """Warm up two steps, time `steps` back-to-back steps by phase, then profile one step by
    kernel and count one step's host ops, in `mode` (MODES) and `setup` (SETUPS)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if setup not in SETUPS:
        raise ValueError(f"setup must be one of {SETUPS}, got {setup!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("lm_profile_record profiles GPU kernels: it needs a CUDA device")
    model, opt, data, cfg = memory.setup(level, dim, depth, expansion, batch, seq, options, norm)
    apply_setup(model, opt, setup)
    step = TrainStep(model, opt, cfg["grad_clip"], graph=_graph(mode))
    probe = paths.PathProbe(model)  # the first (eager) pass: in graph mode, before the capture
    try:
        _run(step, data, mode)
        kernel_paths = probe.result()
    finally:
        probe.close()
    _run(step, data, mode)
    runs = [[] for _ in range(steps)]
    for marks in runs:
        _run(step, data, mode, marks)
    runs[-1][-1].synchronize()
    phases = [_phases(m, mode) for m in runs]
    median = {k: sorted(p[k] for p in phases)[len(phases) // 2] for k in phases[0]}
    total_ms = runs[0][0].elapsed_time(runs[-1][-1])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _run(step, data, mode)
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
    kernel_total = sum(kernels.values())
    params = memory.step_params("lm_profile", model, cfg, options)
    params.update(mode=mode, setup=setup, steps=steps, norm=model.norm, level=level,
                  family=model.entry.family)
    peak = torch.cuda.max_memory_allocated() / 2 ** 20
    rec = records.make("bench", model.level, f"lm:{model.backend}", params,
                       {"phase_ms": median, "tokens_per_s": batch * seq * steps / (total_ms / 1000),
                        "tokens_per_s_median_step": batch * seq / (median["step"] / 1000),
                        "kernel_ms_by_category": by_category, "kernel_ms_total": kernel_total,
                        "idle_ms": max(median["step"] - kernel_total, 0.0),
                        "spectral_forward_ms": spectral_forward_ms(model),
                        "largest_kernels_ms": largest, "host_ops": host_ops(step, data),
                        "peak_mem_mb": peak, "kernel_paths": kernel_paths,
                        "kernels": paths.summary(kernel_paths)})
    del step, model, opt
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return rec


def failure_record(level: str, dim: int, depth: int, expansion: float, batch: int, seq: int,
                   options: dict, mode: str, setup: str, norm: str, exc: BaseException) -> dict:
    """The record of a configuration that raised `exc` before it was profiled."""
    params = {"measure": "lm_profile_failed", "level": level, "dim": dim, "depth": depth,
              "expansion": expansion, "B": batch, "T": seq, "options": options, "mode": mode,
              "setup": setup, "norm": norm}
    return records.make("bench", level, "lm", params, {"error": f"{type(exc).__name__}: {exc}"})


def summary(rec: dict) -> str:
    m, p = rec["metrics"], rec["params"]
    mode = f", mode {p['mode']}" if "mode" in p else ""
    mode += f", setup {p['setup']}" if "setup" in p else ""
    lines = [f"{rec['variant']} d{p['dim']} x {p['depth']} e {p['expansion']}, B {p['B']}, T {p['T']}{mode}: "
             f"{m['phase_ms']['step']:.1f} ms a step, {m['tokens_per_s']:,.0f} tokens/s",
             "phases (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in m["phase_ms"].items() if k != "step")]
    if "kernels" in m:
        lines.append(f"kernel paths: {m['kernels']}")
    if "idle_ms" in m:
        lines.append(f"GPU idle in a step {m['idle_ms']:.2f} ms; spectral norm forward "
                     f"{m['spectral_forward_ms']:.2f} ms a step")
    if "host_ops" in m:
        lines.append("host ops of an eager step (ops / copies / MB copied): " + ", ".join(
            f"{ph} {c['ops']:.0f} / {c['copies']:.0f} / {c['copy_mb']:.0f}" for ph, c in m["host_ops"].items()))
    lines.append(f"GPU kernel time by category (ms, of {m['kernel_ms_total']:.2f}):")
    for name, ms in sorted(m["kernel_ms_by_category"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:28s} {ms:8.2f}  {100 * ms / max(m['kernel_ms_total'], 1e-9):5.1f} %")
    lines.append("largest kernels (ms):")
    lines += [f"  {ms:8.2f}  {name[:110]}" for name, ms in m["largest_kernels_ms"]]
    return "\n".join(lines)


def comparison(recs: list[dict]) -> str:
    """A table with one row per record (configuration and mode): tokens/s, step and phase
    times, idle time and the kernel time of each category."""
    cats = [name for name, _ in CATEGORIES] + ["other"]
    head = ["level", "d x L (e)", "B", "norm", "setup", "mode", "tokens/s", "step ms", "fwd", "bwd", "clip",
            "opt", "idle", "SN fwd", "copies", "copy MB", *cats, "kernels"]
    rows = []
    for r in recs:
        m, p, ph = r["metrics"], r["params"], r["metrics"]["phase_ms"]
        fused = ph.get("forward+backward+clip")  # graph mode: one replay
        split = ([f"{ph[k]:.2f}" for k in ("forward", "backward", "clip")] if fused is None
                 else [f"{fused:.2f} (all)", "", ""])
        ops = m.get("host_ops", {}).values()
        rows.append([r["variant"], f"{p['dim']} x {p['depth']} ({p['expansion']:g})", str(p["B"]),
                     p.get("norm", "fused"), p.get("setup", "-"), p.get("mode", "-"), f"{m['tokens_per_s']:,.0f}",
                     f"{ph['step']:.2f}", *split, f"{ph['optimizer']:.2f}", f"{m.get('idle_ms', 0.0):.2f}",
                     f"{m.get('spectral_forward_ms', 0.0):.2f}",
                     f"{sum(c['copies'] for c in ops):.0f}" if ops else "-",
                     f"{sum(c['copy_mb'] for c in ops):.0f}" if ops else "-",
                     *(f"{m['kernel_ms_by_category'].get(c, 0.0):.2f}" for c in cats), m.get("kernels", "-")])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*row) for row in rows)])


def job_configs(path: Path) -> list[tuple]:
    """(level, dim, depth, expansion, batch, seq, options) of every `elman train` job of a job
    file (read as `elman sched` reads it), each configured as the trainer configures it
    (`train.config`; the checkpoint a resume would read is not looked for)."""
    parser = argparse.ArgumentParser(prog=f"{path} line", add_help=False)
    train.add_arguments(parser)
    out = []
    for job in sched.read_jobs(path, Path(path).parent):
        words = shlex.split(job.command, comments=True)
        if words[1:4] != ["-m", "elman", "train"]:
            continue
        args = parser.parse_args(words[4:])
        args.resume = None
        c = train.config(args)
        out.append((c["level"], c["dim"], c["depth"], c["expansion"], c["batch"], c["seq"],
                    train.parse_options(c["option"])))
    if not out:
        raise ValueError(f"{path} holds no `python3 -m elman train` line")
    return out


def configs(args: argparse.Namespace) -> list[tuple]:
    """(level, dim, depth, expansion, batch, seq, options) of each configuration to run."""
    options = train.parse_options(args.option)
    if args.jobs:  # each model once: jobs that differ only in seed step the same model
        out = []
        for c in (c for path in args.jobs for c in job_configs(path)):
            if c not in out:
                out.append(c)
        return out
    if args.preset:
        return [(*c, args.seq, options) for c in PRESETS[args.preset]]
    return [(args.level, args.dim, args.depth, args.expansion, args.batch, args.seq, options)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--level", default="E1")
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--expansion", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--preset", choices=sorted(PRESETS), help="run a preset's configurations instead")
    p.add_argument("--jobs", nargs="+", type=Path, metavar="FILE",
                   help="run the configuration of every `elman train` line of these job files instead "
                        "(a check before a round of runs: paths, capture, tokens/s)")
    p.add_argument("--mode", nargs="+", choices=MODES, default=list(MODES),
                   help=f"step modes to run (default all: {' '.join(MODES)})")
    p.add_argument("--setup", nargs="+", choices=SETUPS, default=list(SETUPS),
                   help="setups to run (default both: before after)")
    p.add_argument("--norm", nargs="+", choices=lm.NORMS, default=["auto"],
                   help="add + RMSNorm implementations to run (default auto: fused on CUDA)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration and mode")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--brief", action="store_true", help="print only the comparison table")
    p.add_argument("--record", action="store_true", help="also write the records into the run folder")
    args = p.parse_args(argv)
    recs, failed = [], []
    runs = [(c, norm, setup, mode) for c in configs(args) for norm in args.norm for setup in args.setup
            for mode in args.mode]
    for (level, dim, depth, expansion, batch, seq, options), norm, setup, mode in runs:
        try:
            rec = lm_profile_record(level, dim, depth, expansion, batch, seq, options,
                                    steps=args.steps, mode=mode, setup=setup, norm=norm)
        except Exception as exc:  # one configuration's failure (e.g. a capture) must not end the rest
            name = f"{level} d{dim} x {depth} e {expansion:g} B {batch}" + (f" {norm}" if norm != "auto" else "")
            failed.append(f"{name} {setup} {mode}: {type(exc).__name__}: {exc}")
            print(f"FAILED {failed[-1]}", flush=True)
            if args.record:
                records.write([failure_record(level, dim, depth, expansion, batch, seq, options,
                                              mode, setup, norm, exc)])
            torch.cuda.empty_cache()
            continue
        recs.append(rec)
        if not args.brief:
            print(summary(rec), "\n", flush=True)
        if args.record:
            records.write([rec])
    if recs:
        print(comparison(recs))
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
