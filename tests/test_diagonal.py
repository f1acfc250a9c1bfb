"""The diagonal family on the CPU: level names, parameter counts, initialisation, the
references (fp64 gradcheck, sequence vs. single steps), validation before any launch, and the
kernel's schedule emulated in PyTorch (the step functors' hand-derived backward walked in
reverse with the carried dh, per-sequence parameter partial sums summed over B) through each
variant's CUDA-path Python against its reference."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from elman import registry
from elman.core.entry import Shape, rel_error
from elman.families.diagonal import inputs, op
from elman.harness import parity

LEVELS = ("34", "61", "61b", "61c", "62", "62b", "62c", "64", "65", "67", "67d", "68", "68i")
ENTRIES = registry.entries(family="diagonal")
by_name = pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)


def test_every_level_is_registered():
    for level in LEVELS:
        assert registry.get(level).family == "diagonal", level
    assert registry.get("67d") is registry.get("67")


@by_name
@pytest.mark.parametrize("dim,expansion", [(32, 1.0), (48, 2.0)])
def test_layer_params(entry, dim, expansion):
    layer = entry.layer(dim, expansion=expansion, backend="reference")
    assert sum(p.numel() for p in layer.parameters()) == entry.layer_params(dim, expansion)


def test_initialisation():
    D = 64

    def layer(level):
        torch.manual_seed(0)
        return registry.get(level).layer(D, backend="reference")
    e34 = layer("34")
    assert 0.9 <= e34.d_vec.min() and e34.d_vec.max() <= 0.99 and (e34.b == 0).all()
    for level in ("61", "62b", "64", "65", "67", "68", "68i"):
        assert (layer(level).b_a == 2.0).all(), level
    assert (layer("62").b_k == -2.0).all() and (layer("62b").b_k == -2.0).all()
    assert (layer("65").d_h == 0.5).all() and (layer("67").d_a == 0.1).all()
    e68, e68i = layer("68"), layer("68i")
    assert (e68.d_g == 0.5).all() and (e68.b_g == 0).all() and (e68i.b_g == 0.5).all()
    bound = math.sqrt(6.0 / (2 * D))
    assert layer("61b").w_v.abs().max() <= 0.1 * bound + 1e-7 < layer("61").w_v.abs().max()


@by_name
def test_reference_checks(entry):
    table = parity.reference_checks(entry.name)
    assert "FAIL" not in table
    err = float(table.strip().splitlines()[-1].split("|")[-2])
    assert err < 1e-12


@by_name
def test_layer_runs_on_reference(entry):
    torch.manual_seed(0)
    layer = entry.layer(32, expansion=1.5, backend="reference")
    y = torch.randn(2, 7, 32)
    out, h = layer(y)
    assert out.shape == (2, 7, 32) and h.shape == (2, 48) and torch.isfinite(out).all()
    out2, _ = layer(y, h)
    assert not torch.allclose(out, out2)


# ---- validation before any launch --------------------------------------------------------
def _cpu_case(T=3, B=2, D=8, dtype=torch.float32):
    x = torch.randn(T, B, D, dtype=dtype)
    w, b = torch.randn(D, D, dtype=dtype), torch.randn(D, dtype=dtype)
    return x, w, b


def test_cuda_cell_on_cpu_raises_before_loading():
    x, w, b = _cpu_case()
    with pytest.raises(ValueError, match="CUDA"):
        op.cell("e61", x, ((w, b), (w, b)))


@pytest.mark.parametrize("bad", ["shape_w", "shape_b", "shape_param", "shape_h0", "empty_T",
                                 "empty_B", "dtype", "mixed_dtype", "rank"])
def test_cell_validation(bad):
    x, w, b = _cpu_case()
    q, h0 = torch.rand(8), torch.zeros(2, 8)
    exc = ValueError
    if bad == "shape_w":
        w = torch.randn(8, 9)
    elif bad == "shape_b":
        b = torch.randn(9)
    elif bad == "shape_param":
        q = torch.rand(7)
    elif bad == "shape_h0":
        h0 = torch.zeros(3, 8)
    elif bad == "empty_T":
        x = x[:0]
    elif bad == "empty_B":
        x, h0 = x[:, :0], None
    elif bad == "dtype":
        x, w, b = x.double(), w.double(), b.double()
        exc = TypeError
    elif bad == "mixed_dtype":
        w = w.to(torch.bfloat16)
        exc = TypeError
    elif bad == "rank":
        x = x[0]
    with pytest.raises(exc):
        op.cell("e65", x, ((w, b), (w, b)), (q,), h0)


def test_scan_validation():
    u = torch.randn(4, 2, 8)
    with pytest.raises(TypeError):
        op.scan("e61", u, ())
    with pytest.raises(ValueError, match="at least one"):
        op.scan("e61", [], ())
    with pytest.raises(ValueError, match="shape"):
        op.scan("e61", [u, torch.randn(4, 2, 9)], ())
    with pytest.raises(ValueError, match="CUDA"):
        op.scan("e61", [u, u], ())


def test_bytes_formulas():
    # E61 forward at T=2, B=1, D=1 in bf16: 2 inputs x 2 steps read, h0 read, 2 outputs, 3 h_all
    assert op.forward_bytes(2, 0, 2, 1, 1, 2) == 2 * (4 + 1 + 2 + 3)
    assert op.backward_bytes(2, 0, 2, 1, 1, 2) == 2 * (4 + 2 + 3 + 1 + 4 + 1)


# ---- the kernel's schedule, emulated ---------------------------------------------------------
def _sig(x):
    return torch.sigmoid(x)


def _e34(hp, u, q):
    return torch.tanh(u[0] + q[0] * hp)


def _e34_b(hp, h, u, q, dh):
    dpre = dh * (1 - h * h)
    return dpre * q[0], [dpre], [dpre * hp]


def _e61(hp, u, q):
    a = _sig(u[0])
    return a * (hp - u[1]) + u[1]


def _e61_b(hp, h, u, q, dh):
    a = _sig(u[0])
    return dh * a, [dh * (hp - u[1]) * a * (1 - a), dh * (1 - a)], []


def _e61b(hp, u, q):
    return _sig(u[0]) * hp + u[1]


def _e61b_b(hp, h, u, q, dh):
    a = _sig(u[0])
    return dh * a, [dh * hp * a * (1 - a), dh], []


def _e61c(hp, u, q):
    a, v = _sig(u[0]), torch.tanh(u[0])
    return a * (hp - v) + v


def _e61c_b(hp, h, u, q, dh):
    a, v = _sig(u[0]), torch.tanh(u[0])
    return dh * a, [dh * ((hp - v) * a * (1 - a) + (1 - a) * (1 - v * v))], []


def _e62(hp, u, q):
    k, v = _sig(u[0]), torch.tanh(u[1])
    return k * (v - hp) + hp


def _e62_b(hp, h, u, q, dh):
    k, v = _sig(u[0]), torch.tanh(u[1])
    return dh * (1 - k), [dh * (v - hp) * k * (1 - k), dh * k * (1 - v * v)], []


def _e62b(hp, u, q):
    a, k, v = _sig(u[0]), _sig(u[1]), torch.tanh(u[2])
    return a * (1 - k) * hp + k * v


def _e62b_b(hp, h, u, q, dh):
    a, k, v = _sig(u[0]), _sig(u[1]), torch.tanh(u[2])
    return dh * a * (1 - k), [dh * (1 - k) * hp * a * (1 - a), dh * (v - a * hp) * k * (1 - k),
                              dh * k * (1 - v * v)], []


def _e62c(hp, u, q):
    k, v = _sig(u[0]), torch.tanh(u[0])
    return k * (v - hp) + hp


def _e62c_b(hp, h, u, q, dh):
    k, v = _sig(u[0]), torch.tanh(u[0])
    return dh * (1 - k), [dh * ((v - hp) * k * (1 - k) + k * (1 - v * v))], []


def _hdep(scale):
    def fwd(hp, u, q):
        a, v = _sig(u[0]), torch.tanh(scale(q) * hp + u[1])
        return a * (hp - v) + v

    def bwd(hp, h, u, q, dh):
        a, v = _sig(u[0]), torch.tanh(scale(q) * hp + u[1])
        dpre = dh * (1 - a) * (1 - v * v)
        dq = [dpre * hp] if q else []
        return dh * a + dpre * scale(q), [dh * (hp - v) * a * (1 - a), dpre], dq
    return fwd, bwd


def _e67(hp, u, q):
    a, v = _sig(u[0] + q[0] * hp), torch.tanh(u[1])
    return a * (hp - v) + v


def _e67_b(hp, h, u, q, dh):
    a, v = _sig(u[0] + q[0] * hp), torch.tanh(u[1])
    dpre = dh * (hp - v) * a * (1 - a)
    return dh * a + dpre * q[0], [dpre, dh * (1 - a) * (1 - v * v)], [dpre * hp]


def _self_gate(inverse):
    def s_of(hp):
        return -hp.abs() if inverse else hp

    def fwd(hp, u, q):
        a, w, g = _sig(u[0]), torch.tanh(u[1]), _sig(q[0] * s_of(hp) + q[1])
        v = w * g
        return a * (hp - v) + v

    def bwd(hp, h, u, q, dh):
        a, w, s = _sig(u[0]), torch.tanh(u[1]), s_of(hp)
        g = _sig(q[0] * s + q[1])
        v = w * g
        dv = dh * (1 - a)
        dgpre = dv * w * g * (1 - g)
        ds = -torch.sign(hp) if inverse else torch.ones_like(hp)
        return (dh * a + dgpre * q[0] * ds, [dh * (hp - v) * a * (1 - a), dv * g * (1 - w * w)],
                [dgpre * s, dgpre])
    return fwd, bwd


STEP_MATH = {
    "e34": (_e34, _e34_b), "e61": (_e61, _e61_b), "e61b": (_e61b, _e61b_b), "e61c": (_e61c, _e61c_b),
    "e62": (_e62, _e62_b), "e62b": (_e62b, _e62b_b), "e62c": (_e62c, _e62c_b),
    "e64": _hdep(lambda q: 1.0), "e65": _hdep(lambda q: q[0]), "e67": (_e67, _e67_b),
    "e68": _self_gate(False), "e68i": _self_gate(True),
}
COUNTS = {"e34": (1, 1), "e61": (2, 0), "e61b": (2, 0), "e61c": (1, 0), "e62": (2, 0),
          "e62b": (3, 0), "e62c": (1, 0), "e64": (2, 0), "e65": (2, 1), "e67": (2, 1),
          "e68": (2, 2), "e68i": (2, 2)}


def _dout_dh(h):
    s = torch.sigmoid(h)
    return h * s * (2 + h * (1 - s))


class EmulatedScan(torch.autograd.Function):
    """The kernel's schedule in PyTorch: forward walk saving h_all; backward walk from T - 1
    to 0 with dh carried, h_t taken from the previous iteration, parameter partial sums per
    element of [B, D] (summed over B afterwards, as op.DiagonalScan does)."""

    @staticmethod
    def forward(ctx, step, k, h0, *tensors):
        us, qs = tensors[:k], [q.to(h0.dtype) for q in tensors[k:]]
        fwd, _ = STEP_MATH[step]
        h, hs, outs = h0, [h0], []
        for t in range(us[0].shape[0]):
            h = fwd(h, [u[t] for u in us], qs)
            hs.append(h)
            outs.append(h * F.silu(h))
        ctx.save_for_backward(torch.stack(hs), *us, *qs)
        ctx.step, ctx.k = step, k
        return torch.stack(outs), h

    @staticmethod
    def backward(ctx, d_out, d_hT):
        h_all, *rest = ctx.saved_tensors
        us, qs = rest[:ctx.k], rest[ctx.k:]
        _, bwd = STEP_MATH[ctx.step]
        T = h_all.shape[0] - 1
        dh, h = d_hT.clone(), h_all[T]
        du = [torch.empty_like(u) for u in us]
        partial = [torch.zeros_like(h) for _ in qs]
        for t in range(T - 1, -1, -1):
            hp = h_all[t]
            total = dh + d_out[t] * _dout_dh(h)
            dh, g, dq = bwd(hp, h, [u[t] for u in us], qs, total)
            for i, gi in enumerate(g):
                du[i][t] = gi
            for j, dqj in enumerate(dq):
                partial[j] += dqj
            h = hp
        return None, None, dh, *du, *[p.sum(0) for p in partial]


def _emulated_scan(step, inputs_, params=(), h0=None):
    k, p = COUNTS[step]
    assert (len(inputs_), len(params)) == (k, p)
    if h0 is None:
        h0 = inputs_[0].new_zeros(inputs_[0].shape[1:])
    return EmulatedScan.apply(step, len(inputs_), h0, *inputs_, *params)


@by_name
@pytest.mark.parametrize("shape", [Shape(1, 1, 3), Shape(9, 3, 5)], ids=str)
def test_emulated_kernel_matches_reference(entry, shape, monkeypatch):
    monkeypatch.setattr(op, "scan", _emulated_scan)
    monkeypatch.setattr(op.validate, "devices", lambda tensors, cuda=True: None)
    monkeypatch.setattr(op, "DTYPES", (torch.float64,))
    g = torch.Generator().manual_seed(3)
    kw = inputs.reference_inputs(entry.reference, shape, "cpu", g)
    fast_in = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    module = __import__(entry.layer.__module__, fromlist=["x"])
    cell = next(c for n, c in vars(module).items() if n.startswith("cell") and callable(c)
                and getattr(module, "reference" + n[4:], None) is entry.reference)
    ref = entry.reference(**kw)
    fast = cell(**fast_in, backend="cuda")
    grads = [torch.randn(r.shape, dtype=torch.float64, generator=g) for r in ref]
    torch.autograd.backward(ref, grads)
    torch.autograd.backward(fast, grads)
    for f, r in zip(fast, ref):
        assert rel_error(f, r) < 1e-12
    for name, t in kw.items():
        assert rel_error(fast_in[name].grad, t.grad) < 1e-10, name


def test_step_table_names_match_entries():
    assert {e.epilogue for e in ENTRIES} == set(STEP_MATH)


def test_report_from_records():
    from elman.families.diagonal import report

    def rec(variant, impl, B, D, T, fwd, bwd):
        m = {"fwd_ms": {"median": fwd}, "fwdbwd_ms": {"median": fwd + bwd}, "copy_gbs": 3000.0,
             "fwd_gbs": 2000.0, "bwd_gbs": 1500.0, "fwd_pct_copy": 66.7, "bwd_pct_copy": 50.0}
        if impl == "cuda:scan":
            m["bwd_ms"] = {"median": bwd}
        return {"kind": "bench", "variant": variant, "impl": impl,
                "params": {"measure": "cell", "B": B, "D": D, "T": T, "dtype": "bfloat16"}, "metrics": m}
    recs = [rec("E61", "cuda:scan", 64, 2048, 512, 0.2, 0.4), rec("E61", "fla:chunk_hgrn", 64, 2048, 512, 0.3, 0.9),
            rec("E61", "cuda:scan", 4, 1024, 512, 0.1, 0.2), rec("E34", "cuda:scan", 64, 2048, 512, 0.2, 0.3)]
    cells = report.cells(recs, ["E61"])
    assert len(cells) == 3
    table = report.bandwidth_table(cells)
    assert table.count("\n") == 4 and "fla:chunk_hgrn" in table
    text = report.headline(cells)
    assert "misses the 60 % target" in text and "2.0x as fast as fla:chunk_hgrn" in text
    assert "No record" in report.headline(cells, {"B": 1, "D": 1, "T": 1})
    par = [{"kind": "parity", "variant": "E61", "impl": "cuda:scan", "params": {"dtype": dt},
            "metrics": {"max_fwd": e, "max_bwd": 2 * e}} for dt, e in (("float32", 1e-7), ("bfloat16", 3e-3))]
    closing = report.closing_table(recs + par, ["E61", "E34"])
    assert "| E61 | cuda:scan | 2.0e-07 | 6.0e-03 | 0.200 | 67 | 0.400 | 50 |" in closing
    assert "| E61 | fla:chunk_hgrn |  |  | 0.300" in closing and "| E34 | cuda:scan | - | - |" in closing
    import matplotlib
    matplotlib.use("Agg")
    assert report.plot_bandwidth(cells, 512) is not None
