"""The leaderboard's job files are what scripts/make_jobs.py writes (widths from elman dims)."""
from __future__ import annotations

import importlib.util
import re

from book_pages import ROOT
from elman.results import leaderboard

spec = importlib.util.spec_from_file_location("make_jobs", ROOT / "scripts" / "make_jobs.py")
make_jobs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_jobs)


def test_50m_anchor_is_e1_at_d1280x6_and_e42_keeps_its_width():
    lines = make_jobs.jobs("50m", ["E1", "E42"], 42, 10)
    runs = [l for l in lines if l.startswith("python3")]
    assert "--level E1 --dim 1280 --depth 6 " in runs[0] and "--batch 64" in runs[0]
    assert "--level E42 --dim 1536 --depth 6 " in runs[1]
    assert all("--resume auto" in r and "--minutes 10" in r for r in runs)


def test_second_seed_gets_its_own_name():
    run = [l for l in make_jobs.jobs("100m", ["E1"], 43, 10) if l.startswith("python3")][0]
    assert "--seed 43" in run and "--name E1_d640x20_s43" in run and "--expansion 2.0" in run


def test_committed_job_files_match_the_generator():
    for table in ("50m", "100m"):
        written = (ROOT / "scripts" / f"train_{table}.jobs").read_text().splitlines()
        assert written == make_jobs.table_jobs(table), \
            f"scripts/train_{table}.jobs is stale: python scripts/make_jobs.py {table} > scripts/train_{table}.jobs"


def _runs(text: str) -> list[tuple[str, str]]:
    return [(re.search(r"--level (\S+)", l).group(1), re.search(r"--seed (\d+)", l).group(1))
            for l in text.splitlines() if l.startswith("python3")]


def test_job_files_hold_every_row_at_seed_42_and_e1_at_seed_43():
    for table in ("50m", "100m"):
        runs = _runs((ROOT / "scripts" / f"train_{table}.jobs").read_text())
        t = leaderboard.TABLES[table]
        further = [lv for lv in t.further if lv not in dict(t.cannot_run)]
        assert runs == [(lv, "42") for lv in t.levels] + [("E1", "43")] + [(lv, "42") for lv in further]
    assert len(leaderboard.TABLES["100m"].further) == 18
    assert dict(leaderboard.TABLES["100m"].cannot_run).keys() == {"E14"}
    missing = _runs("\n".join(make_jobs.missing_jobs("100m", [])))
    assert ("E14", "42") not in missing and ("E23", "42") in missing


def test_every_job_builds_at_its_width_with_the_count_it_states():
    """Each line of the committed job files builds its model (on the meta device) with the
    parameter count of the comment above it: no width a constructor refuses reaches a GPU."""
    import torch
    from elman.training import profile
    from elman.training.lm import LadderLM
    for table in ("50m", "100m"):
        path = ROOT / "scripts" / f"train_{table}.jobs"
        stated = [int(n.replace(",", "")) for n in re.findall(r"^# \S+: ([\d,]+) parameters$",
                                                               path.read_text(), re.M)]
        jobs = profile.job_configs(path)
        assert len(stated) == len(jobs)
        for (level, dim, depth, expansion, *_), count in zip(jobs, stated):
            with torch.device("meta"):
                m = LadderLM(level, dim, depth, expansion=expansion, backend="reference")
            assert sum(p.numel() for p in m.parameters()) == count, (level, dim)


def _row(level, seed, val_bits):
    t = leaderboard.TABLES["50m"]
    return {"name": leaderboard.run_name(level, 1280, 6, seed), "level": level, "dim": 1280, "depth": 6,
            "batch": t.batch, "seq": t.seq, "minutes": t.minutes, "lr": t.lr, "data": leaderboard.DATA,
            "seed": seed, "expansion": 1.0, "option": [], "run": "r", "val_bits": val_bits}


def test_second_seeds_take_the_top_models_without_one():
    rows = [_row(lv, 42, 1.0 + i / 10) for i, lv in enumerate(("E42", "E1", "E33", "E0", "E39", "llama"))]
    rows.append(_row("E33", 43, 1.25))  # E33 has its second seed already
    runs = _runs("\n".join(make_jobs.second_seeds("50m", rows, 5)))
    assert runs == [("E42", "43"), ("E0", "43"), ("E39", "43")]  # E1's is in the table's file
    assert make_jobs.second_seeds("50m", rows[1:3] + rows[-1:], 2)[0].startswith("# 50m table: no second seed")


def test_missing_jobs_are_the_rows_and_second_seed_not_run_yet():
    rows = [_row("E1", 42, 1.0), _row("E33", 42, 1.1), _row("E33", 43, 1.2)]
    runs = _runs("\n".join(make_jobs.missing_jobs("50m", rows)))
    assert runs == [(lv, "42") for lv in leaderboard.TABLES["50m"].levels if lv not in ("E1", "E33")] + [("E1", "43")]
    done = [_row(lv, 42, 1.0) for lv in leaderboard.TABLES["50m"].levels] + [_row("E1", 43, 1.0)]
    assert make_jobs.missing_jobs("50m", done) == ["# 50m table: every row has its runs"]


def test_issue20_record_is_the_50m_tables_e1_row():
    line = [l for l in (ROOT / "scripts" / "train_issue20.jobs").read_text().splitlines() if l.startswith("python3")]
    e1 = [l for l in make_jobs.jobs("50m", ["E1"], 42, 10) if l.startswith("python3")]
    assert line == e1 and "--graph" in e1[0]
