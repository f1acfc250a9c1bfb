"""`elman train` on the committed test slice with a tiny E1 (reference backend, CPU)."""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from elman.training import data, train
from elman.cli import main as cli
from elman.training.data import TEST_SLICE, ByteData
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
    assert rec["params"]["precision"] == "bf16" and rec["params"]["norm"] == "elman"  # the default on CUDA
    assert rec["env"]["gpu"] and rec["metrics"]["peak_memory_mb"] > 0
    assert rec["metrics"]["last100"] < 5.0
    layers = rec["metrics"]["kernel_paths"]["layers"]
    assert len(layers) == 2 and all(isinstance(x["forward"], dict) and x["forward"] for x in layers)
    assert rec["metrics"]["val_bits_se"] > 0 and rec["metrics"]["val_windows"] == ByteData(TEST_SLICE).val_tiles(256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_training_logs_the_persistent_path(tmp_path):
    """`--graph` (the issue-20 record's mode): every layer's forward and the dense backward run
    the persistent kernels inside the captured step, and the log says so after the first step."""
    runs = tmp_path / "runs"
    r = elman("train", "--level", "E1", "--dim", "256", "--depth", "2", "--batch", "8", "--seq", "128",
              "--steps", "12", "--log-every", "4", "--val-windows", "4", "--graph", "--name", "g",
              "--data", str(TEST_SLICE), "--runs-dir", str(runs), "--checkpoint-dir", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kernel paths:" in r.stdout + r.stderr
    line = [e for e in log_lines(runs / "train" / "g" / "log.jsonl") if e["kind"] == "kernels"][0]
    assert all(set(x["forward"].values()) == {"persistent"} for x in line["layers"])
    assert set(line["backward"].values()) == {"persistent"} and "persistent" in line["kernels"]


# ---------------------------------------------------------------------------------------
# Evaluation and the metric


def _steps(model, opt, n: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        model.loss(torch.randint(0, 256, (4, 33), generator=g)).backward()
        opt.step()
        opt.zero_grad()


def test_evaluation_uses_the_averaged_weights_and_switches_back():
    c = cfg(*TINY, "--steps", "1")
    model, opt = train.build(c, torch.device("cpu"))
    _steps(model, opt, 5)
    twin, twin_opt = train.build(c, torch.device("cpu"))
    twin.load_state_dict(model.state_dict())
    twin_opt.load_state_dict(opt.state_dict())
    twin_opt.eval()                                                # the library's own switch
    before = [p.detach().clone() for p in model.parameters()]
    with train.averaged_weights(model, opt):
        assert not model.training and not opt.param_groups[0]["train_mode"]
        inside = [p.detach().clone() for p in model.parameters()]
    assert all(torch.allclose(a, b) for a, b in zip(inside, twin.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(inside, before))
    assert model.training and opt.param_groups[0]["train_mode"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))   # bit for bit


def test_every_evaluation_in_a_run_is_on_averaged_weights(tmp_path, monkeypatch):
    seen = []
    evaluate = train.evaluate

    def spy(model, *args):
        seen.append(model.training)
        return evaluate(model, *args)

    monkeypatch.setattr(train, "evaluate", spy)
    switches = []
    for name in ("eval", "train"):
        method = getattr(train.AdamWScheduleFree, name)
        monkeypatch.setattr(train.AdamWScheduleFree, name,
                            lambda self, _m=method, _n=name: (switches.append(_n), _m(self))[1])
    train.run(cfg(*TINY, "--steps", "6", "--val-every", "3", "--save-every", "100",
                  "--runs-dir", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c")))
    assert seen == [False, False, False]                           # steps 3, 6 and the final one
    assert switches[0] == "train" and switches[1:] == ["eval", "train"] * ((len(switches) - 1) // 2)


def test_the_record_carries_the_headline_metric(tmp_path):
    runs = tmp_path / "r"
    s = train.run(cfg(*TINY, "--steps", "10", "--val-every", "5", "--log-every", "5",
                      "--runs-dir", str(runs), "--checkpoint-dir", str(tmp_path / "c")))
    rec = json.loads((runs / "records.jsonl").read_text())["metrics"]
    assert rec == json.loads(json.dumps(s))
    assert rec["val_bits"] == pytest.approx(rec["val_loss"] / math.log(2))
    assert rec["val_bits_se"] == pytest.approx(rec["val_se"] / math.log(2)) and rec["val_se"] > 0
    d = ByteData(TEST_SLICE)
    assert rec["val_windows"] == d.val_tiles(32)                   # the final evaluation: every tile
    vals = [e for e in log_lines(runs / "train" / "E1_d32x2" / "log.jsonl") if e["kind"] == "val"]
    assert [v["windows"] for v in vals] == [16, 16, d.val_tiles(32)]
    final = vals[-1]
    assert final["val_se"] == pytest.approx(final["window_sd"] / math.sqrt(final["windows"]))
    assert final["windows_needed"] == math.ceil((final["window_sd"] / train.SE_TARGET) ** 2)
    assert rec["val_per_source"] == final["per_source"] and set(final["per_source"]) == {"all"}
    assert rec["data_passes"] == pytest.approx(10 * 8 * 33 / d.val_start) and not rec["past_one_pass"]
    assert [layer["forward"] for layer in rec["kernel_paths"]["layers"]] == ["reference", "reference"]
    end = [e for e in log_lines(runs / "train" / "E1_d32x2" / "log.jsonl") if e["kind"] == "end"][-1]
    assert rec["last100"] == pytest.approx(sum(end["losses"]) / 10) == rec["last1000"]
    assert rec["kernels"] == "reference x2"
    kernels = [e for e in log_lines(runs / "train" / "E1_d32x2" / "log.jsonl") if e["kind"] == "kernels"]
    assert len(kernels) == 1 and kernels[0]["step"] == 1 and kernels[0]["kernels"] == "reference x2"
    assert kernels[0]["layers"] == rec["kernel_paths"]["layers"]


def test_results_headline_table(tmp_path, capsys):
    runs = tmp_path / "r"
    train.run(cfg(*TINY, "--steps", "4", "--runs-dir", str(runs), "--checkpoint-dir", str(tmp_path / "c")))
    rec = json.loads((runs / "records.jsonl").read_text())["metrics"]
    capsys.readouterr()
    assert cli(["results", str(runs), "--headline"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("| name | level | params | steps | val_bits | last100 | last1000 |")
    assert f"| {rec['val_bits']:.4f} ± {rec['val_bits_se']:.4f} |" in md[2]
    assert "| reference x2 |" in md[2] and f"| {rec['data_passes']:.2f} |" in md[2]


def test_a_run_past_one_pass_is_flagged(tmp_path):
    f = tmp_path / "small.bin"
    f.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    s = train.run(cfg(*TINY[:-2], "--data", str(f), "--steps", "30", "--val-windows", "0",
                      "--runs-dir", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c")))
    assert s["data_passes"] == pytest.approx(30 * 8 * 33 / ByteData(f).val_start)
    assert s["past_one_pass"]


def test_tokens_per_second_leave_evaluation_out(tmp_path, monkeypatch):
    evaluate = train.evaluate

    def slow(*args):
        time.sleep(1.0)
        return evaluate(*args)

    monkeypatch.setattr(train, "evaluate", slow)
    s = train.run(cfg(*TINY, "--steps", "8", "--val-every", "2", "--log-every", "2",
                      "--runs-dir", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c")))
    assert s["elapsed_s"] < 4.0                                    # 5 evaluations slept 5 s
    rates = [e["tokens_per_s"] for e in log_lines(tmp_path / "r" / "train" / "E1_d32x2" / "log.jsonl")
             if e["kind"] == "train"]
    assert min(rates) > 8 * 32 * 2 / 1.0                           # no interval holds a sleep
    assert s["tokens_per_s_mean"] == pytest.approx(8 * 8 * 32 / s["elapsed_s"])


def test_evaluation_reports_loss_per_source(tmp_path):
    rng = np.random.default_rng(1)
    a, b = b"ab" * 400, rng.integers(0, 256, 800, dtype=np.uint8).tobytes().replace(b"\x1e", b"x")
    train_part = rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()
    blob = train_part + b"\x1e" + a + b"\x1e" + b
    f = tmp_path / "two.txt"
    f.write_bytes(blob)
    off = len(train_part) + 1
    data.manifest_path(f).write_text(json.dumps({"bytes": len(blob), "val": {
        "offset": off, "sources": [["a", off, off + len(a)], ["b", off + len(a) + 1, len(blob)]]}}))
    d = ByteData(f)
    model = LadderLM("E1", 16, 1, backend="reference")
    r = train.evaluate(model, d, d.val_positions(32), 32, 8, torch.device("cpu"), contextlib.nullcontext)
    assert set(r["per_source"]) == {"a", "b"} and r["windows"] == (len(blob) - off - 1) // 32
    names, src = d.target_sources(d.val_positions(32), 32)
    n = [(src == k).sum() for k in range(2)]
    mixed = (r["per_source"]["a"] * n[0] + r["per_source"]["b"] * n[1]) / (n[0] + n[1])
    assert mixed == pytest.approx(r["val_loss"], abs=0.05)        # only the separator is in neither


def test_path_probe_records_every_layer(monkeypatch):
    import types
    from elman.training.paths import PathProbe, op_paths, summary
    fake = types.ModuleType("elman.families.fake.op")
    fake.last_path = {}
    monkeypatch.setitem(sys.modules, "elman.families.fake.op", fake)

    class Layer(torch.nn.Module):
        def __init__(self, path):
            super().__init__()
            self.path, self.backend, self.w = path, "cuda", torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            if self.path:
                fake.last_path["forward"] = self.path
                fake.last_path["backward"] = self.path
            return x * self.w

    class Baseline(Layer):
        impl = "library:triton"

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Layer("persistent"), Layer(None), Baseline(None), Layer("steps")])
    probe = PathProbe(model)
    x = torch.ones(2)
    for layer in model.layers:
        x = layer(x)
    x.sum().backward()
    r = probe.result()
    probe.close()
    assert "fake.op" in op_paths()
    assert [layer["forward"] for layer in r["layers"]] == [{"fake.op": "persistent"}, "pytorch",
                                                           "library:triton", {"fake.op": "steps"}]
    assert r["backward"] == {"fake.op": "steps"}
    assert summary(r) == "fake.op:persistent x1; pytorch x1; library:triton x1; fake.op:steps x1"
    assert not model.layers[0]._forward_hooks


def test_different_models_train_on_the_same_windows(tmp_path, monkeypatch):
    seen: dict[str, list] = {}

    class Recording(data.Batches):
        def __iter__(self):
            for step, x in super().__iter__():
                seen.setdefault(self.tag, []).append(x.clone())
                yield step, x

    for dim in ("32", "16"):
        Recording.tag = dim
        monkeypatch.setattr(train, "Batches", Recording)
        train.run(cfg(*TINY, "--dim", dim, "--steps", "5", "--runs-dir", str(tmp_path / dim),
                      "--checkpoint-dir", str(tmp_path / f"c{dim}")))
    assert len(seen["32"]) >= 5 and all(torch.equal(a, b) for a, b in zip(seen["32"][:5], seen["16"][:5]))
