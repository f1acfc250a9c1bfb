"""The dense family's variants on the CPU: each reference against a hand-unrolled step of its
formula, its layer's parameter count, the reference backend of its layer (forward, backward,
spectral normalisation on by default with the variant's radius and off by flag), the level
names, the tied weight's summed gradient, and the self gate's derivative as the kernels'
epilogue computes it."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from elman import registry
from elman.core.entry import Shape
from elman.families.dense import inputs
from elman.harness.parity import reference_checks

LEVELS = {"33": "E33", "36": "E36", "37": "E37", "37v2": "E37", "38": "E38", "39": "E39",
          "42": "E42", "56": "E56"}
NAMES = sorted(set(LEVELS.values()))
RADII = {"E33": 0.99, "E36": 0.95, "E37": 0.99, "E38": 0.99, "E39": 0.99, "E42": 0.999}


def sg(h):
    return h * F.silu(h)


# One step of each variant's formula, written out from VARIANTS.md section 2.
STEP = {
    "E33": lambda k, x, h: (lambda v: (torch.tanh(v), sg(torch.tanh(v))))(
        x @ k["w_x"].t() + h @ k["w_h"].t() + k["b"]),
    "E36": lambda k, x, h: (lambda v: (v, sg(v)))(x @ k["w_x"].t() + h @ k["w_h"].t() + k["b"]),
    "E37": lambda k, x, h: (lambda v: (torch.tanh(v), sg(torch.tanh(v))))(
        x @ k["w"].t() + h @ k["w"].t() + k["b"]),
    "E38": lambda k, x, h: (lambda v: (torch.tanh(v), sg(torch.tanh(v))))(x + h @ k["w_h"].t() + k["b"]),
    "E39": lambda k, x, h: (lambda v: (torch.tanh(v), sg(torch.tanh(v))))(x + h @ k["w_h"].t()),
    "E42": lambda k, x, h: (lambda v: (v, sg(v)))(x @ k["w"].t() + h @ k["w"].t() + k["b"]),
}


def _inputs(entry, T=5, B=3, D=7, seed=0):
    kw = inputs.reference_inputs(entry.reference, Shape(T, B, D), "cpu", torch.Generator().manual_seed(seed))
    return {k: v.detach() for k, v in kw.items()}


@pytest.mark.parametrize("level,name", sorted(LEVELS.items()))
def test_level_names_resolve(level, name):
    for spelling in (level, level.upper(), "E" + level, "e" + level):
        if spelling.lower().startswith("e") and spelling[1:] != name[1:]:
            continue
        assert registry.get(spelling).name == name


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_unrolled_steps(name):
    entry = registry.get(name)
    kw = _inputs(entry)
    out, hT = entry.reference(**kw)
    h = kw["h0"]
    for t in range(kw["x"].shape[0]):
        if name == "E56":
            D = h.shape[1]
            w = kw["w_xh"]
            h = torch.tanh(kw["x"][t] @ w[:, :D].t() + h @ w[:, D:].t() + kw["b"])
            o = h * F.silu(kw["z"][t])
        else:
            h, o = STEP[name](kw, kw["x"][t], h)
        torch.testing.assert_close(out[t], o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hT, h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_reference_checks_pass(name):
    table = reference_checks(name)
    assert "FAIL" not in table and "| pass |" in table


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim,expansion", [(16, 1.0), (24, 1.5), (32, 2.0)])
def test_layer_params_formula(name, dim, expansion):
    entry = registry.get(name)
    layer = entry.layer(dim, expansion=expansion, backend="reference")
    assert entry.layer_params(dim, expansion) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_reference_layer_runs_forward_and_backward(name):
    torch.manual_seed(0)
    layer = registry.get(name).layer(16, expansion=1.5, backend="reference")
    y = torch.randn(2, 5, 16)
    h0 = torch.randn(2, 24) * 0.1
    out, h = layer(y, h0)
    assert out.shape == (2, 5, 16) and h.shape == (2, 24)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    for n, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("name", sorted(RADII))
def test_spectral_norm_on_by_default_and_off_by_flag(name):
    cls = registry.get(name).layer
    layer = cls(16, backend="reference")
    rec = layer.w if hasattr(layer, "w") and not isinstance(layer.w, torch.nn.Parameter) else layer.w_h
    assert rec.mode == "spectral_norm" and rec.radius == RADII[name]
    for _ in range(30):  # the power iteration converges over calls
        w = rec()
    assert abs(torch.linalg.matrix_norm(w.detach(), ord=2).item() - RADII[name]) < 1e-3
    off = cls(16, backend="reference", r_h_mode="none")
    rec_off = off.w if hasattr(off, "w") and not isinstance(off.w, torch.nn.Parameter) else off.w_h
    assert rec_off.mode == "none" and rec_off() is rec_off.weight


@pytest.mark.parametrize("name", ["E37", "E42"])
def test_tied_weight_is_one_parameter_with_summed_gradient(name):
    entry = registry.get(name)
    layer = entry.layer(16, backend="reference", r_h_mode="none")
    assert not hasattr(layer, "w_x") and not hasattr(layer, "w_h")
    kw = {k: v.requires_grad_() for k, v in _inputs(entry, D=6).items()}
    out, h = entry.reference(**kw)
    g_out, g_h = torch.randn_like(out), torch.randn_like(h)
    (dw,) = torch.autograd.grad((out, h), kw["w"], (g_out, g_h))
    # The same math with two separate leaves: the tied gradient is their sum.
    w_x, w_h = (kw["w"].detach().clone().requires_grad_() for _ in range(2))
    hh, outs = kw["h0"], []
    for t in range(kw["x"].shape[0]):
        v = kw["x"][t] @ w_x.t() + hh @ w_h.t() + kw["b"]
        hh = torch.tanh(v) if name == "E37" else v
        outs.append(sg(hh))
    dx, dh = torch.autograd.grad((torch.stack(outs), hh), (w_x, w_h), (g_out, g_h))
    torch.testing.assert_close(dw, dx + dh)


def test_e56_is_one_weight_with_both_halves():
    layer = registry.get("E56").layer(16, backend="reference")
    assert layer.w.shape == (16, 32) and not hasattr(layer, "w_h")


def test_e39_has_no_input_weight_and_no_bias():
    names = {n for n, _ in registry.get("E39").layer(16, backend="reference").named_parameters()}
    assert names == {"w_in", "w_h.weight", "w_out"}
    names38 = {n for n, _ in registry.get("E38").layer(16, backend="reference").named_parameters()}
    assert names38 == {"w_in", "w_h.weight", "b", "w_out"}


@pytest.mark.parametrize("linear", [False, True])
def test_self_gate_backward_parts(linear):
    """The epilogue's backward (epilogues.cuh, SelfGate): with h = act(v) and
    out = h^2 sigmoid(h), d_out * dout/dh = d_out * h s (2 + h (1 - s)) and act'(v) from the
    stored h (1 - h^2 for tanh, 1 for the linear variants)."""
    v = torch.randn(50, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(50, dtype=torch.float64)
    h = v if linear else torch.tanh(v)
    (dv,) = torch.autograd.grad(sg(h), v, d_out)
    hd = h.detach()
    s = torch.sigmoid(hd)
    c = d_out * hd * s * (2 + hd * (1 - s))
    f = torch.ones_like(hd) if linear else 1 - hd * hd
    torch.testing.assert_close(dv, c * f)


@pytest.mark.parametrize("name", NAMES)
def test_cuda_cell_rejects_cpu_inputs_before_launch(name):
    entry = registry.get(name)
    kw = _inputs(entry, T=2, B=2, D=8)
    kw = {k: v.float() for k, v in kw.items()}
    cell = importlib.import_module(entry.layer.__module__).cell
    with pytest.raises((ValueError, TypeError), match="CUDA|cuda"):
        cell(**kw, backend="cuda")


def _cell_record(variant, impl, B, D, us):
    return {"kind": "bench", "variant": variant, "impl": impl,
            "params": {"measure": "cell", "B": B, "D": D},
            "metrics": {"per_step_us": us, "fwdbwd_ms": {"median": 10 * us}}}


def test_compare_reads_the_ratio_to_e1_from_records():
    from elman.families.dense import compare
    recs = [_cell_record("E33", "cuda:persistent", 4, 512, 1.0),
            _cell_record("E1", "cuda:persistent", 4, 512, 1.0),
            _cell_record("E33", "cuda:steps+graph", 4, 512, 4.0),
            _cell_record("E33", "cuda:persistent", 16, 512, 1.5),
            _cell_record("E1", "cuda:persistent", 16, 512, 1.0)]
    rows = compare.versus(recs, "E33")
    assert [(r["B"], r["step_us"] / r["base_step_us"]) for r in rows] == [(4, 1.0), (16, 1.5)]
    assert rows[0]["graph_step_us"] == 4.0
    text = compare.speed_findings(recs, "E33")
    assert "(B, D) = (16, 512)" in text and "4.0x" in text
    assert "not yet recorded" in compare.speed_findings([], "E33")


def test_gradient_flow_linear_keeps_more_than_tanh():
    from elman.families.dense import compare
    flow = compare.gradient_flow({n: registry.get(n).reference for n in ("E33", "E36")}, lags=(4, 16))
    assert all(flow["E36"][lag] > flow["E33"][lag] for lag in (4, 16))


def test_closing_table_reads_parity_and_cells():
    from elman.families.dense import compare
    par = {"kind": "parity", "variant": "E33", "impl": "cuda:persistent",
           "params": {"dtype": "bfloat16"}, "metrics": {"max_fwd": 4e-3, "max_bwd": 6e-3}}
    recs = [par, _cell_record("E33", "cuda:persistent", 4, 1024, 1.1),
            _cell_record("E1", "cuda:persistent", 4, 1024, 1.0),
            _cell_record("E33", "cuda:steps+graph", 4, 1024, 5.5)]
    row = compare.closing_table(recs, ("E33",)).splitlines()[-1]
    assert row.startswith("| E33 | persistent | — | 6.0e-03 | 1.10 | 1.10 | 5.0 | — | — | — |")
