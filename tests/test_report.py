"""The Kernel engineering chapter's tables judged from the records, and how a run's description
states the code it ran (its recorded sources against its commit)."""
import json
from pathlib import Path

import pytest

from elman.core import records
from elman.results import report


def _cell(impl, B, D, us):
    return {"impl": impl, "params": {"measure": "cell", "B": B, "D": D}, "metrics": {"per_step_us": us}}


def test_target_table_shows_a_near_miss_as_a_miss():
    recs = [_cell("cuda:persistent", 4, 1024, 1.0046), _cell("cuda:persistent", 4, 512, 0.85),
            _cell("cuda:steps+graph", 64, 2048, 7.7)]
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line
            for line in report.target_table(recs).splitlines()[2:]}
    near = rows[("forward per step (us)", "4", "1024")]
    assert "| 1.005 |" in near and near.rstrip(" |").endswith("| no | no")
    assert "| 0.850 | cuda:persistent | yes | no |" in rows[("forward per step (us)", "4", "512")]
    assert "cuda:steps+graph | no | no" in rows[("forward per step (us)", "64", "2048")]
    assert "not measured" in rows[("forward per step (us)", "16", "1024")]


def test_pick_run_prefers_the_newest_full_pass_over_development_runs(tmp_path):
    def run(name, measure):
        d = tmp_path / name
        d.mkdir()
        rec = {"kind": "bench", "impl": "cuda:persistent", "variant": "E1",
               "params": {"measure": measure, "B": 4, "D": 512}, "metrics": {"per_step_us": 1.0}}
        (d / "records.jsonl").write_text(json.dumps(rec) + "\n")
        return d

    old = run("20260101T000000Z_aaaaaaa_nvidia-h100", "cell")
    run("20260102T000000Z_bbbbbbb_dev-s9", "cell")  # newer, but a development run
    run("20260103T000000Z_ccccccc_nvidia-h100", "trace")  # newer, other measure
    assert report.pick_run("bench", "cell", root=tmp_path) == old
    assert report.pick_run("bench", "cell", runs_dir=tmp_path / "20260102T000000Z_bbbbbbb_dev-s9",
                           root=tmp_path).name.endswith("dev-s9")  # a named run is used as given
    assert report.pick_run("parity", root=tmp_path) is None


def test_clock_table_has_a_row_per_work_and_a_column_per_sm_count():
    def rec(work, sms, ghz):
        return {"impl": f"sm_clock_{work}", "params": {"measure": "clock", "work": work, "sms": sms},
                "metrics": {"ghz": ghz}}
    recs = [rec("fma", 16, 1.98), rec("mma", 16, 1.816), rec("mma", 128, 1.83),
            {"impl": "grid_sync_cg_us", "params": {"measure": "primitive"}, "metrics": {"us": 1.1}}]
    lines = report.clock_table(recs).splitlines()
    assert lines[0] == "| work | 16 SMs | 128 SMs |"
    assert lines[2] == "| FMAs, no tensor work | 1.98 | not measured |"
    assert lines[3] == "| mma.sync back to back | 1.82 | 1.83 |"
    assert len(lines) == 4  # no bursts measured: no row
    assert "No SM-clock records" in report.clock_table(recs[-1:])


def test_bench_summary_prints_clock_and_primitive_records():
    from elman.harness import bench
    recs = [{"impl": "sm_clock_mma", "params": {"measure": "clock", "work": "mma", "sms": 32},
             "metrics": {"ghz": 1.83, "min_ghz": 1.82, "max_ghz": 1.84, "ms": 0.9}},
            {"impl": "grid_sync_cg_us", "params": {"measure": "primitive"}, "metrics": {"us": 1.1}}]
    lines = bench.summary(recs).splitlines()
    assert lines[0].startswith("clock mma") and "32 SMs" in lines[0] and "1.830 GHz" in lines[0]
    assert lines[1].startswith("primitive grid_sync_cg_us")


def _git(*args):
    import subprocess
    try:
        r = subprocess.run(["git", "-C", str(records.ROOT), *args], capture_output=True, text=True,
                           timeout=30)
    except OSError:
        return None
    return r.stdout if r.returncode == 0 else None


needs_git = pytest.mark.skipif(_git("rev-parse", "HEAD") is None, reason="needs a git checkout")


@needs_git
def test_source_blobs_are_git_blob_ids():
    blobs = records.source_blobs()
    assert "lib/csrc/dense_persistent.cu" in blobs and "scripts/gpu_pass.sh" in blobs
    for path in ("lib/csrc/dense_persistent.cu", "lib/elman/core/records.py", "scripts/gpu_pass.sh"):
        assert blobs[path] == _git("hash-object", path).strip()


@needs_git
def test_run_description_checks_the_recorded_sources_against_the_commit(tmp_path):
    commit = _git("rev-parse", "--short=10", "HEAD").strip()
    committed = {}
    for line in _git("ls-tree", "-r", "HEAD", "--", *records.SOURCE_DIRS).splitlines():
        meta, path = line.split("\t", 1)
        if Path(path).suffix in records.SOURCE_SUFFIXES:
            committed[path] = meta.split()[2]
    run = tmp_path / "20990101T000000Z_x_gpu"
    run.mkdir()
    rec = {"kind": "bench", "impl": "cuda:persistent", "variant": "E1", "params": {},
           "metrics": {}, "env": {"commit": commit, "dirty": True, "gpu": "H100"}}
    (run / "records.jsonl").write_text(json.dumps(rec) + "\n")

    def describe(sources):
        (run / "run.json").write_text(json.dumps({"note": "n", "sources": sources}))
        return report.describe(run)

    assert records.source_changes(committed, commit) == []
    assert f"commit {commit} (sources as committed)." in describe(committed)
    edited = dict(committed, **{"lib/csrc/dense_persistent.cu": "0" * 40})
    del edited["lib/elman/core/records.py"]
    edited["lib/csrc/extra.cu"] = "1" * 40
    assert records.source_changes(edited, commit) == [
        "lib/csrc/dense_persistent.cu", "lib/csrc/extra.cu", "lib/elman/core/records.py"]
    assert "(3 source files differ from it: lib/csrc/dense_persistent.cu" in describe(edited)
    (run / "run.json").write_text(json.dumps({"note": "n"}))  # an older run: the dirty flag
    assert f"commit {commit} (dirty)." in report.describe(run)
    assert records.source_changes(committed, "0" * 40) is None  # a commit git does not know


def test_a_named_commit_leaves_the_dirty_flag_unknown(monkeypatch):
    """On the GPU host the tree's .git is an older commit's: git status there says nothing
    about the commit a pass names, so the flag is not taken from it."""
    monkeypatch.delenv("ELMAN_DIRTY", raising=False)
    monkeypatch.setenv("ELMAN_COMMIT", "abc1234")
    records.env.cache_clear()
    try:
        assert records.env()["commit"] == "abc1234" and records.env()["dirty"] is None
        monkeypatch.setenv("ELMAN_DIRTY", "1")
        records.env.cache_clear()
        assert records.env()["dirty"] is True
    finally:
        records.env.cache_clear()
