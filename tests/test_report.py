"""The Kernel engineering chapter's tables judged from the records, and how a run's description
states the code it ran (its recorded sources against its commit)."""
import json
from pathlib import Path

import pytest

from elman.core import records
from elman.results import report, tables, versions


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


def _version(v, role, B, D, us, origin="o1", outcome="kept", commit="abcdef1234"):
    return {"kind": "bench", "impl": "cuda:persistent", "variant": "E1",
            "params": {"measure": "cell", "B": B, "D": D, "version": v, "change": f"change {v}",
                       "outcome": outcome, "role": role, "origin": origin},
            "metrics": {"per_step_us": us}, "env": {"commit": commit}, "time": "2026-11-22T08:00:00+00:00"}


def test_version_table_shows_medians_of_the_version_arm_only():
    recs = [_version(1, "version", 4, 1024, 2.0), _version(1, "version", 4, 1024, 2.2),
            _version(1, "version", 4, 1024, 9.0), _version(1, "reference", 4, 1024, 5.0),
            _version(2, "version", 4, 1024, 1.5, outcome="not kept", commit="wip1"),
            _version(3, "version", 4, 1024, 1.2, commit="e914658-flags")]
    lines = versions.table(recs, shapes=((4, 1024), (64, 2048))).splitlines()
    assert lines[0].endswith("| B=4 D=1024 | B=64 D=2048 |")
    assert lines[2] == "| 1 | `abcdef1` | 2026-11-22 | change 1 | kept | 2.20 | — |"
    assert "| 2 | `uncommitted` |" in lines[3] and "| 3 | `e914658 + flag code` |" in lines[4]


def test_effects_compare_a_version_with_its_reference_in_the_same_run():
    recs = [_version(5, "reference", 4, 512, 1.0), _version(5, "version", 4, 512, 0.9),
            _version(5, "variant", 4, 512, 0.1), _version(5, "version", 16, 1024, 1.0),
            _version(6, "reference", 4, 512, 1.0, origin="o2"), _version(6, "version", 4, 512, 1.1)]
    (e,) = versions.effects(recs)  # no reference at (16, 1024); version 6's arms are in two runs
    assert (e["version"], e["B"], e["D"], e["before"], e["after"]) == (5, 4, 512, 1.0, 0.9)
    assert abs(e["rel"] + 0.1) < 1e-12
    assert "| 5 | kept | 1.000 → 0.900 (-10.0 %) |" in versions.effect_table(recs)


def test_main_line_and_largest_steps_follow_the_kept_versions():
    recs = [_version(1, "version", 4, 1024, 2.0), _version(2, "version", 4, 1024, 3.0, outcome="not kept"),
            _version(3, "version", 4, 1024, 1.0, outcome="kept at 8 batch columns"),
            _version(4, "version", 4, 1024, 0.9)]
    assert versions.main_line(recs, 4, 1024) == [(1, 2.0), (3, 1.0), (4, 0.9)]
    lines = versions.largest_steps(recs, 4, 1024, n=1).splitlines()
    assert len(lines) == 3 and lines[2] == "| 3 | change 3 | 2.00 → 1.00 | -50 % |"


def test_wide_tables_scroll_and_stay_markdown():
    md = "| a | `b` |\n|---|---|\n| 1 & 2 | **3** |"
    shown = tables.scrolled(md).data
    assert shown.startswith("```{container} table-scroll\n") and shown.endswith("\n```")
    assert md in shown


def test_describe_names_the_run_folder_not_a_path(tmp_path):
    run = tmp_path / "20990101T000000Z_abc_gpu"
    run.mkdir()
    rec = {"kind": "bench", "impl": "x", "variant": "E1", "params": {}, "metrics": {},
           "env": {"commit": "abc", "gpu": "H100", "driver": "1", "torch": "2", "cuda": "13"}}
    (run / "records.jsonl").write_text(json.dumps(rec) + "\n")
    text = report.describe(run)
    assert text.startswith("Run `20990101T000000Z_abc_gpu`: H100, driver 1, torch 2, CUDA 13, commit abc")
    assert str(tmp_path) not in text


def test_results_import_only_the_core():
    import ast
    for f in (records.ROOT / "lib" / "elman" / "results").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:  # from ..x import y
                targets = [node.module] if node.module else [a.name for a in node.names]
                assert all(t.split(".")[0] == "core" for t in targets), f"{f.name}: {targets}"
            elif isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1, f"{f.name}: imports from above elman"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("elman"):
                assert node.module.startswith("elman.core") or node.module.startswith("elman.results"), f.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("elman") and not a.name.startswith("elman.core")
                               for a in node.names), f.name


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
    kernel = next(p for p in sorted(blobs) if p.startswith("lib/csrc/") and p.endswith(".cu"))
    assert "scripts/gpu_pass.sh" in blobs
    for path in (kernel, "lib/elman/core/records.py", "scripts/gpu_pass.sh"):
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
    edited = dict(committed, **{"lib/csrc/dense/persistent.cu": "0" * 40})
    del edited["lib/elman/core/records.py"]
    edited["lib/csrc/extra.cu"] = "1" * 40
    assert records.source_changes(edited, commit) == [
        "lib/csrc/dense/persistent.cu", "lib/csrc/extra.cu", "lib/elman/core/records.py"]
    assert "(3 source files differ from it: lib/csrc/dense/persistent.cu" in describe(edited)
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
