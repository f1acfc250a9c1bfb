"""The book reads pinned runs only: every chapter that shows records is pinned in book/runs.yml,
every pinned folder exists with its records, runs/ holds GPU passes (no development runs, no
executed-notebook copies), and no committed notebook names a host path."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import book_pages
from elman.core import records
from elman.results import pins

ROOT = records.ROOT
CHAPTERS = [ROOT / p for p in book_pages.chapters()]
NOTEBOOKS = sorted((ROOT / "book").rglob("*.ipynb"))
HOST_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|opt|mnt|scratch|data|Users)/")


def _code(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _reads_records(nb: Path) -> bool:
    return bool(re.search(r"\bpins\.|records\.read\(", _code(nb)))


def test_the_toc_lists_chapters():
    assert len(CHAPTERS) >= 6


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_that_reads_records_is_pinned(nb: Path):
    if not _reads_records(nb):
        pytest.skip("reads no records")
    assert nb.stem in pins.pinned(), f"book/runs.yml pins no run for {nb.stem}"
    assert pins.runs(nb.stem)


@pytest.mark.parametrize("chapter", sorted(pins.pinned()))
def test_every_pinned_folder_exists_with_records(chapter: str):
    names = pins.pinned()[chapter]
    assert names, f"{chapter} pins an empty list"
    for name in names:
        assert "/" not in name, "a pin names a folder under runs/, not a path"
        folder = records.RUNS / name
        assert records.file(folder) is not None, f"{name}: no records"
        assert (folder / "run.json").is_file(), f"{name}: no run.json"
        assert records.read([folder]), f"{name}: no record in its records file"


def test_a_missing_pin_is_an_error(tmp_path, monkeypatch):
    pins_file = tmp_path / "runs.yml"
    pins_file.write_text("chapters:\n  x: [19990101T000000Z_none]\n")
    monkeypatch.setattr(pins, "PINS", pins_file)
    with pytest.raises(FileNotFoundError):
        pins.runs("x")
    with pytest.raises(KeyError):
        pins.runs("not_a_chapter")


def test_runs_hold_gpu_passes_only():
    for folder in records.RUNS.iterdir():
        if not folder.is_dir():
            continue
        assert not re.search(r"_dev-|wip|-flags", folder.name), f"development run {folder.name}"
        assert not (folder / "notebooks").exists(), f"{folder.name} holds executed-notebook copies"
        assert (folder / "run.json").is_file(), f"{folder.name}: no run.json"
        assert not (folder / "records.jsonl").exists(), \
            f"{folder.name}: a pinned run keeps its records as records.jsonl.xz (records.compress)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_names_a_host_path(nb: Path):
    hits = sorted(set(HOST_PATH.findall(nb.read_text())))
    assert not hits, f"{nb.relative_to(ROOT)} names host paths: {hits}"


def test_host_path_pattern():
    assert HOST_PATH.search('runs_dir = "/work/main/runs/x"')
    assert HOST_PATH.search("'/tmp/abc'") and HOST_PATH.search("/home/u/x")
    assert not HOST_PATH.search("runs/20261124T105417Z_461e9b3/records.jsonl")
    assert not HOST_PATH.search("tokens/s per GPU")


def test_a_later_pinned_run_supersedes_the_same_measurement(tmp_path, monkeypatch):
    def rec(variant, B, ms):
        return records.make("bench", variant, "cuda", {"B": B, "measure": "cell"}, {"fwd_ms": ms})
    old, new = tmp_path / "old", tmp_path / "new"
    records.write([rec("E61", 4, 1.0), rec("E61", 64, 2.0)], old)
    records.write([rec("E61", 4, 0.5), rec("E68", 4, 3.0)], new)
    pins_file = tmp_path / "runs.yml"
    pins_file.write_text(f"chapters:\n  x: [{old}, {new}]\n")
    monkeypatch.setattr(pins, "PINS", pins_file)
    got = {(r["variant"], r["params"]["B"]): r["metrics"]["fwd_ms"] for r in pins.records_of("x", "bench")}
    assert got == {("E61", 4): 0.5, ("E61", 64): 2.0, ("E68", 4): 3.0}
    assert pins.records_of("x", "bench", measure="layer") == []
