"""Records of GPU runs in `runs/<UTC date-time>_<commit>_<gpu>/records.jsonl`; a pinned run in
the repository keeps them xz-compressed as `records.jsonl.xz` (`compress`), which `read`
reads alike (the tree travels to each GPU host and the records are most of its size).

A record is one JSON object: `kind` (parity | bench | train), `variant`, `impl`,
`params`, `metrics`, `env` (gpu, driver, torch, CUDA, commit, dirty flag) and `time`.
Every number in the book is read from records. A GPU pass also writes the run's `run.json`:
its note and `sources`, the git blob ids of the files that decide its results
(`source_blobs`), which `source_changes` checks against the recorded commit. Writes are atomic: the file is rewritten
to a temporary name under an exclusive lock and renamed over the old one, so concurrent
writers (several training jobs) never lose or tear a record.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import lzma
import os
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import torch

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "runs"
KINDS = ("parity", "bench", "train")
# What decides a run's results: the kernels, the package and the GPU scripts.
SOURCE_DIRS = ("lib/csrc", "lib/elman", "scripts")
SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".py", ".sh")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _dirty() -> bool | None:
    """Whether tracked files differ in content from the commit: ELMAN_DIRTY if set; None
    (unknown) where ELMAN_COMMIT names the commit, because there the tree's own .git may be
    another commit's (the GPU host's copy of the tree carries an older .git; the run's
    recorded sources say what ran); else git's answer, mode bits aside."""
    if "ELMAN_DIRTY" in os.environ:
        return os.environ["ELMAN_DIRTY"] == "1"
    if os.environ.get("ELMAN_COMMIT"):
        return None
    return bool(_git("-c", "core.fileMode=false", "status", "--porcelain", "--untracked-files=no"))


@lru_cache(maxsize=1)
def env() -> dict[str, Any]:
    """Where and with what a record was made."""
    info: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "commit": os.environ.get("ELMAN_COMMIT") or _git("rev-parse", "--short=10", "HEAD") or "unknown",
        "dirty": _dirty(),
        "gpu": None, "driver": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        p = torch.cuda.get_device_properties(0)
        info["sm_count"] = p.multi_processor_count
        info["capability"] = f"{p.major}.{p.minor}"
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return info


def source_blobs(root: Path = ROOT) -> dict[str, str]:
    """Path -> git blob id (what `git hash-object` prints) of every source file under
    SOURCE_DIRS, computed without git: what a run built and ran, comparable with any commit."""
    blobs = {}
    for folder in SOURCE_DIRS:
        for f in sorted((root / folder).rglob("*")):
            if f.is_file() and f.suffix in SOURCE_SUFFIXES and "__pycache__" not in f.parts:
                data = f.read_bytes()
                blobs[f.relative_to(root).as_posix()] = hashlib.sha1(
                    b"blob %d\0" % len(data) + data).hexdigest()
    return blobs


def source_changes(sources: dict[str, str], commit: str, root: Path = ROOT) -> list[str] | None:
    """The paths of `sources` (from source_blobs) that differ from `commit`'s, added or
    missing ones included; None where git or the commit is not available."""
    listing = _git("-C", str(root), "ls-tree", "-r", commit, "--", *SOURCE_DIRS)
    if not listing:
        return None
    committed = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        if Path(path).suffix in SOURCE_SUFFIXES:
            committed[path] = meta.split()[2]
    return sorted(p for p in committed.keys() | sources.keys() if committed.get(p) != sources.get(p))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "cpu"


def run_dir(create: bool = True) -> Path:
    """The current run's folder: `$ELMAN_RUN_DIR` if set (the GPU script sets one for the
    whole pass), else a new `runs/<UTC>_<commit>_<gpu>/`."""
    if os.environ.get("ELMAN_RUN_DIR"):
        path = Path(os.environ["ELMAN_RUN_DIR"])
    else:
        e = env()
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = RUNS / f"{stamp}_{e['commit']}_{_slug(e['gpu'] or 'cpu')}"
        os.environ["ELMAN_RUN_DIR"] = str(path)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def make(kind: str, variant: str, impl: str, params: dict, metrics: dict) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"record kind must be one of {KINDS}, got {kind!r}")
    return {"kind": kind, "variant": variant, "impl": impl, "params": params,
            "metrics": metrics, "env": env(),
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def write(records: dict | Iterable[dict], folder: Path | None = None) -> Path:
    """Append records to `<folder>/records.jsonl` atomically; returns the file."""
    recs = [records] if isinstance(records, dict) else list(records)
    folder = folder or run_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "records.jsonl"
    with open(folder / ".records.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = path.read_text() if path.exists() else ""
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(old)
            for r in recs:
                f.write(json.dumps(r, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return path


NAMES = ("records.jsonl", "records.jsonl.xz")


def file(folder: Path | str) -> Path | None:
    """The records file of a run folder (records.jsonl or records.jsonl.xz), or None; a folder
    with both is an error."""
    found = [Path(folder) / n for n in NAMES if (Path(folder) / n).is_file()]
    if len(found) > 1:
        raise ValueError(f"{folder} holds both {NAMES[0]} and {NAMES[1]}: keep one")
    return found[0] if found else None


def compress(folder: Path | str) -> Path:
    """Replace a run folder's records.jsonl by records.jsonl.xz (the form a pinned run keeps)."""
    src = Path(folder) / NAMES[0]
    dst = src.with_name(NAMES[1])
    tmp = dst.with_name(f"{dst.name}.tmp{os.getpid()}")
    with open(src, "rb") as f, lzma.open(tmp, "wb", preset=6) as z:
        z.write(f.read())
    os.replace(tmp, dst)
    src.unlink()
    return dst


def _text(f: Path) -> str:
    return lzma.open(f, "rt").read() if f.suffix == ".xz" else f.read_text()


def read(paths: Iterable[Path | str] | None = None, kind: str | None = None) -> list[dict]:
    """All records under the given run folders or files (default: every run in runs/)."""
    files: list[Path] = []
    for p in ([RUNS] if paths is None else paths):
        p = Path(p)
        if p.is_dir():
            folders = sorted({f.parent for n in NAMES for f in p.rglob(n)})
            files += [file(d) for d in folders]
        else:
            files.append(p)
    out = []
    for f in files:
        for line in _text(f).splitlines():
            if line.strip():
                r = json.loads(line)
                r["run"] = f.parent.name
                if kind is None or r["kind"] == kind:
                    out.append(r)
    return out


if __name__ == "__main__":  # python -m elman.core.records compress RUN_FOLDER ...
    import sys
    if len(sys.argv) < 3 or sys.argv[1] != "compress":
        sys.exit("usage: python -m elman.core.records compress RUN_FOLDER ...")
    for folder in sys.argv[2:]:
        print(compress(folder))
