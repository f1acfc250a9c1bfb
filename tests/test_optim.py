"""The fused schedule-free AdamW (elman.training.optim) against the schedulefree library's
own step: the same parameters, state and group bookkeeping after steps through warmup, with
and without weight decay; its refusals; checkpoints and the train/eval switch unchanged."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import schedulefree
import torch

from elman.training.optim import AdamWScheduleFree

KW = dict(lr=3e-2, betas=(0.9, 0.95), warmup_steps=3, eps=1e-8)


def _params(seed: int = 0, device: str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(device)) for shape in ((7, 5), (5,), (3, 4, 2))]


def _groups(params):
    return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]


def _run(opt_class, steps: int, device: str = "cpu", **extra):
    params = _params(device=device)
    opt = opt_class(_groups(params), **KW, **extra)
    opt.train()
    g = torch.Generator().manual_seed(1)
    for k in range(steps):
        for i, p in enumerate(params):
            p.grad = None if (k == 1 and i == 2) else torch.randn(p.shape, generator=g).to(device)
        opt.step()
    return params, opt


def _same(fused, library, rtol: float):
    (ps, opt), (qs, ref) = fused, library
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=rtol, atol=rtol * 1e-2)
        for key in ("z", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], ref.state[q][key], rtol=rtol, atol=rtol * 1e-2)
    for a, b in zip(opt.param_groups, ref.param_groups):
        for key in ("k", "lr_max", "weight_sum", "scheduled_lr"):
            assert a[key] == pytest.approx(b[key], rel=1e-12), key


def test_fused_step_matches_the_library():
    """Six steps (three of warmup), two groups (weight decay 0.1 and 0), one parameter without
    a gradient on one step: parameters, z, exp_avg_sq and the group keys agree."""
    _same(_run(AdamWScheduleFree, 6), _run(schedulefree.AdamWScheduleFree, 6), rtol=1e-5)


def test_unfused_step_is_the_library_step():
    (ps, _), (qs, _) = _run(AdamWScheduleFree, 4, fused=False), _run(schedulefree.AdamWScheduleFree, 4)
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


def test_fused_step_leaves_the_gradient_alone():
    params, opt = _run(AdamWScheduleFree, 1)
    grads = [p.grad.clone() for p in params]
    opt.step()
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_a_step_that_is_not_finite_changes_nothing():
    """step(finite=False) leaves parameters, z and exp_avg_sq bit for bit, whatever the
    gradients hold (NaN here); the group's step count still advances."""
    params, opt = _run(AdamWScheduleFree, 2)
    params[0].grad[0, 0] = float("nan")
    before = [(p.clone(), opt.state[p]["z"].clone(), opt.state[p]["exp_avg_sq"].clone()) for p in params]
    opt.step(finite=torch.tensor(False))
    for p, (y, z, v) in zip(params, before):
        assert torch.equal(p, y) and torch.equal(opt.state[p]["z"], z) and torch.equal(opt.state[p]["exp_avg_sq"], v)
    assert opt.param_groups[0]["k"] == 3
    opt.step(finite=torch.tensor(True))
    assert not torch.equal(params[1], before[1][0])


def test_fused_step_refuses_what_it_does_not_take():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    p.grad = torch.ones_like(p)
    opt = AdamWScheduleFree([p], **KW)
    with pytest.raises(RuntimeError, match="train mode"):
        opt.step()
    opt.train()
    with pytest.raises(ValueError, match="fp32"):
        opt.step()


def test_checkpoint_and_averaged_weights_round_trip():
    """The state dict loads into the library's optimizer and back, and eval() / train() move
    the parameters to the averaged weights and back as the library's do."""
    params, opt = _run(AdamWScheduleFree, 5)
    state = opt.state_dict()
    qs = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ref = schedulefree.AdamWScheduleFree(_groups(qs), **KW)
    ref.load_state_dict(state)
    before = [p.detach().clone() for p in params]
    opt.eval()
    ref.eval()
    assert all(torch.equal(p, q) for p, q in zip(params, qs))
    opt.train()
    assert all(torch.allclose(p, b, rtol=1e-6, atol=1e-7) for p, b in zip(params, before))


def test_kernel_matches_the_pytorch_update_in_the_interpreter():
    """`_sf_adamw` under Triton's interpreter (CPU) against `_update`: sizes around BLOCK, one
    block's tail, both sides of lerp's 0.5 switch, with and without weight decay."""
    script = textwrap.dedent("""
        import torch
        from elman.training import optim
        for ckp1, decay, ok in ((0.25, 0.1, True), (0.75, 0.0, True), (0.25, 0.1, False)):
            g = torch.Generator().manual_seed(0)
            sizes = (1, 5, optim.BLOCK, optim.BLOCK + 3, 3 * optim.BLOCK - 1)
            a = [[torch.randn(n, generator=g) for n in sizes] for _ in range(4)]
            a[2] = [t.abs() for t in a[2]]
            if not ok:
                a[1][0][0] = float("nan")
            b = [[t.clone() for t in ts] for ts in a]
            before = [[t.clone() for t in ts] for ts in a]
            s, flag = torch.tensor([0.95, 0.3, 1e-8, decay, ckp1, -2e-2, 3e-2]), torch.tensor(ok)
            optim._update(*a, s, flag)
            optim._kernel_update(*b, s, flag, optim._Blocks(list(sizes), torch.device("cpu")))
            for ts, us, ws in zip(a, b, before):
                for t, u, w in zip(ts, us, ws):
                    torch.testing.assert_close(u, t, rtol=2e-6, atol=1e-7, equal_nan=True)
                    assert ok or torch.equal(t, w) or torch.isnan(w).any()
            assert ok or not torch.equal(a[0][1], a[3][1])
        print("ok")
        """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.gpu
def test_kernel_step_matches_the_library_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _same(_run(AdamWScheduleFree, 6, "cuda"), _run(schedulefree.AdamWScheduleFree, 6, "cuda"), rtol=1e-5)
