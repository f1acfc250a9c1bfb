"""`elman sched JOBFILE`: run a job file, one job per GPU (VARIANTS.md 5.3, with fixes).

A job file has one shell command per line; blank lines and `#` comments are skipped.
Each job runs with `CUDA_VISIBLE_DEVICES` set to one GPU, at most one job per GPU.
GPUs that nvidia-smi shows busy (a compute process, or more memory in use than
`--busy-mb`) are skipped, and checked again before every launch. Every job writes one log
`<log-dir>/<i>_<name>.log` that starts with a header (job, GPU, command, start time) and
ends with a footer (exit code, duration, `# elman-sched: OK` on success). A failed job is
recorded and the others go on. SIGINT/SIGTERM are passed on to the running jobs (an
`elman train` job then checkpoints and stops; with `--resume auto` in its line, the next
`elman sched` run continues it) and nothing more is started; `--stop-after MINUTES` does
the same on a clock (for hosts that limit how long one command may run). At the end a summary is printed and written as
`<log-dir>/summary.json`. Re-running is safe: a job whose log ends with the success
marker is skipped. The name of a job is the value of its `--name`, else the basename of
`--output`, else its `--level`, else `job<i>`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..core.records import ROOT

OK_MARKER = "# elman-sched: OK"
BUSY_MB = 1024


@dataclass
class Job:
    index: int
    name: str
    command: str
    status: str = "pending"  # pending | skipped | running | ok | failed
    gpu: str | None = None
    exit_code: int | None = None
    seconds: float | None = None
    log: str = ""


def job_name(command: str, index: int) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for flag in ("--name", "--output", "--level"):
        for i, w in enumerate(words):
            value = w.split("=", 1)[1] if w.startswith(flag + "=") else (
                words[i + 1] if w == flag and i + 1 < len(words) else None)
            if value:
                return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(value).name) or f"job{index}"
    return f"job{index}"


def read_jobs(path: Path, log_dir: Path) -> list[Job]:
    jobs = []
    for line in Path(path).read_text().splitlines():
        cmd = line.strip()
        if cmd and not cmd.startswith("#"):
            i = len(jobs)
            name = job_name(cmd, i)
            jobs.append(Job(i, name, cmd, log=str(log_dir / f"{i:02d}_{name}.log")))
    return jobs


def finished(log: Path) -> bool:
    """A job is done when its log ends with the success marker."""
    if not log.exists():
        return False
    lines = log.read_text(errors="replace").rstrip().splitlines()
    return bool(lines) and lines[-1] == OK_MARKER


def nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", *query.split()], capture_output=True, text=True,
                              timeout=30, check=True).stdout
    except FileNotFoundError as exc:
        raise SystemExit("elman sched: nvidia-smi not found; give --gpus to run without it") from exc
    except subprocess.SubprocessError as exc:
        raise SystemExit(f"elman sched: `nvidia-smi {query}` failed: {exc}") from exc


def gpu_status(smi: Callable[[str], str] = nvidia_smi, busy_mb: int = BUSY_MB) -> dict[str, bool]:
    """{gpu index: busy} from nvidia-smi: busy = any compute process or memory.used > busy_mb."""
    gpus = {}
    for line in smi("--query-gpu=index,uuid,memory.used --format=csv,noheader,nounits").splitlines():
        if line.strip():
            index, uuid, used = (x.strip() for x in line.split(","))
            gpus[uuid] = (index, float(used) > busy_mb)
    apps = smi("--query-compute-apps=gpu_uuid,pid --format=csv,noheader")
    busy_uuids = {line.split(",")[0].strip() for line in apps.splitlines() if line.strip()}
    return {index: busy or uuid in busy_uuids for uuid, (index, busy) in gpus.items()}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def run(jobs: list[Job], gpus: list[str], status: Callable[[], dict[str, bool]] | None = None,
        dry: bool = False, poll: float = 1.0, echo: Callable[[str], None] = print,
        stop_after: float | None = None) -> list[Job]:
    """Run the jobs on the given GPUs (one at a time each); `status()` -> {gpu: busy}.
    After `stop_after` seconds the running jobs get SIGTERM and nothing more starts."""
    for job in jobs:
        if finished(Path(job.log)):
            job.status = "skipped"
            echo(f"SKIP  {job.index:02d} {job.name} (finished earlier: {job.log})")
    pending = [j for j in jobs if j.status == "pending"]
    if dry:
        for k, job in enumerate(pending):
            echo(f"DRY   {job.index:02d} {job.name} -> GPU {gpus[k % len(gpus)]}: {job.command}")
        return jobs
    running: dict[str, tuple[Job, subprocess.Popen, float, object]] = {}
    stopping: list[int] = []

    def forward(signum, frame):  # pass SIGINT/SIGTERM on to the jobs, launch nothing more
        stopping.append(signum)
        for _, proc, _, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    deadline = None if stop_after is None else time.time() + stop_after

    def due() -> None:
        if deadline is not None and not stopping and time.time() > deadline:
            echo(f"STOP  --stop-after reached: SIGTERM to {len(running)} running job(s)")
            forward(signal.SIGTERM, None)

    try:
        _loop(pending, running, stopping, gpus, status, poll, echo, due)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return jobs


def _loop(pending, running, stopping, gpus, status, poll, echo, due) -> None:
    while running or (pending and not stopping):
        due()
        for gpu, (job, proc, t0, fh) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            job.exit_code, job.seconds = code, time.time() - t0
            job.status = "ok" if code == 0 else "failed"
            fh.write(f"\n# Finished: {_now()}, exit {code}, {job.seconds / 60:.2f} min\n")
            if code == 0:
                fh.write(OK_MARKER + "\n")
            fh.close()
            del running[gpu]
            echo(f"{'OK' if code == 0 else 'FAIL':5} {job.index:02d} {job.name} on GPU {gpu} "
                 f"(exit {code}, {job.seconds / 60:.1f} min)")
        if stopping:
            if running:
                time.sleep(poll)
            continue
        busy = status() if (pending and status) else {}
        free = [g for g in gpus if g not in running and not busy.get(g, False)]
        if pending and not free and not running:
            for job in pending:
                job.status = "failed"
                echo(f"FAIL  {job.index:02d} {job.name}: every GPU is busy ({', '.join(gpus)})")
            break
        for gpu in free:
            if not pending:
                break
            job = pending.pop(0)
            Path(job.log).parent.mkdir(parents=True, exist_ok=True)
            fh = open(job.log, "w")
            fh.write(f"# Job {job.index}: {job.name}\n# GPU: {gpu}\n# Command: {job.command}\n"
                     f"# Started: {_now()}\n{'=' * 72}\n")
            fh.flush()
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
            proc = subprocess.Popen(job.command, shell=True, cwd=ROOT, env=env, stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            job.status, job.gpu = "running", gpu
            running[gpu] = (job, proc, time.time(), fh)
            echo(f"START {job.index:02d} {job.name} on GPU {gpu}")
        if running:
            time.sleep(poll)


def summary(jobs: list[Job]) -> dict:
    by = {s: [j.name for j in jobs if j.status == s] for s in ("ok", "failed", "skipped", "pending")}
    gpu_min = sum(j.seconds or 0 for j in jobs) / 60
    return {"jobs": len(jobs), **{s: len(v) for s, v in by.items()},
            "failed_names": by["failed"], "gpu_minutes": gpu_min,
            "details": [asdict(j) for j in jobs], "time": _now()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("jobfile", type=Path)
    p.add_argument("--gpus", help="how many GPUs (0..N-1) or a list like 0,2,3 (default: nvidia-smi)")
    p.add_argument("--log-dir", type=Path, help="default out/sched/<job file name>")
    p.add_argument("--busy-mb", type=int, default=BUSY_MB,
                   help="a GPU with more memory in use counts as busy (default %(default)s)")
    p.add_argument("--dry", action="store_true", help="print the plan, run nothing")
    p.add_argument("--stop-after", type=float, metavar="MINUTES",
                   help="then SIGTERM the running jobs and start nothing more (they checkpoint; "
                        "run again to continue jobs that use `--resume auto`)")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    log_dir = args.log_dir or ROOT / "out" / "sched" / args.jobfile.stem
    jobs = read_jobs(args.jobfile, log_dir)
    if not jobs:
        print(f"elman sched: no jobs in {args.jobfile}")
        return 1
    status = None
    if shutil.which("nvidia-smi"):
        def status() -> dict[str, bool]:
            return gpu_status(busy_mb=args.busy_mb)
    elif args.gpus is not None:
        print("nvidia-smi not found: GPUs are not checked for other users' processes")
    if args.gpus is None:
        if status is None:
            print("elman sched: nvidia-smi not found; give --gpus N or --gpus 0,1")
            return 1
        gpus = sorted(status(), key=int)
    elif "," in args.gpus:
        gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    else:
        gpus = [str(i) for i in range(int(args.gpus))]
    if not gpus:
        print("elman sched: no GPUs")
        return 1
    print(f"{len(jobs)} jobs on GPUs {', '.join(gpus)}; logs in {log_dir}")
    run(jobs, gpus, status=None if args.dry else status, dry=args.dry, poll=args.poll,
        stop_after=None if args.stop_after is None else args.stop_after * 60)
    if args.dry:
        return 0
    s = summary(jobs)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    print(f"summary: {s['ok']} ok, {s['failed']} failed{' (' + ', '.join(s['failed_names']) + ')' if s['failed'] else ''}, "
          f"{s['skipped']} skipped, {s['pending']} not started, {s['gpu_minutes']:.1f} GPU-minutes; "
          f"{log_dir / 'summary.json'}")
    return 0 if s["failed"] == 0 and s["pending"] == 0 else 1
