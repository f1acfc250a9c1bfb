"""The spectral normalisation (elman.core.spectral): the specification's three power iterations
per call, the per-step schedule of training on the CUDA backend, fp32 under autocast, the
gradient through the scale, evaluation, checkpoints."""
from __future__ import annotations

import argparse
import io

import pytest
import torch

from elman.core import spectral
from elman.core.spectral import RecurrentWeight
from elman.training import train
from elman.training.lm import LadderLM


def _weight(D: int = 48, seed: int = 0, **kw) -> RecurrentWeight:
    torch.manual_seed(seed)
    return RecurrentWeight(D, "spectral_norm", radius=0.9, init_gain=1.0, **kw)


def _spec(w: torch.Tensor, u: torch.Tensor, iterations: int = 3):
    """(u, v) after the specification's iterations, both constants."""
    with torch.no_grad():
        return spectral.power_iteration(w, u, iterations)


def test_one_iteration_a_step_is_the_specification_spread_over_steps():
    """per_step converges u first (WARM_ITERATIONS from the stored u); then, with W fixed,
    3k training calls at one iteration each end where k calls of the specification from the
    same u end: the same iterations in the same order."""
    spec, stepped = _weight(), _weight()
    warm, _ = _spec(spec.weight.detach(), spec.u, spectral.WARM_ITERATIONS)
    assert spectral.per_step(stepped, 1) == 1 and stepped.step_iterations == 1
    assert torch.equal(stepped.u, warm)
    spec.u.copy_(warm)
    for _ in range(4):
        w_spec = spec()
    for _ in range(12):
        w_step = stepped()
    assert torch.equal(spec.u, stepped.u) and torch.equal(w_spec, w_step)


def test_the_first_step_already_normalises_the_largest_singular_value():
    """After per_step the first training call's sigma is within 1 % of the largest singular
    value (a Xavier matrix at D = 512, where three iterations from a random u are about 10 %
    low)."""
    torch.manual_seed(0)
    rw = RecurrentWeight(512, radius=0.99)
    true = torch.linalg.matrix_norm(rw.weight.detach(), 2)
    spec_w = rw()  # the specification's three iterations from the random u
    spectral.per_step(rw, 1)
    w = rw()
    for got, bound in ((w, 0.01), (spec_w, 0.2)):
        sigma = 0.99 * rw.weight.detach().norm() / got.detach().norm()
        assert abs(sigma - true) / true < bound
    assert abs(0.99 * rw.weight.detach().norm() / spec_w.detach().norm() - true) / true > 0.01


def test_sigma_estimate_converges_while_the_weight_moves():
    """Training-like: W moves a little every step; one iteration a step keeps sigma within
    1e-3 of the largest singular value after a few dozen steps."""
    rw = _weight(64)
    rw.step_iterations = 1
    g = torch.Generator().manual_seed(1)
    for _ in range(60):
        with torch.no_grad():
            rw.weight.add_(1e-3 * torch.randn(rw.weight.shape, generator=g))
        w = rw()
    true = torch.linalg.matrix_norm(rw.weight.detach(), 2)
    sigma = 0.9 * rw.weight.detach().norm() / w.detach().norm()  # w = W * 0.9 / sigma
    assert abs(sigma - true) / true < 1e-3
    assert torch.linalg.matrix_norm(w.detach(), 2).item() == pytest.approx(0.9, rel=1e-3)


def test_gradient_flows_through_the_scale():
    """d/dW of <G, W rho / |u^T W v|> with u, v the iteration's constants, in fp64."""
    rw = _weight(24).double()
    u0 = rw.u.double().clone()
    G = torch.randn(24, 24, dtype=torch.float64)
    (rw() * G).sum().backward()
    w = rw.weight.detach().clone().requires_grad_()
    u, v = _spec(w.detach(), u0)
    ref = w * 0.9 / ((u @ (w @ v)).abs() + 1e-8)
    (ref * G).sum().backward()
    torch.testing.assert_close(rw.weight.grad, w.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(rw.u.double(), u, atol=1e-7)  # training mode stored the new u (fp32)


def test_fp32_under_autocast():
    """Autocast changes nothing: the iterations, sigma and the scaled W stay fp32."""
    a, b = _weight(), _weight()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wa = a()
    wb = b()
    assert wa.dtype == torch.float32 and torch.equal(wa, wb) and torch.equal(a.u, b.u)


def test_evaluation_runs_the_specification_and_keeps_u():
    """eval(): three iterations from the stored u, whatever the training schedule, and u
    stays as it was."""
    rw = _weight()
    rw.step_iterations = 1
    rw()
    rw.eval()
    before = rw.u.clone()
    w = rw()
    u, v = _spec(rw.weight.detach(), before)
    expected = rw.weight.detach() * (0.9 / ((u @ (rw.weight.detach() @ v)).abs() + 1e-8))
    assert torch.equal(rw.u, before) and rw.iterations() == 3
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=0)


def test_checkpoint_keeps_u():
    torch.manual_seed(0)
    m = LadderLM("E1", 32, 2, backend="reference")
    for _ in range(3):
        m(torch.randint(0, 256, (2, 8)))
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    torch.manual_seed(1)
    other = LadderLM("E1", 32, 2, backend="reference")
    other.load_state_dict(torch.load(buf))
    for a, b in zip(spectral.spectral_weights(m), spectral.spectral_weights(other)):
        assert a.u.dtype == torch.float32 and torch.equal(a.u, b.u)
    m.eval(), other.eval()
    x = torch.randint(0, 256, (2, 8))
    assert torch.equal(m(x), other(x))


def _build(*flags: str):
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    cfg = train.config(p.parse_args(["--level", "E1", "--dim", "32", "--depth", "2", "--steps", "1",
                                     "--norm", "torch", *flags]))
    return train.build(cfg, torch.device("cpu"))[0]


def test_trainer_sets_the_schedule_on_the_cuda_backend_only():
    for model, expected in ((_build("--backend", "cuda"), 1),
                            (_build("--backend", "cuda", "--power-iterations", "3"), 3),
                            (_build("--backend", "reference"), None)):
        weights = spectral.spectral_weights(model)
        assert len(weights) == 2 and all(w.step_iterations == expected for w in weights)
    with pytest.raises(ValueError, match="positive"):
        spectral.per_step(torch.nn.Linear(2, 2), 0)
    with pytest.raises(train.TrainError, match="power-iterations"):
        _build("--power-iterations", "0")
