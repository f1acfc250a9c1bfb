"""`elman warm`: compile the baselines' Triton kernels in parallel before anything is timed.

mamba2 (mamba-ssm's SSD scan and gated norm) and fla-gdn (flash-linear-attention's chunked
Gated DeltaNet, short convolution, norms) run Triton kernels under `triton.autotune`. The
first call at a new specialisation compiles every config of every such kernel, one after
the other, in the calling process: on the GPU host (16 cores) the GPU tests spent nine
minutes on one core doing that. A kernel is compiled once per (specialisation, config) and
the binary goes into Triton's on-disk cache ($TRITON_CACHE_DIR, default ~/.triton/cache)
under a key that does not depend on the process. The specialisation is the kernel's
constexpr arguments, its tensors' dtypes and, for integer arguments not marked
`do_not_specialize`, whether they equal 1 or are multiples of 16. Read off both libraries
(Triton's own argument binder, run on the CPU over these calls): every one of B, T and D
reaches it. FLA makes the head count H and the widths K, V constexpr (so every D, and the
value width that the expansion sets, is its own set of kernels), B constexpr in its chunk
cumsum and the number of row blocks (from B T) constexpr in its norms; mamba-ssm passes
batch, length and head counts as specialised integers (B = 4 differs from B = 16 in 12 of
20 kernels) and ceil(B T / SMs) rows per program to its norm backward (B = 16 and 64
differ there). So the jobs are exactly the later stages' calls (`jobs`), deduplicated.

`elman warm` runs those calls in N worker processes. Worker i patches
`triton.runtime.autotuner.Autotuner` (FLA's `CachedAutotuner` subclasses it and overrides
only `run`, which first looks up FLA's own config files, FLA_CACHE_MODE, exactly as in the
process that times) so that each autotuned kernel keeps only worker i's share of its
configs (`share`: config i mod n where a kernel has n <= N configs, else configs i, i + N,
...) and runs each once, timing nothing: together the workers compile every config once,
in parallel. Workers start at different jobs (worker i at job i J / N), so that a config
two workers share is mostly compiled by one and read from the disk cache by the other, and
so that the largest inputs are not all alive at once. Workers never persist autotuning
results (their timings would mean nothing on a shared GPU): the autotuner's disk cache is
off in them (TRITON_CACHE_AUTOTUNING=0, FLA_CACHE_RESULTS=0, which FLA 0.6.0 otherwise
turns on, and `cache_results` cleared on every autotuner). The process that times
afterwards autotunes as usual and finds every config compiled.

    elman warm                      # every group, one worker per CPU (at most 16)
    elman warm --groups verify parity bench -j 16
    elman warm --dry-run            # the jobs, nothing run
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch

from .. import registry
from ..core.entry import Shape
from ..baselines import gdn
from . import bench
from .parity import DTYPES

LEVELS = ("mamba2", "fla-gdn")                   # the baselines that run Triton kernels
GROUPS = ("verify", "parity", "bench", "chapters", "e88", "tests")
MAX_WORKERS = 16
UNGUARDED = "triton-unguarded"
# The calls of the stages that are not in the registry: the Baselines chapter's layer check
# (fp32, no autocast) and the GPU tests' layers (tests/test_baselines_gpu.py).
CHAPTER_LAYER = (512, 4, 512, 1.0)               # (T, B, D, expansion)
# The E88 chapter's bf16 layers: mamba2 and fla-gdn beside the 480M E88 (B = 16, d = 1920) and
# fla-gdn at its training-step shape (d = 1792, e = 2), as (T, B, D, expansion, levels).
E88_CHAPTER_LAYERS = ((512, 16, 1920, 1.0, LEVELS), (512, 16, 1792, 2.0, ("fla-gdn",)))
TEST_LAYER = (100, 2, 256, 2.0)
TEST_GDN_PARITY = (130, 2, 256)
OOM_RETRIES = 4
WORKER_GIB = 12  # GPU memory one worker may need (the largest jobs held up to 10 GiB)
PROTOCOL = re.compile(r"(ok|FAIL) (\d+) ([\d.]+)(?: (.*))?")  # a worker's line per finished job


@dataclass(frozen=True)
class Job:
    """One call the later stages make, run forward and backward in every worker.

    call "layer": `entry.layer(D, expansion, backend="cuda")` on y [B, T, D] (fp32), under
    autocast to `dtype` unless it is float32, first under no_grad (as `elman bench` times
    the forward), then forward + backward. call "parity": the fast path of each of the
    entry's parity cases at (T, B, D, expansion) with its inputs in `dtype` and a random
    upstream gradient, as `elman parity` and scripts/verify_gdn.py run it. `mode` is fla-gdn's
    chunk_bwd_dqkwg mode (None: the environment's, as `elman parity` runs); "triton-unguarded"
    runs every kernel the other modes run and FLA's Triton chunk_bwd_dqkwg besides."""

    call: str
    level: str
    dtype: str
    T: int
    B: int
    D: int
    expansion: float = 1.0
    mode: str | None = None
    groups: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        return (self.call, self.level, self.dtype, self.T, self.B, self.D, self.expansion)

    @property
    def size(self) -> int:
        return self.B * self.T * self.D

    def __str__(self) -> str:
        extra = (f" e={self.expansion:g}" if self.expansion != 1.0 else "") + \
            (f" dqkwg={self.mode}" if self.mode else "")
        return (f"{self.call:<6} {self.level:<7} {self.dtype:<8} T={self.T:<3} B={self.B:<2} "
                f"D={self.D:<4}{extra} [{','.join(self.groups)}]")


def _group_jobs(group: str, levels: tuple[str, ...]) -> list[Job]:
    """The calls of one group of later stages, for the given levels."""
    out: list[Job] = []
    for level in levels:
        if group == "bench":        # `elman bench`: layer_record at every (B, D), T = 512, bf16
            out += [Job("layer", level, "bfloat16", bench.T_DEFAULT, B, D)
                    for D in bench.SHAPES_D for B in bench.SHAPES_B]
        elif group == "parity":     # `elman parity`: the registry's test shapes and dtypes
            e = registry.get(level)
            out += [Job("parity", level, dt, T, B, D, default_expansion(e))
                    for dt in e.dtypes for T, B, D in ((s.T, s.B, s.D) for s in e.test_shapes)]
        elif group == "verify" and level == "fla-gdn":   # scripts/verify_gdn.py's defaults
            mode = UNGUARDED if UNGUARDED in gdn.VERIFY_MODES else None
            out += [Job("parity", level, dt, T, B, D, e, mode=mode)
                    for dt in gdn.VERIFY_DTYPES for T, B, D, e in gdn.VERIFY_SHAPES]
        elif group == "chapters":   # the Baselines chapter's layer check on the GPU (fp32)
            T, B, D, e = CHAPTER_LAYER
            out.append(Job("layer", level, "float32", T, B, D, e))
        elif group == "e88":        # the E88 chapter's layers beside its flagship
            out += [Job("layer", level, "bfloat16", *shape) for *shape, of in E88_CHAPTER_LAYERS if level in of]
        elif group == "tests":      # tests/test_baselines_gpu.py outside its parity tests
            T, B, D, e = TEST_LAYER
            out += [Job("layer", level, "float32", T, B, D, e),
                    Job("layer", level, "bfloat16", bench.T_DEFAULT, 4, 512)]
            if level == "fla-gdn":
                out.append(Job("parity", level, "bfloat16", *TEST_GDN_PARITY,
                               default_expansion(registry.get(level))))
    return [replace(j, groups=(group,)) for j in out]


def default_expansion(entry: registry.Entry) -> float:
    """The expansion an entry's parity builder uses when `elman parity` calls it."""
    return inspect.signature(entry.parity).parameters["expansion"].default


def jobs(groups: tuple[str, ...] | list[str] = GROUPS, levels: tuple[str, ...] | list[str] = LEVELS) -> list[Job]:
    """The distinct calls of the given groups, smallest first: a call that two groups make
    is one job (with both groups), and a call in mode "triton-unguarded" stands for the
    same call in the other modes."""
    merged: dict[tuple, Job] = {}
    for group in dict.fromkeys(groups):
        if group not in GROUPS:
            raise ValueError(f"unknown group {group!r}; groups: {', '.join(GROUPS)}")
        for j in _group_jobs(group, tuple(levels)):
            old = merged.get(j.key)
            if old is None:
                merged[j.key] = j
            else:
                mode = UNGUARDED if UNGUARDED in (old.mode, j.mode) else old.mode
                merged[j.key] = replace(old, mode=mode, groups=tuple(dict.fromkeys(old.groups + j.groups)))
    return sorted(merged.values(), key=lambda j: (j.size, j.key))


# ---- the worker's share of every autotuned kernel ------------------------------------------
def share(configs: list, i: int, n: int) -> list:
    """Worker i of n: configs i, i + n, i + 2n, ... of a kernel's (pruned) list; where the
    kernel has no more configs than workers, config i mod len(configs), so that every
    worker runs the kernel (the calls after it need its output)."""
    return list(configs[i::n]) or [configs[i % len(configs)]]


def run_once(kernel_call, quantiles=None) -> list[float]:
    """The worker's benchmarker: compile and launch the config once, report no time."""
    kernel_call()
    return [0.0, 0.0, 0.0]


@contextlib.contextmanager
def worker_share(i: int, n: int) -> Iterator[None]:
    """Within: every `triton.autotune`d kernel autotunes over worker i's share of its
    configs only, runs each config once instead of timing it, and writes no autotune
    results to disk. A share that does not fit the GPU (compile errors that the autotuner
    would time as inf) falls back to the kernel's full list for that call. The Autotuner
    class is as it was afterwards."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime import autotuner
    from triton.runtime.errors import OutOfResources, PTXASError

    cls = autotuner.Autotuner
    saved = {name: cls.__dict__[name] for name in ("prune_configs", "do_bench", "run")}
    prune, run = saved["prune_configs"], saved["run"]

    def prune_configs(self, kwargs):
        self.cache_results = False
        pruned = prune(self, kwargs)
        return pruned if getattr(self, "_elman_full", False) else share(pruned, i, n)

    def run_share(self, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        except (OutOfResources, PTXASError, CompileTimeAssertionFailure):
            self.cache.clear()
            self._elman_full = True
            try:
                return run(self, *args, **kwargs)
            finally:
                del self._elman_full

    cls.prune_configs, cls.run = prune_configs, run_share
    cls.do_bench = property(lambda self: run_once)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cls, name, value)


# ---- running a job ----------------------------------------------------------------------------
def run_job(job: Job, device: str = "cuda") -> None:
    """The job's calls, forward and backward, nothing timed or compared."""
    entry = registry.get(job.level)
    dt = DTYPES[job.dtype]
    with gdn.dqkwg(job.mode) if job.mode else contextlib.nullcontext():
        if job.call == "layer":
            torch.manual_seed(0)
            layer = entry.layer(job.D, job.expansion, backend="cuda").to(device)
            y = torch.randn(job.B, job.T, job.D, device=device, requires_grad=True)
            autocast = torch.autocast(torch.device(device).type, dtype=dt, enabled=dt != torch.float32)
            with torch.no_grad(), autocast:
                layer(y)
            with autocast:
                out, _ = layer(y)
            out.backward(torch.randn_like(out))
        else:
            generator = torch.Generator(device=device).manual_seed(0)
            for case in entry.parity(Shape(job.T, job.B, job.D), dt, device, generator, expansion=job.expansion):
                inputs = {k: v.detach().to(dt).requires_grad_(v.requires_grad) for k, v in case.inputs.items()}
                outs = case.fast(**inputs)
                torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says the GPU's memory ran out: PyTorch's own error, or the RuntimeError
    that Triton (`Triton Error [CUDA]: out of memory`) or cuBLAS (`CUBLAS_STATUS_ALLOC_FAILED`)
    raise when another worker holds the memory."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "ALLOC_FAILED" in text)


def _run_with_retries(job: Job) -> None:
    """Out of memory (the other workers hold theirs): free, wait a moment, again."""
    for attempt in range(OOM_RETRIES + 1):
        try:
            return run_job(job)
        except RuntimeError as exc:
            if not out_of_memory(exc) or attempt == OOM_RETRIES:
                raise
            torch.cuda.empty_cache()
            time.sleep(random.uniform(2, 8))
        finally:
            torch.cuda.empty_cache()


def worker(i: int, n: int, todo: list[Job], report) -> int:
    """Worker i of n: every job, starting at job i * len / n, under `worker_share`; one
    protocol line per job on `report` ("ok|FAIL <job index> <seconds> [error]")."""
    failed = 0
    start = i * len(todo) // n
    with worker_share(i, n):
        for k in range(len(todo)):
            index = (start + k) % len(todo)
            t0 = time.perf_counter()
            try:
                _run_with_retries(todo[index])
            except Exception as exc:  # noqa: BLE001  (reported, then the next job)
                failed += 1
                traceback.print_exc()
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                print(f"FAIL {index} {time.perf_counter() - t0:.1f} {type(exc).__name__}: {first}",
                      file=report, flush=True)
                if "CUDA error" in str(exc):  # the context is gone: nothing more will run
                    return 1
            else:
                print(f"ok {index} {time.perf_counter() - t0:.1f}", file=report, flush=True)
    return 1 if failed else 0


def _worker_main(i: int, n: int, todo: list[Job]) -> int:
    # protocol lines on the real stdout; whatever the libraries print goes to stderr
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return worker(i, n, todo, report)


# ---- the parent --------------------------------------------------------------------------------
def worker_env() -> dict[str, str]:
    """The workers' environment: the parent's, with autotune results never written."""
    return {**os.environ, "TRITON_CACHE_AUTOTUNING": "0", "FLA_CACHE_RESULTS": "0",
            "TRITON_PRINT_AUTOTUNING": "0", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def worker_command(i: int, n: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "elman", "warm", "--worker", str(i), "-j", str(n),
            "--groups", *args.groups, "--levels", *args.levels]


def _tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join("    " + line for line in text[-lines:])


def run_workers(n: int, todo: list[Job], args: argparse.Namespace, log_dir: Path) -> int:
    """Start n workers, print a line per finished (worker, job) and a bar; wait for all.
    Returns the number of workers that failed (each reported with its stderr tail)."""
    from tqdm import tqdm

    events: queue.Queue = queue.Queue()
    procs, logs = [], []
    for i in range(n):
        logs.append(log_dir / f"worker{i:02d}.log")
        with open(logs[i], "w") as err:
            procs.append(subprocess.Popen(worker_command(i, n, args), stdout=subprocess.PIPE,
                                          stderr=err, text=True, env=worker_env()))

    def read(i: int) -> None:
        for line in procs[i].stdout:
            events.put((i, line.rstrip("\n")))
        events.put((i, None))

    for i in range(n):
        threading.Thread(target=read, args=(i,), daemon=True).start()
    bar = tqdm(total=n * len(todo), desc="warm", unit="job", file=sys.stdout)
    open_pipes = n
    while open_pipes:
        i, line = events.get()
        if line is None:
            open_pipes -= 1
            continue
        m = PROTOCOL.fullmatch(line)
        if not m:
            continue
        status, index, seconds, error = m.groups()
        note = "" if status == "ok" else f"  FAILED: {error}"
        bar.write(f"[warm] worker {i:2d} {todo[int(index)]}: {float(seconds):6.1f} s{note}")
        bar.update(1)
    bar.close()
    failed = 0
    for i, p in enumerate(procs):
        if p.wait() != 0:
            failed += 1
            print(f"elman warm: worker {i} exited with {p.returncode}; the end of {logs[i]}:\n{_tail(logs[i])}")
    return failed


def default_workers() -> int:
    """The CPUs, at most MAX_WORKERS, and at most one per WORKER_GIB of GPU memory: on the
    H100 (80 GB) 16 workers ran out of memory at B=64, D=2048, where one worker held up to
    10 GiB."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = min(MAX_WORKERS, cpus)
    if torch.cuda.is_available():
        n = min(n, int(torch.cuda.get_device_properties(0).total_memory / 2**30 // WORKER_GIB))
    return max(1, n)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--jobs", type=int, default=default_workers(),
                   help=f"worker processes (default: the CPUs, at most {MAX_WORKERS} and one per "
                        f"{WORKER_GIB} GiB of GPU memory)")
    p.add_argument("--groups", nargs="+", default=list(GROUPS), choices=GROUPS,
                   help="the later stages to compile for: verify (scripts/verify_gdn.py), parity "
                        "(elman parity), bench (elman bench), chapters (the Baselines chapter), e88 (the "
                        "E88 chapter), "
                        "tests (tests/test_baselines_gpu.py); default all")
    p.add_argument("--levels", nargs="+", default=list(LEVELS), choices=LEVELS)
    p.add_argument("--dry-run", action="store_true", help="list the jobs and run nothing")
    p.add_argument("--log-dir", type=Path, help="the workers' stderr (default: a temporary folder)")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    todo = jobs(args.groups, args.levels)
    n = max(1, args.jobs)
    if args.worker is not None:
        return _worker_main(args.worker, n, todo)
    cache = os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    print(f"elman warm: {len(todo)} jobs ({', '.join(args.groups)}) in {n} workers; "
          f"Triton cache {cache}")
    if args.dry_run:
        for k, j in enumerate(todo):
            print(f"  {k:3d}  {j}")
        return 0
    if not torch.cuda.is_available():
        print("elman warm: no CUDA device; Triton kernels are compiled for a GPU only")
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="elman-warm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    failed = run_workers(n, todo, args, log_dir)
    print(f"elman warm: {n * len(todo)} (worker, job) runs in {time.perf_counter() - t0:.0f} s; "
          f"{failed} workers failed; logs in {log_dir}")
    return 1 if failed else 0
