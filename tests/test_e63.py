"""E63 a/b/c/d on the CPU: level names, each reference against a step written out from its
formula, the harness's reference checks, the kernels' schedule (families/dense/delta.py's
emulation: stacked pre-activations, one recurrent GEMM, the carried dh) against autograd of
the reference, parameter counts and initialisation of the layers, and the CUDA cell's
errors before any launch."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.core.entry import Shape, rel_error
from elman.families.dense import delta, inputs
from elman.harness.parity import reference_checks
from elman.variants import e63

LEVELS = {"63": "E63", "63a": "E63", "E63a": "E63", "63b": "E63b", "63c": "E63c", "63d": "E63d"}
NAMES = ("E63", "E63b", "E63c", "E63d")
MODE = {"E63": "a", "E63b": "b", "E63c": "c", "E63d": "d"}


def _inputs(name, T=6, B=3, D=7, seed=0):
    entry = registry.get(name)
    kw = inputs.reference_inputs(entry.reference, Shape(T, B, D), "cpu", torch.Generator().manual_seed(seed))
    return {k: v.detach() for k, v in kw.items()}


def _step(mode, k, x, h):
    """One step written out from VARIANTS.md section 2, E63."""
    v = torch.tanh(h @ k["w_h"].t() + x @ k["w_x"].t() + k["b"])
    ga = x @ k["w_a"].t() + k["b_a"]
    if mode == "c":
        ga = ga + h @ k["u_a"].t()
    a = torch.sigmoid(ga)
    if mode == "a":
        h = a * h + (1 - a) * v
    elif mode == "d":
        h = h + a * v
    else:
        gb = x @ k["w_b"].t() + k["b_b"] + (h @ k["u_b"].t() if mode == "c" else 0)
        h = a * h + torch.sigmoid(gb) * v
    return h, h * h * torch.sigmoid(h)


@pytest.mark.parametrize("level,name", sorted(LEVELS.items()))
def test_level_names_resolve(level, name):
    assert registry.get(level).name == name
    assert registry.get(level.upper()).name == name


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_written_out_steps(name):
    kw = _inputs(name)
    out, hT = registry.get(name).reference(**kw)
    h = kw["h0"]
    for t in range(kw["x"].shape[0]):
        h, o = _step(MODE[name], kw, kw["x"][t], h)
        torch.testing.assert_close(out[t], o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hT, h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_reference_checks_pass(name):
    table = reference_checks(name)
    assert "| pass |" in table and "FAIL" not in table


@pytest.mark.parametrize("name", NAMES)
def test_kernel_schedule_matches_reference_and_autograd(name):
    """The op's forward and backward as the kernels schedule them, in fp64, against the
    reference and autograd through it (the stacked input side as the CUDA cell builds it)."""
    mode = MODE[name]
    kw = _inputs(name, T=9, B=4, D=6, seed=3)
    g3 = delta.CHANNELS[mode] == 3
    w_in = torch.cat([kw["w_x"], kw["w_a"]] + ([kw["w_b"]] if g3 else []))
    b_in = torch.cat([kw["b"], kw["b_a"]] + ([kw["b_b"]] if g3 else []))
    w_rec = torch.cat([kw["w_h"], kw["u_a"], kw["u_b"]]) if mode == "c" else kw["w_h"].clone()
    T, B, D = kw["x"].shape
    pre = (kw["x"].reshape(T * B, D) @ w_in.t() + b_in).view(T, B, -1)
    pre.requires_grad_()
    w_rec.requires_grad_()
    h0 = kw["h0"].clone().requires_grad_()
    out, h_all, act = delta.emulate_forward(mode, pre.detach(), w_rec.detach(), h0.detach())
    weights = {k: v for k, v in kw.items() if k not in ("x", "h0")}
    ref_out, ref_h = e63.delta_reference(mode, kw["x"], **weights, h0=kw["h0"])
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_all[-1], ref_h, rtol=1e-12, atol=1e-12)

    # autograd through the same math on (pre, W_rec, h0)
    g = torch.Generator().manual_seed(7)
    d_out = torch.randn(T, B, D, generator=g, dtype=torch.float64)
    d_hT = torch.randn(B, D, generator=g, dtype=torch.float64)
    a_out, a_hall, _ = delta.emulate_forward(mode, pre, w_rec, h0)
    torch.autograd.backward([a_out, a_hall[-1]], [d_out, d_hT])
    d_pre, dh0, dw_rec = delta.emulate_backward(mode, w_rec.detach(), h_all, act, d_out, d_hT)
    torch.testing.assert_close(d_pre, pre.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dh0, h0.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw_rec, w_rec.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim,expansion", [(16, 1.0), (24, 2.0), (10, 1.5)])
def test_layer_params_formula(name, dim, expansion):
    entry = registry.get(name)
    layer = entry.layer(dim, expansion=expansion, backend="reference")
    assert entry.layer_params(dim, expansion) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_initialisation(name):
    mode = MODE[name]
    layer = registry.get(name).layer(32, backend="reference")
    s = torch.linalg.svdvals(layer.w_h.detach())
    torch.testing.assert_close(s, torch.full_like(s, e63.W_H_SCALE[mode]), rtol=1e-5, atol=1e-5)
    assert torch.all(layer.b_a == e63.B_ALPHA[mode]) and torch.all(layer.b == 0)
    if mode in "bc":
        assert torch.all(layer.b_b == 0)
    if mode == "c":
        for u in (layer.u_a, layer.u_b):
            s = torch.linalg.svdvals(u.detach())
            torch.testing.assert_close(s, torch.ones_like(s), rtol=1e-5, atol=1e-5)
    assert not any("spectral" in n or "u_vec" in n for n, _ in layer.named_buffers())


@pytest.mark.parametrize("name", NAMES)
def test_reference_layer_runs_forward_and_backward(name):
    torch.manual_seed(0)
    layer = registry.get(name).layer(12, backend="reference")
    y = torch.randn(2, 5, 12)
    out, h = layer(y)
    assert out.shape == (2, 5, 12) and h.shape == (2, 12)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_cuda_cell_rejects_bad_input_before_launch(name):
    kw = {k: v.float() for k, v in _inputs(name, T=3, B=2, D=8).items()}
    cell = {"E63": e63.cell, "E63b": e63.cell_b, "E63c": e63.cell_c, "E63d": e63.cell_d}[name]
    if name == "E63c":
        with pytest.raises(ValueError, match="E63c has no persistent path"):
            cell(**kw, backend="cuda", path="persistent")
    else:
        with pytest.raises((ValueError, RuntimeError), match="CUDA|cuda"):
            cell(**kw, backend="cuda", path="persistent")
    with pytest.raises(ValueError, match="path"):
        cell(**kw, backend="cuda", path="grid")
    with pytest.raises((ValueError, RuntimeError), match="CUDA|cuda"):
        cell(**kw, backend="cuda", path="steps")
    with pytest.raises(ValueError, match="h0"):
        cell(**{**kw, "h0": torch.zeros(3, 8)}, backend="cuda")
    with pytest.raises(TypeError):
        cell(**{**kw, "w_h": kw["w_h"].double()}, backend="cuda")
    with pytest.raises(ValueError, match="empty"):
        cell(**{**kw, "x": kw["x"][:0]}, backend="cuda")


def test_op_paths_and_plan():
    """Without a GPU only the per-step paths run; E63c never has the persistent one, and fp32
    never does (the reasons are stated without loading the extension)."""
    for mode in "abcd":
        assert delta.paths(mode, 4, 1024, torch.float32) == ["graph", "steps"]
    assert delta.paths("c", 4, 1024, torch.bfloat16) == ["graph", "steps"]
    assert not delta.persistent_supported("c", 4, 1024, torch.bfloat16)[0]
    assert "bf16 only" in delta.persistent_supported("a", 4, 1024, torch.float32)[1]
    assert delta.plan("c", 4, 1024, torch.bfloat16, "auto") == "graph"
    assert delta.plan("a", 4, 1024, torch.float32, "auto") == "graph"
    with pytest.raises(ValueError, match="E63c has no persistent path"):
        delta.plan("c", 4, 1024, torch.bfloat16, "persistent")
    with pytest.raises(ValueError, match="bf16 only"):
        delta.plan("a", 4, 1024, torch.float32, "persistent")
    assert set(delta.PERSISTENT_EPILOGUE) == {"a", "b", "d"}
    with pytest.raises(ValueError, match="mode"):
        delta.check_mode("e")


@pytest.mark.parametrize("mode", ["a", "b", "d"])
def test_persistent_epilogue_schedule_matches_autograd(mode):
    """The persistent kernels' epilogue (h_{t-1} and the direct gradient carried per element,
    gate gradients dh q_i after the product, dh0 = W_h^T dv_0 + carry) in fp64 against
    autograd through the definition."""
    torch.manual_seed(3)
    T, B, D = 5, 3, 7
    G = delta.CHANNELS[mode]
    pre = torch.randn(T, B, G * D, dtype=torch.float64, requires_grad=True)
    w_h = (0.4 * torch.randn(D, D, dtype=torch.float64)).requires_grad_()
    h0 = (0.5 * torch.randn(B, D, dtype=torch.float64)).requires_grad_()
    out, h_all, v_all = delta.emulate_persistent_forward(mode, pre, w_h, h0)
    ref_out, _, _ = delta.emulate_forward(mode, pre, w_h, h0)
    torch.testing.assert_close(out, ref_out)
    d_out, d_hT = torch.randn(T, B, D, dtype=torch.float64), torch.randn(B, D, dtype=torch.float64)
    d_pre, dh0 = delta.emulate_persistent_backward(mode, w_h.detach(), h_all.detach(),
                                                   v_all.detach(), pre.detach(), d_out, d_hT)
    a_pre, a_h0 = torch.autograd.grad((out * d_out).sum() + (h_all[-1] * d_hT).sum(), (pre, h0))
    torch.testing.assert_close(d_pre, a_pre)
    torch.testing.assert_close(dh0, a_h0)


def _cell_record(variant, impl, B, D, us):
    return {"kind": "bench", "variant": variant, "impl": impl,
            "params": {"measure": "cell", "B": B, "D": D, "T": 512, "dtype": "bfloat16"},
            "metrics": {"per_step_us": us, "fwdbwd_ms": {"median": 1.0}}}


def test_versus_table_and_findings_read_the_records():
    from elman.families.dense import delta_bench
    recs = [_cell_record("E63", "cuda:steps+graph", 4, 1024, 12.0),
            _cell_record("E63c", "cuda:steps+graph", 4, 1024, 15.0),
            _cell_record("E1", "cuda:steps+graph", 4, 1024, 10.0),
            _cell_record("E1", "cuda:persistent", 4, 1024, 3.0),
            _cell_record("E63", "cuda:persistent", 4, 1024, 3.3)]
    table = delta_bench.versus_table(recs, ("E63", "E63c"))
    assert "| 1024 | 4 | 3.30 | — | 1.10 | — | 12.00 | 15.00 | 1.20 | 1.50 | 3.00 | 10.00 |" in table
    text = delta_bench.speed_findings(recs, ("E63", "E63c"))
    assert "E63c (graph path) costs 1.50x to 1.50x" in text and "4.00x" in text
    assert "E63 (persistent path) costs 1.10x to 1.10x of E1's persistent kernel" in text
    assert "not yet recorded" in delta_bench.speed_findings([], ("E63",))


def test_flow_references_take_the_dense_inputs_and_shift_the_gate_bias():
    refs = e63.flow_references()
    assert set(refs) == {"E63", "E63b", "E63c", "E63d", "E63a without W_h h"}
    kw = _inputs("E63")
    shifted = {**kw, "b_a": kw["b_a"] + e63.B_ALPHA["a"]}
    torch.testing.assert_close(refs["E63"](**kw)[0], e63.reference(**shifted)[0])
    plain = inputs.reference_inputs(refs["E63a without W_h h"], Shape(3, 2, 5), "cpu",
                                    torch.Generator().manual_seed(0))
    assert "w_h" not in plain and refs["E63a without W_h h"](**plain)[0].shape == (3, 2, 5)


def test_e63d_bf16_tolerance_covers_the_rounding_of_its_inputs():
    """Exact (fp64) arithmetic on bf16-rounded inputs against the fp64 result, at the parity
    shape with the longest T: E63d's gradient error exceeds the family's bf16 tolerance there
    (the reason for its own), E63a's stays well inside it."""
    shape = Shape(64, 4, 256)
    worst = {}
    for name in ("E63", "E63d"):
        entry = registry.get(name)
        kw = inputs.reference_inputs(entry.reference, shape, "cpu", torch.Generator().manual_seed(1))
        exact = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
        rounded = {k: v.detach().to(torch.bfloat16).double().requires_grad_() for k, v in kw.items()}
        a, b = entry.reference(**exact), entry.reference(**rounded)
        g = [torch.randn(t.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) for t in a]
        torch.autograd.backward(a, g)
        torch.autograd.backward(b, g)
        worst[name] = max(rel_error(rounded[k].grad, exact[k].grad) for k in kw)
    family = registry.get("E33").tolerance["bfloat16"].bwd
    own = registry.get("E63d").tolerance["bfloat16"].bwd
    assert worst["E63"] < family / 2 < family < worst["E63d"] < own / 1.5
