"""`elman sched` with fake GPU lists (an injected nvidia-smi) and tiny shell jobs."""
from __future__ import annotations

import json
import os
from pathlib import Path


from elman.training import sched
from elman.cli import main as cli

GPUS = {  # index, uuid, memory.used MiB
    "0": ("GPU-aaa", 3), "1": ("GPU-bbb", 5), "2": ("GPU-ccc", 40000), "3": ("GPU-ddd", 2)}


def fake_smi(apps: tuple[str, ...] = ("GPU-ddd, 4242",)):
    def smi(query: str) -> str:
        if query.startswith("--query-gpu"):
            return "".join(f"{i}, {u}, {m}\n" for i, (u, m) in GPUS.items())
        return "".join(a + "\n" for a in apps)
    return smi


def test_busy_gpus_are_those_with_memory_or_processes():
    assert sched.gpu_status(fake_smi()) == {"0": False, "1": False, "2": True, "3": True}
    assert sched.gpu_status(fake_smi(()), busy_mb=50000) == {"0": False, "1": False, "2": False, "3": False}


def test_job_names():
    assert sched.job_name("python -m elman train --level E1 --name e1_50m --minutes 10", 0) == "e1_50m"
    assert sched.job_name("python train.py --output out/run_a --level 1", 3) == "run_a"
    assert sched.job_name("python train.py --level=E88h4n32", 3) == "E88h4n32"
    assert sched.job_name("echo hi", 7) == "job7"


def _jobfile(tmp_path, lines):
    f = tmp_path / "jobs.txt"
    f.write_text("# a comment\n\n" + "\n".join(lines) + "\n")
    return f


def test_one_job_per_free_gpu_failures_recorded_and_rerun_is_safe(tmp_path):
    lines = [f"echo gpu=$CUDA_VISIBLE_DEVICES >> {tmp_path}/ran.txt; sleep 0.3  # --name a",
             f"echo gpu=$CUDA_VISIBLE_DEVICES >> {tmp_path}/ran.txt; exit 3  # --name b",
             f"echo gpu=$CUDA_VISIBLE_DEVICES >> {tmp_path}/ran.txt  # --name c"]
    jobs = sched.read_jobs(_jobfile(tmp_path, lines), tmp_path / "logs")
    assert [j.name for j in jobs] == ["a", "b", "c"]
    messages = []
    done = sched.run(jobs, ["0", "1", "2", "3"], status=lambda: sched.gpu_status(fake_smi()),
                     poll=0.02, echo=messages.append)
    assert [j.status for j in done] == ["ok", "failed", "ok"]
    assert {j.gpu for j in done} <= {"0", "1"}                 # 2 and 3 are busy
    assert done[1].exit_code == 3
    ran = (tmp_path / "ran.txt").read_text().split()
    assert sorted(ran) == sorted(f"gpu={j.gpu}" for j in done)
    log = Path(done[0].log).read_text().splitlines()
    assert log[0] == "# Job 0: a" and log[1] == "# GPU: " + done[0].gpu
    assert log[2].startswith("# Command: echo") and log[3].startswith("# Started: ")
    assert log[-1] == sched.OK_MARKER
    assert sched.OK_MARKER not in Path(done[1].log).read_text()
    s = sched.summary(done)
    assert (s["ok"], s["failed"], s["failed_names"]) == (2, 1, ["b"])

    again = sched.run(sched.read_jobs(_jobfile(tmp_path, lines), tmp_path / "logs"), ["0", "1"],
                      status=lambda: sched.gpu_status(fake_smi()), poll=0.02, echo=messages.append)
    assert [j.status for j in again] == ["skipped", "failed", "skipped"]   # only b ran again
    assert len((tmp_path / "ran.txt").read_text().split()) == 4


def test_all_gpus_busy_fails_the_jobs_without_running_them(tmp_path):
    jobs = sched.read_jobs(_jobfile(tmp_path, [f"touch {tmp_path}/x"]), tmp_path / "logs")
    done = sched.run(jobs, ["2", "3"], status=lambda: sched.gpu_status(fake_smi()), poll=0.02,
                     echo=lambda m: None)
    assert done[0].status == "failed" and not (tmp_path / "x").exists()


def test_cli_with_fake_nvidia_smi(tmp_path, monkeypatch, capsys):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n"
                   "  --query-gpu*) printf '0, GPU-a, 1\\n1, GPU-b, 70000\\n' ;;\n"
                   "  *) ;;\nesac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    jobs = _jobfile(tmp_path, ["echo one $CUDA_VISIBLE_DEVICES --name one",
                               "echo two $CUDA_VISIBLE_DEVICES --name two"])
    logs = tmp_path / "logs"
    assert cli(["sched", str(jobs), "--log-dir", str(logs), "--dry"]) == 0
    assert "DRY" in capsys.readouterr().out and not logs.exists()
    assert cli(["sched", str(jobs), "--log-dir", str(logs), "--poll", "0.02"]) == 0
    out = capsys.readouterr().out
    assert "summary: 2 ok, 0 failed" in out
    s = json.loads((logs / "summary.json").read_text())
    assert [d["gpu"] for d in s["details"]] == ["0", "0"]     # GPU 1 is busy
    assert "one 0" in (logs / "00_one.log").read_text()
    assert cli(["sched", str(jobs), "--log-dir", str(logs), "--poll", "0.02"]) == 0
    assert "2 skipped" in capsys.readouterr().out


def test_cli_without_nvidia_smi_needs_gpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sched.shutil, "which", lambda name: None)
    jobs = _jobfile(tmp_path, ["true --name t"])
    assert cli(["sched", str(jobs), "--log-dir", str(tmp_path / "l")]) == 1
    assert "give --gpus" in capsys.readouterr().out
    assert cli(["sched", str(jobs), "--gpus", "1", "--log-dir", str(tmp_path / "l"), "--poll", "0.02"]) == 0


def test_sigterm_is_passed_on_to_running_jobs(tmp_path):
    """sched forwards SIGTERM to its jobs, starts nothing more, and records them."""
    import signal
    import subprocess
    import sys
    import time
    jobs = _jobfile(tmp_path, [f"trap 'echo got-term; exit 143' TERM; touch {tmp_path}/started; "
                               f"while true; do sleep 0.05; done  # --name slow",
                               f"touch {tmp_path}/second  # --name second"])
    proc = subprocess.Popen([sys.executable, "-m", "elman", "sched", str(jobs), "--gpus", "1",
                             "--log-dir", str(tmp_path / "logs"), "--poll", "0.05"],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PATH": "/usr/bin:/bin"})
    deadline = time.time() + 60
    while not (tmp_path / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "got-term" in (tmp_path / "logs" / "00_slow.log").read_text()
    assert not (tmp_path / "second").exists()
    s = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert (s["failed"], s["pending"]) == (1, 1) and s["details"][0]["exit_code"] == 143


def test_stop_after_terminates_running_jobs_and_a_rerun_continues(tmp_path):
    """--stop-after: SIGTERM on a clock; the job resumes from its own state when run again."""
    counter = tmp_path / "n"
    job = (f"trap 'exit 143' TERM; n=$(cat {counter} 2>/dev/null || echo 0); "
           f"if [ $n -ge 1 ]; then echo resumed; exit 0; fi; echo 1 > {counter}; "
           f"while true; do sleep 0.05; done  # --name long")
    f = _jobfile(tmp_path, [job])
    first = sched.run(sched.read_jobs(f, tmp_path / "logs"), ["0"], poll=0.05, echo=lambda m: None,
                      stop_after=0.5)
    assert first[0].status == "failed" and first[0].exit_code == 143
    second = sched.run(sched.read_jobs(f, tmp_path / "logs"), ["0"], poll=0.05, echo=lambda m: None)
    assert second[0].status == "ok" and "resumed" in Path(second[0].log).read_text()
