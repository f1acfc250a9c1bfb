"""scripts/gpu_pass.sh on the CPU: stages run in the order named, a stage past its limit is
stopped and the pass goes on, an unknown stage fails the pass without stopping it; the corpus
stage waits for carried parts; and scripts/gpu_session.sh runs a plan of passes and packs every
run folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stage_order_limits_and_unknown_stages(tmp_path: Path):
    slow = tmp_path / "slow.sh"
    slow.write_text("echo started\nsleep 60\necho finished\n")
    run_dir, out = tmp_path / "run", tmp_path / "out"
    env = {**os.environ, "ELMAN_RUN_DIR": str(run_dir), "OUT": str(out), "DEV_CHECKS": str(slow),
           "LIMIT_dev": "3", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_pass.sh"), "pack", "bogus", "dev"],
                          env=env, capture_output=True, text=True, timeout=60)
    log = (out / "gpu_pass.log").read_text()
    assert proc.returncode != 0
    stages = [line.split("stage ", 1)[1].split(":")[0] for line in log.splitlines() if ": " in line
              and "] stage " in line]
    assert stages == ["pack", "dev"], log
    assert "unknown stage bogus" in log and "stage dev FAILED" in log and "stage pack ok" in log
    assert (run_dir / "slow.log").read_text().split() == ["started"]
    assert "failed stages: bogus dev" in log


def test_corpus_stage_waits_for_every_carried_part(tmp_path: Path):
    """The parts arrive one by one in the carried checkout while the stage waits; it copies them
    once their sizes add up to the manifest's, and fails with a message when they do not in time."""
    carried, tree = tmp_path / "carried" / ".cache" / "data", tmp_path / "tree"
    carried.mkdir(parents=True)
    parts = {f"c.txt.xz.00{i}": bytes([i]) * (100 + i) for i in range(3)}
    (carried / "c.txt.json").write_text(json.dumps({"xz_parts": list(parts), "xz_bytes": sum(map(len, parts.values()))}))

    def arrive():
        for name, data in parts.items():
            time.sleep(1)
            (carried / name).write_bytes(data)
    env = {**os.environ, "ELMAN_RUN_DIR": str(tmp_path / "run"), "OUT": str(tmp_path / "out"),
           "CARRIED": str(tmp_path / "carried"), "CORPUS": ".cache/data/c.txt.xz",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT / "lib")}
    script = tree / "scripts" / "gpu_pass.sh"
    script.parent.mkdir(parents=True)
    script.write_text((ROOT / "scripts" / "gpu_pass.sh").read_text())
    late = subprocess.run(["bash", str(script), "corpus"], env={**env, "CORPUS_WAIT": "1"},
                          capture_output=True, text=True, timeout=60)
    assert late.returncode != 0 and "0 of 303 bytes" in (tmp_path / "out" / "gpu_pass.log").read_text()
    thread = threading.Thread(target=arrive)
    thread.start()
    proc = subprocess.run(["bash", str(script), "corpus"], env={**env, "CORPUS_WAIT": "30"},
                          capture_output=True, text=True, timeout=60)
    thread.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, data in parts.items():
        assert (tree / ".cache" / "data" / name).read_bytes() == data
    assert (tree / ".cache" / "data" / "c.txt.json").is_file()


def test_session_runs_a_plan_and_packs_every_run_folder(tmp_path: Path):
    """gpu_session.sh start FILE runs the plan detached on a copy of the tree; poll waits for its
    end and packs every run folder the passes logged."""
    tree, work, out = tmp_path / "tree", tmp_path / "work", tmp_path / "out"
    (tree / "scripts").mkdir(parents=True)
    (tree / "scripts" / "gpu_session.sh").write_text((ROOT / "scripts" / "gpu_session.sh").read_text())
    (tree / "plan.sh").write_text("".join(
        f'mkdir -p runs/{r} && echo {r} > runs/{r}/records.jsonl\n'
        f'echo "[gpu_pass 00:00:0{i}] run dir $PWD/runs/{r}" >> "$OUT/gpu_pass.log"\n'
        for i, r in enumerate(["A_run", "B_run"])) + "sleep 1\n")
    out.mkdir()
    env = {**os.environ, "WORK": str(work), "OUT": str(out)}
    start = subprocess.run(["bash", "scripts/gpu_session.sh", "start", "plan.sh"], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=30)
    assert start.returncode == 0, start.stderr
    poll = subprocess.run(["bash", "scripts/gpu_session.sh", "poll", "30"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)
    assert "[gpu_session] all passes ended" in poll.stdout
    names = subprocess.run(["tar", "tzf", str(out / "pass.tgz")], capture_output=True, text=True).stdout.split()
    assert {"runs/A_run/records.jsonl", "runs/B_run/records.jsonl", "out/gpu_pass.log"} <= set(names)
    assert not (tree / "runs").exists()  # the passes ran on the copy


def test_pack_alone_needs_the_run_folder(tmp_path: Path):
    """`gpu_pass.sh pack` in a later process would otherwise make (and pack) a new, empty run
    folder: it stops with a message instead."""
    env = {k: v for k, v in os.environ.items() if k != "ELMAN_RUN_DIR"}
    env.update(OUT=str(tmp_path / "out"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_pass.sh"), "pack"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "ELMAN_RUN_DIR" in proc.stderr
