"""The training step (elman.training.step): the same arithmetic as the step written out, no
host read inside it, one host read per step in `elman train`, and the profiler's modes,
presets and table."""
from __future__ import annotations

import argparse

import pytest
import torch

from elman.core import records
from elman.training import profile, train
from elman.training.optim import AdamWScheduleFree
from elman.training.data import TEST_SLICE
from elman.training.lm import LadderLM
from elman.training.step import TrainStep


def _model_and_opt(seed: int = 0):
    torch.manual_seed(seed)
    model = LadderLM("E1", 32, 2, backend="reference")
    opt = AdamWScheduleFree(train.param_groups(model, 0.01), lr=3e-3, betas=(0.9, 0.95), warmup_steps=3)
    opt.train()
    return model, opt


def _batches(n: int, B: int = 4, T: int = 16):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (B, T + 1), generator=g) for _ in range(n)]


def test_step_matches_the_step_written_out():
    """Three steps of TrainStep leave the parameters, optimizer state and power-iteration
    vectors exactly where the plain sequence of calls leaves them."""
    ref_model, ref_opt = _model_and_opt()
    model, opt = _model_and_opt()
    step = TrainStep(model, opt, clip=0.5, dtype=None)
    for batch in _batches(3):
        ref_loss = ref_model.loss(batch)
        ref_loss.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        loss, norm = step(batch)
        step.update()
        assert torch.equal(loss, ref_loss.detach()) and torch.equal(norm, ref_norm)
    for (name, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(ref_opt.state[p]["z"], opt.state[q]["z"])
        assert q.grad is None  # eager mode frees the gradients after the optimizer step


def test_update_of_a_non_finite_step_changes_nothing():
    """A NaN loss (and so NaN gradients): the queued update leaves every parameter and the
    optimizer's z as they were; the next finite step updates again."""
    model, opt = _model_and_opt()
    step = TrainStep(model, opt, clip=1.0, dtype=None)
    first, second = _batches(2)
    step(first)
    step.update()
    before = [(p.detach().clone(), opt.state[p]["z"].clone()) for p in model.parameters()]
    hook = model.register_forward_hook(lambda module, args, out: out * float("nan"))
    loss, _ = step(second)
    step.update()
    hook.remove()
    assert torch.isnan(loss)
    assert all(torch.equal(p, y) and torch.equal(opt.state[p]["z"], z)
               for p, (y, z) in zip(model.parameters(), before))
    step(second)
    step.update()
    assert not all(torch.equal(p, y) for p, (y, _) in zip(model.parameters(), before))


def test_step_reads_nothing_on_the_host(monkeypatch):
    """No .item(), .tolist(), float() or bool() of a tensor inside the step or the update
    (on the GPU each would wait for the device)."""
    model, opt = _model_and_opt()
    step = TrainStep(model, opt, clip=1.0, dtype=None)
    batch = _batches(1)[0]
    step(batch)
    step.update()

    def refuse(*args, **kwargs):
        raise AssertionError("a host read of a tensor inside the training step")
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    loss, norm = step(batch)
    step.update()
    monkeypatch.undo()
    assert loss.dim() == 0 and norm.dim() == 0 and loss.item() > 0


def test_graph_mode_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    model, opt = _model_and_opt()
    with pytest.raises(RuntimeError, match="CUDA"):
        TrainStep(model, opt, 1.0, graph=True)


def _cfg(*flags: str) -> dict:
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    return train.config(p.parse_args(list(flags)))


TINY = ["--level", "E1", "--dim", "32", "--depth", "2", "--batch", "4", "--seq", "16",
        "--warmup", "10", "--val-windows", "4", "--val-every", "1000", "--data", str(TEST_SLICE)]


def test_trainer_reads_the_host_once_a_step(tmp_path, monkeypatch):
    """`elman train` reads the loss and gradient norm with one .tolist() a step (the check
    that stops at a non-finite step) and no .item()."""
    calls = {"tolist": 0, "item": 0}
    tolist, item = torch.Tensor.tolist, torch.Tensor.item

    def counted_tolist(self, *a, **k):
        calls["tolist"] += 1
        return tolist(self, *a, **k)

    def counted_item(self, *a, **k):
        calls["item"] += 1
        return item(self, *a, **k)
    cfg = _cfg(*TINY, "--steps", "7", "--runs-dir", str(tmp_path / "run"),
               "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", "1000")
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    out = train.run(cfg)
    monkeypatch.undo()
    assert out["steps"] == 7 and calls == {"tolist": 7, "item": 0}


def test_trainer_graph_flag_needs_one_cuda_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    cfg = _cfg(*TINY, "--steps", "2", "--graph", "--runs-dir", str(tmp_path / "run"),
               "--checkpoint-dir", str(tmp_path / "ckpt"))
    with pytest.raises(train.TrainError, match="CUDA graph"):
        train.run(cfg)


def test_profile_preset_is_the_issue_configurations():
    assert profile.PRESETS["issue20"] == (("E0", 1280, 6, 1.0, 64), ("E1", 1280, 6, 1.0, 64),
                                          ("E42", 1280, 6, 1.0, 64), ("E1", 640, 20, 2.0, 32))
    assert profile.category("gemv2T_kernel_val<int, int, __nv_bfloat16>") == "spectral norm (gemv, dot)"
    assert profile.category("void at::native::reduce_kernel<512, 1, NormTwoOps>") == \
        "elementwise and reductions"


def test_profile_goes_on_after_a_failed_configuration(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only failure path")
    assert profile.main(["--preset", "issue20", "--mode", "lean", "graph", "--brief"]) == 1
    out = capsys.readouterr().out  # 4 configurations x 2 setups x 2 modes, each named twice
    assert out.count("FAILED") == 2 * 16 and "CUDA" in out
    assert "E1 d640 x 20 e 2 B 32 before graph" in out and "E1 d640 x 20 e 2 B 32 after lean" in out



def test_profile_records_a_failed_configuration(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only failure path")
    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path))
    args = ["--level", "E1", "--dim", "32", "--depth", "1", "--batch", "2", "--seq", "8",
            "--mode", "trainer-graph", "--setup", "after", "--record", "--brief"]
    assert profile.main(args) == 1
    [rec] = records.read([tmp_path])
    assert rec["kind"] == "bench" and rec["params"]["measure"] == "lm_profile_failed"
    assert (rec["params"]["level"], rec["params"]["dim"], rec["params"]["mode"]) == ("E1", 32, "trainer-graph")
    assert rec["metrics"]["error"].startswith("RuntimeError: ") and "CUDA" in rec["metrics"]["error"]


def test_profile_before_setup_copies_more():
    """The `before` setup (batch-major stream, strided GEMM inputs, the spectral norm's three
    iterations a forward) issues more ops and copies than the model `elman train` builds; the
    counts come from one eager step on the CPU."""
    counts = {}
    for setup in profile.SETUPS:
        model, opt = _model_and_opt()
        profile.apply_setup(model, opt, setup)
        step = TrainStep(model, opt, clip=1.0, dtype=None)
        batch = _batches(1, B=4, T=32)[0]
        step(batch)
        step.update()
        counts[setup] = profile.host_ops(step, batch)
    before, after = counts["before"], counts["after"]
    assert set(after) == {"forward", "backward", "clip", "optimizer"}
    for phase in ("forward", "backward"):
        assert after[phase]["copies"] < before[phase]["copies"]
        assert after[phase]["copy_mb"] < before[phase]["copy_mb"]
    assert after["optimizer"]["copies"] == before["optimizer"]["copies"] == 0
    model, opt = _model_and_opt()
    profile.apply_setup(model, opt, "before")
    assert not opt.fused and not model.time_major and not model.layers[0].contiguous_input
    assert model.layers[0].w_h.step_iterations is None and not model.layers[0].w_h.fp32
    with pytest.raises(ValueError, match="setup"):
        profile.apply_setup(model, opt, "during")


def _rec(level: str, mode: str, step_ms: float, setup: str = "after") -> dict:
    phases = ({"forward+backward+clip": step_ms - 2, "optimizer": 2.0} if mode == "graph" else
              {"forward": 10.0, "backward": step_ms - 14, "clip": 1.0, "optimizer": 3.0})
    ops = {"forward": {"ops": 300, "copies": 40, "copy_mb": 500.0},
           "backward": {"ops": 500, "copies": 50, "copy_mb": 700.0}}
    return {"variant": level, "params": {"dim": 1280, "depth": 6, "expansion": 1.0, "B": 64, "T": 512,
                                         "mode": mode, "setup": setup},
            "metrics": {"phase_ms": {**phases, "step": step_ms}, "tokens_per_s": 32768 / step_ms * 1000,
                        "kernel_ms_total": step_ms - 1, "idle_ms": 1.0, "spectral_forward_ms": 0.4,
                        "kernel_ms_by_category": {"recurrence": 20.0, "gemm": 10.0},
                        "largest_kernels_ms": [["gemm_a", 9.0]], "host_ops": ops}}


def test_profile_comparison_has_a_row_per_setup_and_mode():
    table = profile.comparison([_rec("E1", "trainer", 40.0, "before"), _rec("E1", "graph", 38.0)])
    lines = table.splitlines()
    assert len(lines) == 3 and "tokens/s" in lines[0] and "recurrence" in lines[0] and "copy MB" in lines[0]
    assert "before" in lines[1] and "trainer" in lines[1] and "819,200" in lines[1] and "20.00" in lines[1]
    assert "after" in lines[2] and "graph" in lines[2] and "36.00 (all)" in lines[2]
    assert " 90 " in lines[2] and " 1200 " in lines[2]  # copies and MB of the step's two phases
    text = profile.summary(_rec("E1", "graph", 38.0))
    assert "mode graph, setup after" in text and "GPU idle in a step 1.00 ms" in text
    assert "forward 300 / 40 / 500" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_step_matches_the_eager_step():
    """Forward, backward and clipping replayed from a CUDA graph give the eager step's losses,
    norms and parameters over three steps (the same kernels on the same tensors)."""
    from elman.training import memory

    results = []
    for graph in (False, True):
        model, opt, _, cfg = memory.setup("E1", 256, 2, batch=2, seq=64)
        step = TrainStep(model, opt, cfg["grad_clip"], graph=graph)
        g = torch.Generator(device="cuda").manual_seed(3)
        out = []
        for _ in range(3):
            batch = torch.randint(0, 256, (2, 65), device="cuda", generator=g)
            loss, norm = step(batch)
            out.append((loss.clone(), norm.clone()))
            step.update()
        results.append((out, [p.detach().clone() for p in model.parameters()]))
    (eager, p_eager), (graphed, p_graph) = results
    for (a, b), (c, d) in zip(eager, graphed):
        torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(d, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(p_eager, p_graph):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("setup", profile.SETUPS)
@pytest.mark.parametrize("mode", profile.MODES)
def test_profile_runs_every_mode(mode, setup):
    rec = profile.lm_profile_record("E1", 256, 2, batch=2, seq=64, steps=3, mode=mode, setup=setup)
    m = rec["metrics"]
    assert rec["params"]["mode"] == mode and m["tokens_per_s"] > 0 and m["kernel_ms_total"] > 0
    assert rec["params"]["setup"] == setup
    assert m["spectral_forward_ms"] > 0 and m["idle_ms"] >= 0
    assert all(m["host_ops"][phase]["ops"] > 0 for phase in ("forward", "backward", "clip", "optimizer"))
