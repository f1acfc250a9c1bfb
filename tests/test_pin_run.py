"""scripts/pin_run.py: what a pinned run keeps, what it refuses, and how runs.yml grows."""
from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from book_pages import ROOT
from elman.core import records

spec = importlib.util.spec_from_file_location("pin_run", ROOT / "scripts" / "pin_run.py")
pin_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pin_run)

PINS = """# comment kept
chapters:
  e00_stock_elman: [a]
  leaderboard: [b, c]
"""


def a_pass(folder):
    """A run folder as gpu_pass.sh leaves it after a training job."""
    records.write([records.make("train", "E1", "cuda", {"B": 64}, {"loss": 1.0})], folder)
    (folder / "run.json").write_text(json.dumps({"note": "x", "sources": {}}))
    (folder / "gpu_pass.log").write_text("[gpu_pass] done\n")
    (folder / "sched").mkdir()
    (folder / "sched" / "summary.json").write_text("{}")
    (folder / "train" / "E1_d1280x6").mkdir(parents=True)
    (folder / "train" / "E1_d1280x6" / "log.jsonl").write_text('{"kind": "start"}\n')
    return folder


def test_add_pins_appends_once_and_keeps_the_rest():
    text = pin_run.add_pins(PINS, "leaderboard", ["d", "c"])
    assert text.startswith("# comment kept\n")
    data = yaml.safe_load(text)["chapters"]
    assert data == {"e00_stock_elman": ["a"], "leaderboard": ["b", "c", "d"]}
    assert pin_run.add_pins(text, "leaderboard", ["d"]) == text


def test_add_pins_adds_a_chapter_that_has_none():
    data = yaml.safe_load(pin_run.add_pins(PINS, "training_protocol", ["d"]))["chapters"]
    assert data["training_protocol"] == ["d"] and data["leaderboard"] == ["b", "c"]


def test_copy_run_keeps_compressed_records_and_logs(tmp_path):
    src = a_pass(tmp_path / "pass" / "20270101T000000Z_abc1234_gpu")
    src.parent.mkdir(exist_ok=True)
    runs = tmp_path / "runs"
    runs.mkdir()
    log = tmp_path / "out.log"
    log.write_text("[gpu_pass] whole pass\n")
    dst = pin_run.copy_run(src, runs, log)
    assert dst == runs / src.name and (dst / "gpu_pass.log").read_text() == log.read_text()
    assert (dst / "records.jsonl.xz").is_file() and not (dst / "records.jsonl").exists()
    assert [r["variant"] for r in records.read([dst])] == ["E1"]
    assert (dst / "train" / "E1_d1280x6" / "log.jsonl").is_file() and (dst / "sched" / "summary.json").is_file()
    assert sorted(p.name for p in runs.iterdir()) == [src.name]  # no temporary folder left
    with pytest.raises(pin_run.PinError, match="exists"):
        pin_run.copy_run(src, runs)


@pytest.mark.parametrize("extra", ["checkpoint.pt", "e01.ipynb"])
def test_a_folder_with_other_files_is_refused(tmp_path, extra):
    src = a_pass(tmp_path / "run")
    (src / "train" / extra).write_bytes(b"\0" * 8)
    with pytest.raises(pin_run.PinError, match=extra):
        pin_run.pin_files(src)


def test_a_folder_without_run_json_or_records_is_refused(tmp_path):
    src = a_pass(tmp_path / "run")
    (src / "run.json").unlink()
    with pytest.raises(pin_run.PinError, match="run.json"):
        pin_run.pin_files(src)
    (src / "run.json").write_text("{}")
    (src / "records.jsonl").unlink()
    with pytest.raises(pin_run.PinError, match="records"):
        pin_run.pin_files(src)


def test_main_refuses_an_unknown_chapter(tmp_path):
    with pytest.raises(SystemExit):
        pin_run.main([str(a_pass(tmp_path / "run")), "--chapters", "not_a_chapter"])
