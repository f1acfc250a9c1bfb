"""Properties of the E0/E1 references and layers on the CPU (the CUDA kernels are checked
against these references by tests/test_parity_gpu.py)."""
import pytest
import torch
import torch.nn.functional as F

from elman.families.dense import inputs
from elman import registry
from elman.core.spectral import RecurrentWeight
from elman.variants import e0, e1


def _inputs(level, T=5, B=3, D=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    names = ("x", "z", "w_x", "w_h", "b", "h0") if level == "E1" else \
        ("x", "w_x", "w_h", "w_g", "b", "b_g", "h0")
    return inputs.random_inputs(T, B, D, names, "cpu", g)


@pytest.mark.parametrize("level", ["E0", "E1"])
def test_reference_gradcheck_fp64(level):
    ref = registry.get(level)
    mod = e1 if level == "E1" else e0
    kw = _inputs(level, T=4, B=2, D=5)
    names = list(kw)
    assert ref.name == level
    assert torch.autograd.gradcheck(lambda *a: mod.reference(**dict(zip(names, a))),
                                    tuple(kw.values()), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("level", ["E0", "E1"])
def test_sequence_equals_step_by_step(level):
    mod = e1 if level == "E1" else e0
    kw = {k: v.detach() for k, v in _inputs(level, T=7).items()}
    full, h_full = mod.reference(**kw)
    h, outs = kw["h0"], []
    for t in range(7):
        step = {k: (v[t:t + 1] if k in ("x", "z") else v) for k, v in kw.items()}
        step["h0"] = h
        out, h = mod.reference(**step)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(h, h_full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("level", ["E0", "E1"])
def test_recurrence_matches_torch_rnn(level):
    """The state recurrence of E0 and E1 is torch.nn.RNN(tanh) with W_ih = W_x, b_ih = b."""
    mod = e1 if level == "E1" else e0
    kw = {k: v.detach() for k, v in _inputs(level, T=6, B=2, D=4).items()}
    rnn = torch.nn.RNN(4, 4, nonlinearity="tanh").double()
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(kw["w_x"])
        rnn.weight_hh_l0.copy_(kw["w_h"])
        rnn.bias_ih_l0.copy_(kw["b"])
        rnn.bias_hh_l0.zero_()
    hs, h_last = rnn(kw["x"], kw["h0"][None])
    out, h = mod.reference(**kw)
    torch.testing.assert_close(h, h_last[0])
    gate = kw["z"] if level == "E1" else kw["x"] @ kw["w_g"].t() + kw["b_g"]
    torch.testing.assert_close(out, hs * F.silu(gate))


def test_bad_inputs_raise_clear_errors():
    kw = {k: v.detach() for k, v in _inputs("E1").items()}
    with pytest.raises(ValueError, match="backend"):
        e1.cell(**kw, backend="triton")
    with pytest.raises(TypeError, match="float64; the kernels take float32, bfloat16"):
        e1.cell(**kw, backend="cuda")
    with pytest.raises((ValueError, RuntimeError), match="CUDA"):
        e1.cell(**{k: v.float() for k, v in kw.items()}, backend="cuda")
    layer = e1.E1(6, backend="reference")
    with pytest.raises(ValueError, match=r"\[B, T, dim=6\]"):
        layer(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="B >= 1 and T >= 1"):
        layer(torch.randn(0, 3, 6))
    with pytest.raises(ValueError, match="h0 must be"):
        layer(torch.randn(2, 3, 6), torch.randn(1, 6))
    with pytest.raises(ValueError, match="inner width"):
        e1.E1(6, expansion=0.1, backend="reference")
    with pytest.raises(ValueError, match="path"):
        e1.E1(6, path="fast")


def test_reference_checks_table():
    """The chapters' CPU checks of a reference: gradcheck passes, steps equal the sequence."""
    from elman.harness import parity
    for entry in registry.variants():
        text = parity.reference_checks(entry.name)
        assert "| pass |" in text and "FAIL" not in text
        assert float(text.rsplit("|", 2)[-2]) < 1e-12


@pytest.mark.parametrize("mode", ["spectral_norm", "none", "scaled_orthogonal"])
def test_recurrent_weight_modes(mode):
    torch.manual_seed(0)
    rw = RecurrentWeight(32, mode, radius=0.9)
    for _ in range(30):  # power iteration converges over calls
        w = rw()
    if mode == "spectral_norm":
        assert torch.linalg.matrix_norm(w.detach(), ord=2).item() == pytest.approx(0.9, rel=1e-3)
        assert rw.u.dtype == torch.float32 and "u" in rw.state_dict()
    elif mode == "scaled_orthogonal":
        sv = torch.linalg.svdvals(w.detach())
        assert torch.allclose(sv, torch.full_like(sv, torch.sigmoid(torch.tensor(-0.01)).item()), atol=1e-5)
    w.sum().backward()
    assert any(p.grad is not None for p in rw.parameters())
    with pytest.raises(ValueError, match="r_h_mode"):
        RecurrentWeight(4, "orthogonal")


@pytest.mark.parametrize("level", ["E0", "E1"])
@pytest.mark.parametrize("expansion,use_conv", [(1.0, False), (2.0, False), (1.5, True)])
def test_layer_shapes_params_and_backward(level, expansion, use_conv):
    entry = registry.get(level)
    layer = entry.layer(24, expansion, backend="reference", use_conv=use_conv)
    n = sum(p.numel() for p in layer.parameters())
    D = int(24 * expansion)
    assert n == entry.layer_params(24, expansion) + (5 * D if use_conv else 0)
    y = torch.randn(2, 7, 24, requires_grad=True)
    out, h = layer(y)
    assert out.shape == (2, 7, 24) and h.shape == (2, D)
    out.square().mean().backward()
    assert y.grad is not None and all(p.grad is not None for p in layer.parameters())


def test_layer_h0_carries_state():
    layer = e1.E1(16, backend="reference").eval()  # eval: the power-iteration vector stays put
    y = torch.randn(2, 8, 16)
    full, h = layer(y)
    first, h4 = layer(y[:, :4])
    second, h8 = layer(y[:, 4:], h4)
    torch.testing.assert_close(torch.cat([first, second], 1), full)
    torch.testing.assert_close(h8, h)


def test_registry_levels_resolve():
    assert registry.get("1") is registry.get("e1") is registry.get(1)
    assert registry.get("0").name == "E0"
    with pytest.raises(KeyError, match="registered levels"):
        registry.get("E999")
