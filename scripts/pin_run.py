#!/usr/bin/env python3
"""Pin GPU passes for the book: copy each run folder into runs/ (its records compressed), name
it for the given chapters in book/runs.yml, and optionally re-execute those chapters on the CPU.

    python scripts/pin_run.py PASS/runs/<run> [...] --chapters leaderboard training_protocol
    python scripts/pin_run.py PASS/runs/<run> --log PASS/out/gpu_pass.log --chapters leaderboard --execute

A run folder is what `scripts/gpu_pass.sh` wrote on the GPU host (unpacked from the pass's
archive): records.jsonl, run.json, logs, and for training `sched/` and `train/`. Only text
files travel (.jsonl, .json, .log, .txt, .md; nothing over MAX_FILE_BYTES; lock files stay
behind): a checkpoint or an executed-notebook copy left in a folder is an error, not a silent
copy. A folder already in runs/ is refused. `--execute` runs each chapter with papermill in quick mode on the CPU (a
chapter built only from pinned records, such as the Leaderboard, then shows the new runs) and
tags its cells (scripts/tag_chapters.py); chapters that measure on the GPU must come from the
GPU pass instead.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from elman.core import records
from elman.results import pins

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".jsonl", ".json", ".log", ".txt", ".md"}
MAX_FILE_BYTES = 16 * 2**20
LOG_NAME = "gpu_pass.log"


class PinError(RuntimeError):
    """A run folder cannot be pinned; the message says why."""


def pin_files(src: Path) -> list[Path]:
    """The files of run folder `src` that a pinned run keeps (relative paths); PinError for a
    folder with no records or with a file that is not one of them."""
    if not (src / "run.json").is_file():
        raise PinError(f"{src}: no run.json (not a folder gpu_pass.sh wrote)")
    if records.file(src) is None:
        raise PinError(f"{src}: no records.jsonl")
    files, bad = [], []
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        if rel.suffix == ".lock":  # records.write's lock file
            continue
        if rel.name.endswith(".jsonl.xz") or (f.suffix in TEXT_SUFFIXES and f.stat().st_size <= MAX_FILE_BYTES):
            files.append(rel)
        else:
            bad.append(str(rel))
    if bad:
        raise PinError(f"{src}: not a record or log, or over {MAX_FILE_BYTES >> 20} MiB: {', '.join(bad)}")
    return files


def copy_run(src: Path, runs: Path, log: Path | None = None) -> Path:
    """runs/<src.name> with src's records (compressed) and logs, and `log` (the pass's
    gpu_pass.log, which the pass writes beside its run folders) as gpu_pass.log."""
    dst = runs / src.name
    if dst.exists():
        raise PinError(f"{dst} exists: a pinned run is not overwritten")
    files = pin_files(src)
    tmp = runs / f".{src.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for rel in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, tmp / rel)
    if log is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, tmp / LOG_NAME)
    if (tmp / records.NAMES[0]).exists():
        records.compress(tmp)
    tmp.rename(dst)
    return dst


def add_pins(text: str, chapter: str, runs: list[str]) -> str:
    """The runs.yml text with `runs` appended to `chapter`'s list (a new line if it has none),
    comments and the other lines kept as they are."""
    line = re.compile(rf"^(  {re.escape(chapter)}:\s*\[)(.*)(\]\s*)$", re.M)
    m = line.search(text)
    if m is None:
        return text.rstrip("\n") + f"\n  {chapter}: [{', '.join(runs)}]\n"
    have = [r.strip() for r in m.group(2).split(",") if r.strip()]
    new = have + [r for r in runs if r not in have]
    return text[:m.start()] + f"{m.group(1)}{', '.join(new)}{m.group(3)}" + text[m.end():]


def execute(chapters: list[str], root: Path) -> None:
    """Each chapter run in quick mode on the CPU with papermill, in place, then tagged."""
    folder = root / "book" / "chapters"
    for chapter in chapters:
        nb = f"{chapter}.ipynb"
        subprocess.run([sys.executable, "-m", "papermill", nb, nb, "-k", "python3", "-p", "quick", "True",
                        "-p", "device", "cpu"], cwd=folder, check=True)
        subprocess.run([sys.executable, str(root / "scripts" / "tag_chapters.py"), str(folder / nb)], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders a GPU pass wrote")
    ap.add_argument("--chapters", nargs="+", required=True, help="notebook stems that read them")
    ap.add_argument("--log", type=Path, help="the pass's gpu_pass.log (out/gpu_pass.log in its archive), "
                                             "copied into every run pinned")
    ap.add_argument("--execute", action="store_true", help="re-execute the chapters on the CPU (quick)")
    args = ap.parse_args(argv)
    if args.log is not None and not args.log.is_file():
        ap.error(f"--log {args.log}: no such file")
    stems = {p.stem for p in (ROOT / "book" / "chapters").glob("*.ipynb")}
    unknown = [c for c in args.chapters if c not in stems]
    if unknown:
        ap.error(f"no chapter named {', '.join(unknown)} (book/chapters/*.ipynb)")
    try:
        for src in args.runs:
            pin_files(src)  # every folder checked before any is copied
        names = [copy_run(src, records.RUNS, args.log).name for src in args.runs]
    except PinError as e:
        print(f"pin_run: {e}", file=sys.stderr)
        return 1
    text = pins.PINS.read_text()
    for chapter in args.chapters:
        text = add_pins(text, chapter, names)
    pins.PINS.write_text(text)
    print(f"pinned {', '.join(names)} for {', '.join(args.chapters)}")
    if args.execute:
        execute(args.chapters, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
