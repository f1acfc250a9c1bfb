"""The runs the book reads: `book/runs.yml` names, for each chapter, the run folders under
`runs/` whose records it shows. A chapter executed on a GPU shows the run it is writing
(`records.run_dir()`); anywhere else it reads only its pinned runs. `ELMAN_PINS` names another
pins file (to render the chapters from one's own runs); its entries may be absolute paths."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from ..core import records

PINS = records.ROOT / "book" / "runs.yml"


def pins_file() -> Path:
    """`$ELMAN_PINS` if set, else `book/runs.yml`."""
    return Path(os.environ.get("ELMAN_PINS") or PINS)


def pinned() -> dict[str, list[str]]:
    """Chapter (notebook stem) -> run folder names, as the pins file lists them."""
    data = yaml.safe_load(pins_file().read_text()) or {}
    return {chapter: list(runs or []) for chapter, runs in (data.get("chapters") or {}).items()}


def runs(chapter: str) -> list[Path]:
    """The run folders pinned for `chapter`; a pinned folder that is missing is an error."""
    names = pinned().get(chapter)
    if names is None:
        raise KeyError(f"{pins_file().name} pins no run for chapter {chapter!r}: name its run folders there")
    folders = [records.RUNS / n for n in names]  # an absolute name stays as it is
    missing = [f.name for f in folders if not f.is_dir() or records.file(f) is None]
    if missing:
        raise FileNotFoundError(f"runs pinned for {chapter!r} have no records: {missing}")
    return folders


def records_of(chapter: str, kind: str | None = None, measure: str | None = None) -> list[dict]:
    """The records of `chapter`'s pinned runs, optionally of one kind and bench measure. Where
    several pinned runs measured the same thing (kind, variant, implementation, parameters),
    the run listed later supersedes the earlier: one record a measurement."""
    latest: dict[str, dict] = {}
    for run in runs(chapter):
        for r in records.read([run], kind=kind):
            if measure is None or r["params"].get("measure") == measure:
                key = json.dumps([r["kind"], r["variant"], r["impl"], r["params"]], sort_keys=True)
                latest.pop(key, None)
                latest[key] = r
    return list(latest.values())
