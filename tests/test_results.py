"""`elman results`: rows from train records, latest per run name, three formats, logs."""
from __future__ import annotations

import csv
import io
import json

import pytest

from elman.core import records
from elman.results import training as results
from elman.cli import main as cli


def _record(name, last100, steps, level="E1", tps=1000.0):
    r = records.make("train", level, "cuda+fused",
                     {"name": name, "n_params": 49_496_320, "dim": 1280, "depth": 6, "batch": 64,
                      "world_size": 1},
                     {"steps": steps, "last100": last100, "last1000": last100 + 0.01,
                      "val_loss": last100 + 0.02, "tokens_per_s": tps, "peak_memory_mb": 2048.0,
                      "log": f"train/{name}/log.jsonl"})
    r["env"] = {**r["env"], "gpu": "NVIDIA H100 80GB HBM3"}
    return r


def _runs(tmp_path):
    run = tmp_path / "20260101T000000Z_abc_h100"
    records.write([_record("e1", 1.52, 100), _record("e0", 1.61, 900, "E0"),
                   _record("e1", 1.43, 1000)], run)   # e1 resumed: the later record wins
    log = run / "train" / "e1" / "log.jsonl"
    log.parent.mkdir(parents=True)
    lines = [{"kind": "start", "step": 0}]
    lines += [{"kind": "train", "step": s, "loss": 3.0 - s / 1000, "tokens_per_s": 9.0, "lr": 1e-4,
               "grad_norm": 0.5} for s in (10, 20, 30)]
    lines += [{"kind": "train", "step": 30, "loss": 2.5, "tokens_per_s": 9.0, "lr": 1e-4,
               "grad_norm": 0.5}, {"kind": "val", "step": 30, "val_loss": 2.7}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_rows_keep_the_latest_record_per_name_sorted_by_last100(tmp_path):
    run = _runs(tmp_path)
    rows = results.rows(records.read([run], kind="train"))
    assert [(r["name"], r["steps"], r["last100"]) for r in rows] == [("e1", 1000, 1.43), ("e0", 900, 1.61)]
    assert rows[0]["gpu"] == "NVIDIA H100 80GB HBM3" and rows[0]["run"] == run.name


def test_formats(tmp_path, capsys):
    run = _runs(tmp_path)
    assert cli(["results", str(run)]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("| name | level | params |") and len(md) == 4
    assert "| e1 | E1 | 49.50M | 1280 | 6 | 64 | 1000 | 1.4300 | 1.4400 | 1.4500 | 1,000 | 2,048 |" in md[2]
    assert cli(["results", str(run), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[1]["name"] == "e0" and float(rows[1]["last100"]) == 1.61
    assert cli(["results", str(run), "--format", "json", "--level", "E0"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["e0"]


def test_no_records_is_an_error(tmp_path, capsys):
    assert cli(["results", str(tmp_path)]) == 1
    assert "no train records" in capsys.readouterr().out


def test_read_log_keeps_the_last_line_per_step(tmp_path):
    run = _runs(tmp_path)
    row = results.rows(records.read([run], kind="train"))[0]
    cols = results.read_log(run, row)
    assert cols["step"] == [10, 20, 30] and cols["loss"][-1] == 2.5
    assert cols["val_step"] == [30] and cols["val_loss"] == [2.7]


def test_seed_results_are_a_data_file_with_sources():
    rows = results.seed_results()
    assert rows and all(r["source"].startswith("seed documents") and r["unit"] for r in rows)
    e1 = {r["metric"]: r["value"] for r in results.seed_results("E1", "d1280x6")}
    assert e1["last-100 loss (low)"] <= e1["last-100 loss (high)"]
    assert e1["tokens/s (low)"] <= e1["tokens/s (high)"]
    assert results.seed_results("E1", "no such config") == []


def _cell(D: int, B: int, impl: str, us: float) -> dict:
    return {"variant": "E1", "impl": impl, "params": {"measure": "cell", "B": B, "D": D},
            "metrics": {"per_step_us": us}}


def test_width_targets_and_table():
    from elman.results import report

    recs = [_cell(D, 4, "cuda:persistent", us) for D, us in ((1024, 0.9), (1280, 1.4), (2048, 3.6))]
    recs += [_cell(D, 64, "cuda:persistent", us) for D, us in ((1280, 2.8), (1536, 6.0), (2048, 5.4))]
    recs += [_cell(1280, 4, "cuda:steps+graph", 6.1)]
    lines = report.width_targets(recs)
    assert "B = 4: 3 widths on the persistent path; none slower than D = 2048 (3.60 us) (met)." in lines
    assert "D = 1280, B = 4: 1.40 us per step (target <= 1.5 us: met)." in lines
    assert "slower than D = 2048 (5.40 us): D = 1536 (not met)." in lines
    assert "D = 1280, B = 64: 2.80 us per step (target <= 2.5 us: not met)." in lines
    table = report.width_table(recs)
    assert "| 1280 | 1.40 | 6.10 | 2.80 |  |" in table
    assert report.plot_widths(recs) is not None and report.plot_widths([]) is None


def test_compressed_records_read_as_written(tmp_path):
    """A pinned run keeps records.jsonl.xz (records.compress): read gives the same records,
    from the folder or from a parent; a folder holding both files is an error."""
    run = tmp_path / "runs" / "A_run"
    recs = [records.make("bench", "E1", "cuda", {"B": b}, {"ms": 1.0 + b}) for b in (1, 2)]
    records.write(recs, run)
    plain = records.read([run])
    assert records.compress(run).name == "records.jsonl.xz" and not (run / "records.jsonl").exists()
    assert records.read([run]) == plain == records.read([tmp_path / "runs"])
    assert [r["params"]["B"] for r in plain] == [1, 2] and records.file(run).suffix == ".xz"
    records.write(recs[:1], run)
    with pytest.raises(ValueError, match="both"):
        records.read([run])
