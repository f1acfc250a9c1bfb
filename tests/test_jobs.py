"""The leaderboard's job files are what scripts/make_jobs.py writes (widths from elman dims)."""
from __future__ import annotations

import importlib.util

from book_pages import ROOT

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
        assert written == make_jobs.jobs(table, None, 42, 10), \
            f"scripts/train_{table}.jobs is stale: python scripts/make_jobs.py {table} > scripts/train_{table}.jobs"
