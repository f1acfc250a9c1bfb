"""CPU checks of E70-E74 and E14: references against hand-unrolled steps, fp64 gradcheck, the
gated kernels' schedule (checkpoints, recompute, hand-derived backward) against autograd of each
variant's reference through the variant's mapping onto the op, layers on the schedule against
the reference, options changing outputs, level names, parameter counts and errors before launch."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.families.matrix import gated, gated_op
from elman.variants import e14, e70, e71, e72, e73, e74
from test_matrix import _fp64_by_default  # noqa: F401 (an autouse fixture)


def _inputs(ref, T=6, B=2, H=2, n=4, v=None, seed=0):
    return ref.make_inputs(T, B, H, n, v or n, "cpu", torch.Generator().manual_seed(seed))


def _plain(kw):
    return {k: t.detach() for k, t in kw.items()}


LEVELS = ["70", "70n32", "70n128", "71", "71n32", "71n128", "72", "72s", "72i", "73", "73c", "73r",
          "73f", "73cp", "74v2", "74v2-delta", "74v2-residual", "74v2-ntm", "74v2-retrieved_gate",
          "74v2-ema", "74v2-delta-input", "74v2-ema-input", "14"]


@pytest.mark.parametrize("level", LEVELS)
def test_every_level_name_builds_and_counts_its_parameters(level):
    entry = registry.get(level)
    layer = entry.layer(48, expansion=1.5, backend="reference").eval()  # SN keeps u in eval
    assert sum(p.numel() for p in layer.parameters()) == entry.layer_params(48, 1.5)
    y = torch.randn(2, 3, 48)
    out, S = layer(y)
    assert out.shape == y.shape and torch.isfinite(out).all()
    out2, _ = layer(y[:, :2])
    torch.testing.assert_close(out2, out[:, :2])  # causal


def test_e70_matches_hand_unrolled_steps():
    kw = _plain(_inputs(e70.reference))
    o, S_T = e70.reference(**kw)
    S = kw["h0"].clone()
    for t in range(6):
        for b in range(2):
            for h in range(2):
                S[b, h] = kw["lam"][h] * S[b, h] + torch.outer(kw["v"][t, b, h], kw["k"][t, b, h])
                torch.testing.assert_close(o[t, b, h], S[b, h] @ kw["q"][t, b, h])
    torch.testing.assert_close(S_T, S)


def test_e71_e72_e73_match_hand_unrolled_steps():
    kw71, kw72, kw73 = (_plain(_inputs(r)) for r in (e71.reference, e72.reference, e73.reference_full))
    S71, S72, S73 = (kw["h0"].clone() for kw in (kw71, kw72, kw73))
    for t in range(6):
        for b in range(2):
            for h in range(2):
                k, v = kw71["k"][t, b, h], kw71["v"][t, b, h]
                a = torch.sigmoid(kw71["alpha_x"][t, b, h] + kw71["delta"][h] * (S71[b, h] @ k))
                S71[b, h] = a[:, None] * S71[b, h] + (1 - a)[:, None] * torch.outer(v, k)
                k, v, al = kw72["k"][t, b, h], kw72["v"][t, b, h], kw72["alpha"][t, b, h]
                g = torch.sigmoid(kw72["delta"][h] * (S72[b, h] @ k) + kw72["bias"][h])
                S72[b, h] = al[:, None] * S72[b, h] + (1 - al)[:, None] * torch.outer(v * g, k)
                k, v, z = kw73["k"][t, b, h], kw73["v"][t, b, h], kw73["z"][t, b, h]
                S73[b, h] = torch.tanh(S73[b, h] * torch.outer(z, z) + torch.outer(v, k))
    torch.testing.assert_close(e71.reference(**kw71)[1], S71)
    torch.testing.assert_close(e72.reference(**kw72)[1], S72)
    torch.testing.assert_close(e73.reference_full(**kw73)[1], S73)


def test_e14_matches_hand_unrolled_steps():
    kw = _plain(_inputs(e14.reference, n=3, v=5))
    o, M_T = e14.reference(**kw)
    M = kw["h0"].clone()
    for t in range(6):
        M = kw["dec"][t][..., :, None] * M + torch.einsum("bhi,bhj->bhij", kw["key"][t], kw["val"][t])
        torch.testing.assert_close(o[t], torch.einsum("bhij,bhj->bhi", M, kw["qry"][t]))
    torch.testing.assert_close(M_T, M)


REFERENCES = [e70.reference, e71.reference, e72.reference, e72.reference_inverse, e73.reference,
              e73.reference_row, e73.reference_full, e14.reference,
              *(e74.make_reference(s, u, p, nl) for s, u, p, nl in (
                  ("full", "delta", "no_z", "tanh"), ("full", "delta", "full", "linear"),
                  ("full", "simple", "no_z", "tanh"), ("full", "ema", "no_z", "linear"),
                  ("full", "residual", "no_z", "tanh"), ("full", "ntm", "no_z", "tanh"),
                  ("full", "retrieved_gate", "no_z", "tanh"), ("diagonal", "delta", "no_z", "tanh"),
                  ("diagonal", "simple", "no_z", "linear"), ("diagonal", "ema", "no_z", "tanh")))]


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: r.__name__)
def test_reference_gradcheck_fp64(ref):
    kw = _inputs(ref, T=3, B=1, H=1, n=3)
    names = list(kw)
    assert torch.autograd.gradcheck(lambda *a: ref(**dict(zip(names, a))), tuple(kw.values()))


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: r.__name__)
def test_sequence_equals_single_steps(ref):
    from elman.families.matrix.inputs import time_major
    kw = _plain(_inputs(ref, T=5))
    o, S_T = ref(**kw)
    S = kw["h0"]
    for t in range(5):
        step = {k: (x[t:t + 1] if time_major(k, x) else x) for k, x in kw.items()}
        ot, S = ref(**{**step, "h0": S})
        torch.testing.assert_close(ot[0], o[t])
    torch.testing.assert_close(S, S_T)


# (reference, the variant's cell, rule-specific keyword arguments)
SCHEDULED = [
    ("e70", e70.reference, lambda **a: e70.cell(**a, backend="schedule", checkpoint=3)),
    ("e71", e71.reference, lambda **a: e71.cell(**a, backend="schedule", checkpoint=3)),
    ("e72", e72.reference, lambda **a: e72.cell(**a, backend="schedule", checkpoint=4)),
    ("e72i", e72.reference_inverse, lambda **a: e72.cell(**a, inverse=True, backend="schedule", checkpoint=4)),
    ("e73", e73.reference, lambda **a: e73.cell(**a, backend="schedule", checkpoint=1)),
    ("e73r", e73.reference_row, lambda **a: e73.cell(**a, modulation="row", backend="schedule", checkpoint=3)),
    ("e73f", e73.reference_full, lambda **a: e73.cell(**a, modulation="full", backend="schedule", checkpoint=16)),
    ("e73cp", e73.reference, lambda **a: e73.cell(**a, backend="schedule", checkpoint=4)),
    ("e14", e14.reference, lambda **a: e14.cell(**a, backend="schedule", checkpoint=3)),
    ("e74-simple", e74.make_reference("full", "simple", "no_z", "tanh"),
     lambda **a: e74.cell(a, "full", "simple", "no_z", "tanh", backend="schedule", checkpoint=3)),
    ("e74-ema", e74.make_reference("full", "ema", "no_z", "linear"),
     lambda **a: e74.cell(a, "full", "ema", "no_z", "linear", backend="schedule", checkpoint=5)),
    ("e74-ntm", e74.make_reference("full", "ntm", "no_z", "tanh"),
     lambda **a: e74.cell(a, "full", "ntm", "no_z", "tanh", backend="schedule", checkpoint=3)),
    *((f"e74-diag-{u}-{nl}", e74.make_reference("diagonal", u, "no_z", nl),
       lambda u=u, nl=nl, **a: e74.cell(a, "diagonal", u, "no_z", nl, backend="schedule"))
      for u in e74.DIAGONAL_UPDATES for nl in e74.NONLINS),
]


@pytest.mark.parametrize("name,ref,fast", SCHEDULED, ids=[s[0] for s in SCHEDULED])
def test_gated_schedule_matches_reference_forward_and_backward(name, ref, fast):
    """The op's schedule (checkpoint K, chunks replayed, hand-derived backward) through the
    variant's mapping (transposed state, rules) against autograd of the variant's reference;
    T = 7 is not a multiple of K."""
    n, v = (4, 8) if name == "e14" else (8, 8)
    kw = _inputs(ref, T=7, B=2, H=2, n=n, v=v, seed=3)
    kw2 = {k: t.detach().clone().requires_grad_() for k, t in kw.items()}
    outs_ref, outs = ref(**kw), fast(**kw2)
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(o.shape, generator=g) for o in outs_ref]
    torch.autograd.backward(outs_ref, grads)
    torch.autograd.backward(outs, grads)
    for a, b in zip(outs, outs_ref):
        torch.testing.assert_close(a, b)
    for k in kw:
        torch.testing.assert_close(kw2[k].grad, kw[k].grad, msg=lambda m, k=k: f"grad {k}: {m}")


def test_gated_schedule_rules_match_autograd_of_the_rule():
    g = torch.Generator().manual_seed(0)
    for rule in gated.RULES:
        c, v, r, e, f = (torch.randn(3, 5, generator=g, requires_grad=True) for _ in range(5))
        c2 = torch.sigmoid(c)
        a, w = gated.rule_forward(rule, c2, v, r, e, f)
        da, dw = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
        dc, dv, dr, de, df = gated.rule_backward(rule, c2.detach(), v.detach(), r.detach(), e.detach(),
                                                 f.detach(), da, dw)
        want = torch.autograd.grad((a * da + w * dw).sum(), (c2, v, r, e, f), allow_unused=True)
        for got, exp in zip((dc, dv, dr, de, df), want):
            if exp is None:
                assert got is None or not got.abs().max() > 0
            else:
                torch.testing.assert_close(got, exp)


@pytest.mark.parametrize("level", ["70", "71", "72", "72i", "73", "73r", "73f", "73cp", "14",
                                   "E74-full-no_z-n32-simple", "E74-full-tied_kq-n32-ema-linear-input",
                                   "E74-diag-no_z-n32", "E74-diag-tied_kvq-n32-simple-linear",
                                   "E74-diag-full-n32-ema-input", "E74-full-no_z-n32-ntm-linear"])
def test_layer_on_schedule_matches_reference(level):
    torch.manual_seed(0)
    entry = registry.get(level)
    layer = entry.layer(16, backend="reference", **({} if level == "14" else {"n_state": 16})).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    y = torch.randn(2, 9, 16, requires_grad=True)
    h0 = (torch.rand(layer.state_shape(2)) - 0.5).requires_grad_()
    ref = layer(y, h0)
    grads_ref = torch.autograd.grad(sum(o.square().sum() for o in ref), [y, h0, *layer.parameters()],
                                    allow_unused=True)
    layer.backend = "schedule"
    fast = layer(y, h0)
    grads = torch.autograd.grad(sum(o.square().sum() for o in fast), [y, h0, *layer.parameters()],
                                allow_unused=True)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b)
    for a, b in zip(grads, grads_ref):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b)


def test_e73_and_e73cp_differ_only_in_checkpointing():
    torch.manual_seed(0)
    a, b = registry.get("73").layer(16, n_state=16), registry.get("73cp").layer(16, n_state=16)
    b.load_state_dict(a.state_dict())
    assert (a.checkpoint, b.checkpoint) == (1, 16)
    a.backend = b.backend = "schedule"
    y = torch.randn(2, 20, 16)
    torch.testing.assert_close(a(y)[0], b(y)[0])


@pytest.mark.parametrize("options", [
    dict(update="simple"), dict(update="ema"), dict(update="residual"), dict(update="ntm"),
    dict(update="retrieved_gate"), dict(proj="tied_kq"), dict(proj="tied_kvq"), dict(proj="full"),
    dict(nonlin="linear"), dict(gate="input"), dict(state="diagonal")])
def test_every_e74_option_changes_the_output(options):
    y = torch.randn(2, 6, 24)
    torch.manual_seed(0)
    base = e74.E74(24, backend="reference", n_state=8)
    torch.manual_seed(0)
    other = e74.E74(24, backend="reference", n_state=8, **options)
    assert not torch.allclose(base(y)[0], other(y)[0])


def test_e73_modulations_and_e72_gates_change_the_output():
    y = torch.randn(2, 6, 24)
    outs = []
    for mod in e73.MODULATIONS:
        torch.manual_seed(0)
        outs.append(e73.E73(24, backend="reference", n_state=8, modulation=mod)(y)[0])
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[0], outs[2])
    torch.manual_seed(0)
    a = e72.E72(24, backend="reference", n_state=8)(y)[0]
    torch.manual_seed(0)
    b = e72.E72(24, backend="reference", n_state=8, inverse=True)(y)[0]
    assert not torch.allclose(a, b)


def test_e70_decay_is_trained_and_clamped():
    layer = e70.E70(16, backend="reference", n_state=8)
    layer(torch.randn(2, 4, 16))[0].square().sum().backward()
    assert layer.lam.grad is not None and layer.lam.grad.abs() > 0
    with torch.no_grad():
        layer.lam.fill_(1.5)
    S = layer(torch.randn(1, 3, 16))[1]
    assert torch.isfinite(S).all()


def test_e70_spectral_norm_bounds_the_projections():
    layer = e70.E70(32, backend="reference", n_state=8)
    for w in (layer.w_k, layer.w_v):
        for _ in range(20):
            W = w()
        assert abs(torch.linalg.matrix_norm(W.double(), ord=2).item() - 0.5) < 1e-3
    off = e70.E70(32, backend="reference", n_state=8, spectral_norm=False)
    assert off.w_k() is off.w_k.weight and not hasattr(off.w_k, "u")


@pytest.mark.parametrize("level,what", [("74v2-residual", "update='residual'"),
                                        ("E74-full-full-n32", "proj='full'"),
                                        ("74v2-retrieved_gate", "update='retrieved_gate'")])
def test_e74_without_kernel_raises_naming_the_option(level, what):
    layer = registry.get(level).layer(16)
    with pytest.raises(ValueError, match=what):
        layer(torch.randn(1, 2, 16))
    layer.backend = "reference"
    assert torch.isfinite(layer(torch.randn(1, 2, 16))[0]).all()


def test_gated_op_validates_before_launch():
    kw = _plain(_inputs(e70.reference, n=8))
    q, k, v = (kw[x].float() for x in "qkv")
    c, h0 = torch.rand_like(v), torch.zeros(2, 2, 8, 8)
    with pytest.raises(ValueError, match="CUDA tensor"):
        gated_op.recurrence(q, k, v, c, h0, "decay", "linear")
    with pytest.raises(ValueError, match="n and v in"):
        gated_op.recurrence(q[..., :6], k[..., :6], v, c, h0[:, :, :6], "decay", "linear")
    with pytest.raises(ValueError, match="rule"):
        gated_op.recurrence(q, k, v, c, h0, "nope", "linear")
    with pytest.raises(ValueError, match="takes e"):
        gated_op.recurrence(q, k, v, c, h0, "retain", "linear")
    with pytest.raises(ValueError, match="c has shape"):
        gated_op.recurrence(q, k, v, c[:, :, :, :4], h0, "decay", "linear")
    with pytest.raises(ValueError, match="empty"):
        gated_op.recurrence(q[:0], k[:0], v[:0], c[:0], h0, "decay", "linear")
    with pytest.raises(ValueError, match="K must"):
        gated_op.recurrence(q, k, v, c, h0, "decay", "linear", K=0)
    with pytest.raises(TypeError, match="dtype"):
        gated_op.recurrence(q.half(), k.half(), v.half(), c, h0, "decay", "linear")


def test_layers_reject_bad_state_and_input():
    layer = registry.get("71").layer(16, n_state=8, backend="reference")
    with pytest.raises(ValueError, match="h0"):
        layer(torch.randn(1, 2, 16), torch.zeros(1, 4, 4))
    with pytest.raises(ValueError, match="B >= 1"):
        layer(torch.randn(0, 2, 16))
    with pytest.raises(ValueError, match="d_state"):
        e14.E14(16, d_state=0)


def test_per_head_inputs_of_a_wrong_shape_raise_clearly():
    kw = _plain(_inputs(e71.reference, n=8))
    with pytest.raises(ValueError, match=r"delta must be \[H, v\]"):
        e71.cell(**{**kw, "delta": kw["delta"][:, :4]}, backend="schedule")
    kw = _plain(_inputs(e70.reference, n=8))
    with pytest.raises(ValueError, match=r"lam must be \[H\]"):
        e70.cell(**{**kw, "lam": kw["lam"][:1]}, backend="schedule")


def test_ops_record_the_engine_they_ran():
    """`last_path` of the gated and diagonal ops (what `elman train` records for each layer)."""
    from elman.families.matrix import diagonal_op
    T, B, H, n = 5, 2, 2, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(T, B, H, n, generator=g, requires_grad=True) for _ in range(3))
    c = torch.rand(T, B, H, n, generator=g)
    gated_op.last_path.clear()
    o, S = gated_op.recurrence(q, k, v, c, torch.zeros(B, H, n, n), "decay", "linear", engine="schedule")
    assert gated_op.last_path == {"forward": "schedule"}
    (o.sum() + S.sum()).backward()
    assert gated_op.last_path == {"forward": "schedule", "backward": "schedule"}
    diagonal_op.last_path.clear()
    o, S = diagonal_op.recurrence(q, k, v, c, torch.zeros(B, H, n), "simple", engine="schedule")
    (o.sum() + S.sum()).backward()
    assert diagonal_op.last_path == {"forward": "schedule", "backward": "schedule"}
