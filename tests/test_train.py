"""`elman train` on the committed test slice with a tiny E1 (reference backend, CPU)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from elman.training import train
from elman.cli import main as cli
from elman.training.data import TEST_SLICE
from elman.training.lm import LadderLM

TINY = ["--level", "E1", "--dim", "32", "--depth", "2", "--batch", "8", "--seq", "32",
        "--lr", "3e-3", "--warmup", "10", "--val-windows", "16", "--data", str(TEST_SLICE)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cfg(*flags: str) -> dict:
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    return train.config(p.parse_args(list(flags)))


def elman(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "elman", *args], env=ENV, capture_output=True,
                          text=True, timeout=300, **kw)


def log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_trains_resumes_and_reports(tmp_path, capsys):
    """The CI check: train, resume, loss goes down, log, checkpoint, results table."""
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    common = ["--runs-dir", str(runs), "--checkpoint-dir", str(ckpt)]
    first = elman("train", *TINY, *common, "--name", "tiny", "--steps", "20", "--log-every", "5",
                  "--val-every", "10", "--save-every", "10", "--resume", "auto")  # nothing to resume
    assert first.returncode == 0, first.stderr
    assert "VAL:" in first.stdout and "bits/byte" in first.stdout and "kernels: reference x2" in first.stdout
    assert train.load_checkpoint(ckpt)["step"] == 20
    second = elman("train", "--resume", str(ckpt), "--steps", "40", *common)
    assert second.returncode == 0, second.stderr

    log = log_lines(runs / "train" / "tiny" / "log.jsonl")
    starts = [e for e in log if e["kind"] == "start"]
    assert [s["step"] for s in starts] == [0, 20] and starts[1]["resumed_from"]
    steps = [e["step"] for e in log if e["kind"] == "train"]
    assert steps == list(range(5, 41, 5))
    losses = [e["loss"] for e in log if e["kind"] == "train"]
    assert losses[-1] < losses[0] - 0.5
    vals = {e["step"]: e["val_loss"] for e in log if e["kind"] == "val"}
    assert set(vals) == {10, 20, 30, 40} and vals[40] < vals[10]
    end = [e for e in log if e["kind"] == "end"][-1]
    assert end["steps"] == 40 and len(end["losses"]) == 40
    assert end["last100"] == pytest.approx(sum(end["losses"]) / 40)
    for e in log:
        if e["kind"] == "train":
            assert e["tokens_per_s"] > 0 and e["grad_norm"] > 0
            assert e["lr"] == pytest.approx(3e-3 * min(1, e["step"] / 10))  # warmup 10

    state = train.load_checkpoint(ckpt)
    assert state["step"] == 40 and set(state["model"]) == set(state["model_train"])
    model = LadderLM("E1", 32, 2, backend="reference")
    model.load_state_dict(state["model"])

    assert cli(["results", str(runs), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["steps"] == 40 and rows[0]["level"] == "E1"
    assert rows[0]["last100"] == pytest.approx(end["last100"])
    assert cli(["results", str(runs)]) == 0
    assert "| tiny | E1 |" in capsys.readouterr().out


def test_resume_continues_bit_for_bit(tmp_path):
    """12 steps straight == 5 steps + resume + 7, with validations and checkpoints between."""
    base = [*TINY, "--val-every", "3", "--log-every", "2"]
    a = train.run(cfg(*base, "--steps", "12", "--runs-dir", str(tmp_path / "a"),
                      "--checkpoint-dir", str(tmp_path / "ca"), "--save-every", "100"))
    train.run(cfg(*base, "--steps", "5", "--runs-dir", str(tmp_path / "b"),
                  "--checkpoint-dir", str(tmp_path / "cb"), "--save-every", "4"))
    b = train.run(cfg("--resume", str(tmp_path / "cb"), "--steps", "12"))
    la = [e for e in log_lines(tmp_path / "a" / "train" / "E1_d32x2" / "log.jsonl") if e["kind"] == "end"]
    lb = [e for e in log_lines(tmp_path / "b" / "train" / "E1_d32x2" / "log.jsonl") if e["kind"] == "end"]
    assert la[-1]["losses"] == lb[-1]["losses"] and len(la[-1]["losses"]) == 12
    assert a["last100"] == b["last100"] and a["val_loss"] == b["val_loss"]
    wa = train.load_checkpoint(tmp_path / "ca")["model_train"]
    wb = train.load_checkpoint(tmp_path / "cb")["model_train"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_nonfinite_loss_stops_before_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    forward = LadderLM.forward

    def poisoned(self, tokens):
        calls["n"] += 1
        out = forward(self, tokens)
        return out * float("nan") if calls["n"] == 8 and self.training else out

    monkeypatch.setattr(LadderLM, "forward", poisoned)
    c = cfg(*TINY, "--steps", "20", "--save-every", "3", "--val-every", "100",
            "--runs-dir", str(tmp_path / "runs"), "--checkpoint-dir", str(tmp_path / "ck"))
    with pytest.raises(train.NonFinite, match=r"non-finite loss at step 8 .*checkpoint.pt \(step 6\)"):
        train.run(c)
    state = train.load_checkpoint(tmp_path / "ck")
    assert state["step"] == 6 and len(state["losses"]) == 6
    assert not (tmp_path / "runs" / "records.jsonl").exists()
    last = log_lines(tmp_path / "runs" / "train" / "E1_d32x2" / "log.jsonl")[-1]
    assert last["kind"] == "stop" and last["reason"] == "nonfinite" and last["step"] == 7


def test_sigterm_writes_a_checkpoint_that_resume_auto_continues(tmp_path):
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    common = ["--runs-dir", str(runs), "--checkpoint-dir", str(ckpt)]
    proc = subprocess.Popen([sys.executable, "-m", "elman", "train", *TINY, *common,
                             "--steps", "100000", "--log-every", "1", "--val-every", "1000"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = runs / "train" / "E1_d32x2" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and '"kind": "train"' in log.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == train.EXIT_SIGTERM, err
    stop = log_lines(log)[-1]
    assert stop["kind"] == "stop" and stop["reason"] == "SIGTERM"
    step = train.load_checkpoint(ckpt)["step"]
    assert step == stop["step"] >= 1
    assert "--resume" in out
    again = elman("train", *TINY, *common, "--steps", str(step + 3), "--resume", "auto")
    assert again.returncode == 0, again.stderr
    assert train.load_checkpoint(ckpt)["step"] == step + 3


def test_corrupt_or_foreign_checkpoints_are_refused(tmp_path):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(train.TrainError, match="corrupt or truncated"):
        train.load_checkpoint(tmp_path)
    train.run(cfg(*TINY, "--steps", "2", "--runs-dir", str(tmp_path / "r"),
                  "--checkpoint-dir", str(tmp_path / "good")))
    blob = (tmp_path / "good" / "checkpoint.pt").read_bytes()
    bad.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(train.TrainError, match="corrupt or truncated"):
        train.load_checkpoint(bad)
    torch.save({"weights": torch.zeros(2)}, bad)
    with pytest.raises(train.TrainError, match="not an `elman train` checkpoint"):
        train.load_checkpoint(bad)
    with pytest.raises(train.TrainError, match="no checkpoint"):
        train.load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(train.TrainError, match="differ from it"):
        cfg("--resume", str(tmp_path / "good"), "--dim", "64")


def test_configuration_errors(tmp_path):
    with pytest.raises(train.TrainError, match="give a budget"):
        cfg(*TINY)
    with pytest.raises(train.TrainError, match="KEY=VALUE"):
        train.parse_options(["nokey"])
    assert train.parse_options(["r_h_mode=none", "use_conv=true", "d_conv=3", "x=1.5"]) == \
        {"r_h_mode": "none", "use_conv": True, "d_conv": 3, "x": 1.5}
    with pytest.raises(train.TrainError, match="does not exist"):
        train.run(cfg(*TINY, "--steps", "1", "--data", str(tmp_path / "none.txt")))
    r = elman("train", *TINY)
    assert r.returncode == 1 and "give a budget" in r.stderr


def test_weight_decay_spares_norms_biases_and_marked_parameters():
    m = LadderLM("E1", 16, 2, backend="reference")
    m.layers[0].w_x._no_weight_decay = True
    decay, keep = train.param_groups(m, 0.01)
    names = {id(p): n for n, p in m.named_parameters()}
    kept = {names[id(p)] for p in keep["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    assert kept == {"norms.0.weight", "norms.1.weight", "final_norm.weight", "layers.0.b",
                    "layers.1.b", "layers.0.w_x"}
    assert {"embedding.weight", "layers.1.w_x", "layers.0.w_h.weight", "layers.0.w_in",
            "layers.0.w_out"} <= decayed
    assert keep["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01
    assert train.no_weight_decay("layers.3.mixer.A_log", torch.nn.Parameter(torch.zeros(2)))
    assert train.no_weight_decay("layers.3.mixer.dt_bias", torch.nn.Parameter(torch.zeros(2)))


def test_minutes_budget_stops_on_the_clock(tmp_path):
    s = train.run(cfg(*TINY, "--minutes", "0.02", "--runs-dir", str(tmp_path / "r"),
                      "--checkpoint-dir", str(tmp_path / "c")))
    assert s["elapsed_s"] >= 1.2 and s["steps"] >= 2


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun not installed")
def test_torchrun_two_cpu_ranks_train_one_model(tmp_path):
    runs = tmp_path / "runs"
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2",
           "--master_port", "29517", "-m", "elman", "train", *TINY, "--steps", "6",
           "--log-every", "2", "--runs-dir", str(runs), "--checkpoint-dir", str(tmp_path / "c")]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((runs / "records.jsonl").read_text())
    assert rec["metrics"]["world_size"] == 2 and rec["metrics"]["tokens"] == 6 * 8 * 32 * 2
    assert train.load_checkpoint(tmp_path / "c")["step"] == 6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_training_on_gpu_through_the_cli(tmp_path):
    runs = tmp_path / "runs"
    r = elman("train", "--level", "E1", "--dim", "256", "--depth", "2", "--batch", "16", "--seq", "256",
              "--lr", "2e-3", "--warmup", "20", "--steps", "60", "--log-every", "10", "--val-windows", "32",
              "--data", str(TEST_SLICE), "--runs-dir", str(runs), "--checkpoint-dir", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((runs / "records.jsonl").read_text())
    assert rec["params"]["precision"] == "bf16" and rec["params"]["norm"] == "fused"
    assert rec["env"]["gpu"] and rec["metrics"]["peak_memory_mb"] > 0
    assert rec["metrics"]["last100"] < 5.0
