"""The two-GEMM family on the CPU: references, layers, registry entries, the op's per-step
loops and tape checkpoint/recompute schedule with the fused stages in PyTorch (stages.py)
against autograd through the references, E4's product normalisation, and validation."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.core.entry import DTYPES, Shape, rel_error, run_case
from elman.families.twogemm import inputs, op
from elman.harness import parity

LEVELS = ["4", "5", "66", "66r16", "66r64", "66r128", "67lr", "23", "23n32", "23n128"]
SHAPES = [(1, 1, 8), (7, 3, 10), (10, 2, 12), (17, 2, 6)]


@pytest.fixture
def emulated(monkeypatch):
    """The variants' cells with backend="cuda" run the op's loops on PyTorch stages."""
    def lowrank(mode, a, c, u, v, b, h0=None, path="auto"):
        h0 = a.new_zeros(a.shape[1:]) if h0 is None else h0
        return op.lowrank_emulated(mode, a, c, u, v, b, h0)

    def tape(x, z, w_x, w_h, w_wr, b, h0, tape0, path="auto"):
        return op.tape_emulated(x, z, w_x, w_h, w_wr, b, h0, tape0)
    monkeypatch.setattr(op, "lowrank_cell", lowrank)
    monkeypatch.setattr(op, "tape_cell", tape)
    monkeypatch.setattr(op, "paths", lambda *a, **k: ["steps"])


@pytest.mark.parametrize("level", LEVELS)
def test_entry(level):
    e = registry.get(level)
    assert e.family == "twogemm" and e.parity is not None and e.test_shapes
    assert registry.get("E" + level) is e


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("T,B,D", SHAPES)
def test_op_loops_match_reference(emulated, level, T, B, D):
    """Every output, final state and gradient of the op's loops (stages in PyTorch, fp64)
    against autograd through the reference, on the entry's parity inputs."""
    e = registry.get(level)
    n = 8 if level.startswith("23") else None
    g = torch.Generator().manual_seed(T * 100 + D)
    rank = {"66r16": 16, "66r64": 5, "66r128": 3}.get(level)
    kw = inputs.reference_inputs(e.reference, Shape(T, B, D, None, n), "cpu", g, rank)
    fast_cell = _cell_of(e)
    ref_in = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    fast_in = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    ref_out = e.reference(**ref_in)
    fast_out = fast_cell(**fast_in)
    assert len(ref_out) == len(fast_out)
    grads = [torch.randn(r.shape, dtype=torch.float64, generator=g) for r in ref_out]
    torch.autograd.backward(ref_out, grads)
    torch.autograd.backward(fast_out, grads)
    for f, r in zip(fast_out, ref_out):
        assert rel_error(f, r) < 1e-12
    errors = {k: rel_error(fast_in[k].grad, ref_in[k].grad) for k in kw}
    assert max(errors.values()) < 1e-10, errors


def _cell_of(entry):
    """What the entry's parity cases run: its cell with backend="cuda"."""
    return entry.parity(Shape(1, 1, 4, None, 8 if entry.name.startswith("E23") else None),
                        torch.float64, "cpu", torch.Generator().manual_seed(0))[0].fast


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("level", LEVELS)
def test_schedule_within_tolerance_in_each_dtype(emulated, level, dtype):
    """The op's loops with the stages in PyTorch, in fp32 and bf16 on the CPU (the rounding
    of every stored tensor as on the GPU), pass the registry's tolerances on the entry's
    first parity shapes through the harness's own comparison (run_case)."""
    e = registry.get(level)
    g = torch.Generator().manual_seed(0)
    for shape in e.test_shapes[:4]:
        for case in e.parity(shape, DTYPES[dtype], "cpu", g):
            errors = run_case(case, DTYPES[dtype], g)
            tol = e.tolerance[dtype]
            assert max(v for k, v in errors.items() if k.startswith("fwd:")) <= tol.fwd, (shape, errors)
            assert max(v for k, v in errors.items() if k.startswith("grad:")) <= tol.bwd, (shape, errors)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 9, 10, 16, 17])
def test_tape_schedule_any_length(T):
    """The checkpoint interval and the segment boundaries at every T near a square."""
    K = op.checkpoint_interval(T)
    assert K * K >= T and (K - 1) * (K - 1) < T
    e = registry.get("23")
    g = torch.Generator().manual_seed(T)
    kw = inputs.reference_inputs(e.reference, Shape(T, 2, 6, None, 3), "cpu", g)
    ref_in = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    fast_in = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    ref_out = e.reference(**ref_in)
    fast_out = op.tape_emulated(**fast_in)
    grads = [torch.randn(r.shape, dtype=torch.float64, generator=g) for r in ref_out]
    torch.autograd.backward(ref_out, grads)
    torch.autograd.backward(fast_out, grads)
    for f, r in zip(fast_out, ref_out):
        assert rel_error(f, r) < 1e-12
    for k in kw:
        assert rel_error(fast_in[k].grad, ref_in[k].grad) < 1e-10, k


@pytest.mark.parametrize("level", LEVELS)
def test_layer_runs_on_reference(level):
    e = registry.get(level)
    torch.manual_seed(0)
    layer = e.layer(32, expansion=1.5, backend="reference")
    y = torch.randn(2, 5, 32)
    out, h = layer(y)
    assert out.shape == (2, 5, 32) and torch.isfinite(out).all()
    assert sum(p.numel() for p in layer.parameters()) == e.layer_params(32, 1.5)
    out.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


@pytest.mark.parametrize("level", LEVELS)
def test_layer_emulated_matches_reference(emulated, level):
    """The layer with backend="cuda" (op loops on PyTorch stages) equals backend="reference"."""
    e = registry.get(level)
    torch.manual_seed(1)
    ref = e.layer(16, expansion=1.0, backend="reference").double()
    fast = e.layer(16, expansion=1.0, backend="cuda").double()
    fast.load_state_dict(ref.state_dict())
    ref.eval(), fast.eval()
    y = torch.randn(3, 6, 16, dtype=torch.float64)
    for a, b in zip(_flat(fast(y)), _flat(ref(y))):
        assert rel_error(a, b) < 1e-12


def _flat(outs):
    return [t for o in outs for t in (o if isinstance(o, tuple) else (o,))]


def test_e23_slots_per_level():
    for level, n in (("23", 8), ("23n32", 32), ("23n128", 128)):
        layer = registry.get(level).layer(16, backend="reference")
        assert layer.slots == n
        out, (w, tape) = layer(torch.randn(1, 2, 16))
        assert w.shape == (1, 16) and tape.shape == (1, n, 16)
        again, _ = layer(torch.randn(1, 2, 16), (w, tape))
        assert again.shape == out.shape


def test_e66_ranks_per_level():
    for level, r in (("66", 16), ("66r16", 16), ("66r64", 64), ("66r128", 128)):
        assert registry.get(level).layer(32, backend="reference").rank == r
    assert registry.get("66").layer(256, backend="reference").rank == 64
    assert registry.get("67lr").layer(256, backend="reference").rank == 32
    assert registry.get("4").layer(256, expansion=2.0, backend="reference").rank == 64
    assert registry.get("5").layer(256, backend="reference").rank == 32


def test_e4_product_norm():
    """E4's normalised product has spectral norm 0.95 (after the power iteration settles) and
    its gradient reaches U and V through the scale."""
    torch.manual_seed(0)
    layer = registry.get("4").layer(32, expansion=1.0, backend="reference").double()
    for _ in range(30):
        u, v = layer.norm(layer.u, layer.v)
    sigma = torch.linalg.matrix_norm((u @ v).detach(), ord=2)
    assert abs(sigma.item() - 0.95) < 1e-3
    layer.eval()
    def scaled(a, b):
        return layer.norm(a, b)
    assert torch.autograd.gradcheck(scaled, (layer.u.detach().clone().requires_grad_(),
                                             layer.v.detach().clone().requires_grad_()))


@pytest.mark.parametrize("D,r", [(48, 5), (32, 128), (100, 100)])
def test_product_norm_without_the_product(D, r):
    """The parity inputs' factor pairs are scaled by ||U V||_2 from their QR factors, which
    equals the norm of the formed product (r below, above and equal to D)."""
    g = torch.Generator().manual_seed(D + r)
    u = torch.randn(D, r, dtype=torch.float64, generator=g)
    v = torch.randn(r, D, dtype=torch.float64, generator=g)
    assert torch.isclose(inputs.product_norm(u, v), torch.linalg.matrix_norm(u @ v, ord=2),
                         rtol=1e-12, atol=0)


def test_reference_checks_low_rank():
    for level in ("4", "5", "66", "67lr"):
        table = parity.reference_checks(level)
        assert "| pass |" in table


@pytest.mark.parametrize("level", LEVELS)
def test_sequence_equals_steps_carrying_every_state(level):
    """The whole sequence equals T single steps carrying the state (E23: w and the tape)."""
    assert inputs.sequence_check(registry.get(level).reference) < 1e-12


def test_validation_before_launch():
    e = registry.get("23")
    kw = {k: v.detach().float() for k, v in inputs.reference_inputs(
        e.reference, Shape(3, 2, 8, None, 4), "cpu", torch.Generator().manual_seed(0)).items()}
    with pytest.raises(ValueError, match="CUDA"):
        op.tape_cell(**kw)
    big = {**kw, "tape0": torch.zeros(2, op.MAX_SLOTS + 1, 8)}
    with pytest.raises(ValueError, match="unsupported"):
        op.tape_cell(**big)
    with pytest.raises(ValueError, match="empty"):
        op.tape_cell(**{**kw, "x": kw["x"][:0]})
    with pytest.raises(ValueError, match="path must be one of"):
        op.plan("fused", 2, 8, torch.float32, rank=2)
    with pytest.raises(TypeError, match="dtype"):
        op.tape_cell(**{**kw, "b": kw["b"].double()})
    lw = {"a": torch.randn(3, 2, 8), "c": torch.randn(3, 2, 8), "u": torch.randn(8, 2),
          "v": torch.randn(2, 8), "b": torch.randn(8), "h0": torch.randn(2, 8)}
    with pytest.raises(ValueError, match="CUDA"):
        op.lowrank_cell("tanh_gate", **lw)
    with pytest.raises(ValueError, match="shape"):
        op.lowrank_cell("tanh_gate", **{**lw, "v": torch.randn(3, 8)})
    with pytest.raises(ValueError, match="mode"):
        op.lowrank_cell("nope", **lw)


# ---- the low-rank persistent kernels' schedule (schedule.py restates persistent.cu) ----------
def _lowrank_case(mode: int, T: int, B: int, D: int, r: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(T * 1000 + D + r)
    kw = dict(generator=g, dtype=dtype)
    u = torch.randn(D, r, **kw) / r ** 0.5
    v = torch.randn(r, D, **kw) / D ** 0.5
    s = (0.95 / torch.linalg.matrix_norm(u @ v, ord=2)).sqrt()
    return dict(a=torch.randn(T, B, D, **kw), c=torch.randn(T, B, D, **kw), u=u * s, v=v * s,
                b=0.1 * torch.randn(D, **kw), h0=torch.rand(B, D, **kw) - 0.5)


def _schedule(mode, x, d_out, d_hT, C, S, rounding=None):
    from elman.families.twogemm import schedule
    out, h_all, p_all, aux = schedule.lowrank_forward(mode, x["a"], x["c"], x["u"], x["v"],
                                                      x["b"], x["h0"], C, S, rounding)
    grads = schedule.lowrank_backward(mode, x["c"], x["u"], x["v"], h_all, p_all, aux, d_out,
                                      d_hT, C, S, rounding)
    return out, h_all[-1], grads


def _oracle(mode, x, d_out, d_hT):
    """autograd through the op's per-step loops (checked against the references above)."""
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    name = next(k for k, m in op.MODES.items() if m == mode)
    out, hT = op.lowrank_emulated(name, **leaves)
    grads = torch.autograd.grad((out, hT), [leaves[k] for k in ("a", "c", "u", "v", "b", "h0")],
                                (d_out, d_hT))
    return out.detach(), hT.detach(), grads


def test_schedule_cluster_shape_matches_plan():
    from elman.families.twogemm.schedule import cluster_shape
    assert [cluster_shape(D) for D in (8, 48, 64, 96, 128, 256, 512, 520, 1024, 2048)] == [
        (1, 64), (1, 64), (1, 64), (1, 128), (1, 128), (2, 128), (4, 128), (8, 128),
        (8, 128), (16, 128)]
    assert [cluster_shape(D, 320) for D in (48, 200, 520, 1160, 1280)] == [
        (1, 64), (2, 128), (5, 128), (10, 128), (10, 128)]
    assert cluster_shape(1280, 256) == (16, 128)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("T,B,D,r", [(1, 1, 48, 5), (5, 3, 200, 17), (4, 9, 300, 40),
                                     (3, 2, 520, 64), (2, 3, 1160, 320), (3, 1, 48, 300)])
def test_persistent_schedule_exact_in_fp64(mode, T, B, D, r):
    """Slicing over CTAs, zero padding, rank-order sums and the hand-derived backward agree
    with autograd through the per-step loops to fp64 rounding."""
    from elman.families.twogemm.schedule import cluster_shape
    x = _lowrank_case(mode, T, B, D, r)
    g = torch.Generator().manual_seed(7)
    d_out, d_hT = torch.randn(T, B, D, generator=g, dtype=torch.float64), torch.randn(
        B, D, generator=g, dtype=torch.float64)
    C, S = cluster_shape(D, r)
    out, hT, grads = _schedule(mode, x, d_out, d_hT, C, S)
    ref_out, ref_hT, ref_grads = _oracle(mode, x, d_out, d_hT)
    assert (out - ref_out).abs().max() < 1e-10 and (hT - ref_hT).abs().max() < 1e-10
    for name, a, b in zip(("a", "c", "U", "V", "b", "h0"), grads, ref_grads):
        assert (a - b).abs().max() < 1e-9, name


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_persistent_schedule_bf16_rounding_within_tolerance(mode):
    """With bf16 partials, p, d_pre, dp and states (fp32 dL/dh), 17 steps at D = 512 stay
    within the family's bf16 parity tolerance of the fp64 result."""
    from elman.families.twogemm.schedule import cluster_shape
    T, B, D, r = 17, 4, 512, 128
    x = _lowrank_case(mode, T, B, D, r)
    g = torch.Generator().manual_seed(3)
    d_out, d_hT = torch.randn(T, B, D, generator=g, dtype=torch.float64), torch.randn(
        B, D, generator=g, dtype=torch.float64)
    C, S = cluster_shape(D)
    rnd = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    out, hT, grads = _schedule(mode, {k: rnd(t) for k, t in x.items()}, rnd(d_out), rnd(d_hT),
                               C, S, torch.bfloat16)
    ref_out, ref_hT, ref_grads = _oracle(mode, x, d_out, d_hT)
    for a, b in zip((out, hT, *grads), (ref_out, ref_hT, *ref_grads)):
        assert rel_error(a.double(), b) < 2e-2


# ---- E23's persistent forward (schedule.tape_forward restates tape_persistent.cu) ------------
def _tape_case(T: int, B: int, D: int, N: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(T * 100 + D + N)
    kw = dict(generator=g, dtype=dtype)
    return dict(x=torch.randn(T, B, D, **kw), z=torch.randn(T, B, D, **kw),
                w_x=torch.randn(D, D, **kw) / D ** 0.5,
                w_h=0.9 * torch.linalg.qr(torch.randn(D, D, **kw))[0],
                w_wr=torch.randn(D, D, **kw) / D ** 0.5, b=0.1 * torch.randn(D, **kw),
                h0=torch.rand(B, D, **kw) - 0.5, tape0=torch.randn(B, N, D, **kw))


def test_tape_cluster_matches_plan():
    from elman.families.twogemm.schedule import tape_cluster
    assert [tape_cluster(D) for D in (1, 100, 128, 129, 256, 300, 512)] == [4, 4, 4, 8, 8, 16, 16]


@pytest.mark.parametrize("T,B,D,N", [(1, 1, 8, 8), (5, 3, 100, 8), (7, 2, 300, 32),
                                     (6, 9, 512, 3), (4, 4, 130, 1)])
def test_tape_persistent_schedule_exact_in_fp64(T, B, D, N):
    """The kernel's schedule (read scores carried as (1 - beta) W + beta u . w, per-CTA
    partials in rank order, checkpoints) equals the reference in fp64, gradients included
    (autograd through both)."""
    from elman.families.twogemm import schedule
    from elman.variants import e23
    x = _tape_case(T, B, D, N)
    K = op.checkpoint_interval(T)
    lv = {k: t.clone().requires_grad_() for k, t in x.items()}
    lr = {k: t.clone().requires_grad_() for k, t in x.items()}
    out, w_all, tape_T, ckpt = schedule.tape_forward(**lv, K=K)[:4]
    x_r = lr.pop("x")
    ref_out, ref_w, ref_tape = e23.reference(x_r @ lr["w_x"].t(), lr["z"], torch.eye(D, dtype=x_r.dtype),
                                             lr["w_h"], lr["w_wr"], lr["b"], lr["h0"], lr["tape0"], N)
    for a, b in ((out, ref_out), (w_all[-1], ref_w), (tape_T, ref_tape)):
        assert (a - b).abs().max() < 1e-10
    # checkpoints: the reference's tapes before steps 0, K, 2K, ...
    for j in range(ckpt.shape[0]):
        _, _, tape_j = e23.reference(x["x"][: j * K] @ x["w_x"].t(), x["z"][: j * K],
                                     torch.eye(D, dtype=torch.float64), x["w_h"], x["w_wr"],
                                     x["b"], x["h0"], x["tape0"], N) if j else (0, 0, x["tape0"])
        assert (ckpt[j].detach() - tape_j).abs().max() < 1e-10
    g = torch.Generator().manual_seed(1)
    cot = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (out, tape_T)]
    ga = torch.autograd.grad((out, w_all[-1], tape_T), list(lv.values()), (cot[0], cot[0][-1], cot[1]))
    gb = torch.autograd.grad((ref_out, ref_w, ref_tape), [x_r, *lr.values()], (cot[0], cot[0][-1], cot[1]))
    for name, a, b in zip(lv, ga, gb):  # the reference took W_x x (W_x a leaf) as its x
        assert (a - b).abs().max() < 1e-8, name


@pytest.mark.parametrize("N", [8, 32])
def test_tape_persistent_schedule_bf16_within_tolerance(N):
    """With the kernel's bf16 roundings (w, hw, u, tape, outputs), 33 steps at B = 4, D = 512
    stay within E23's bf16 parity tolerance of the fp64 reference."""
    from elman.families.twogemm import schedule
    from elman.variants import e23
    T, B, D = 33, 4, 512
    x = _tape_case(T, B, D, N)
    x["tape0"] = 0.5 * x["tape0"]
    rnd = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    out, w_all, tape_T = schedule.tape_forward(**{k: rnd(t) for k, t in x.items()}, K=6,
                                               rounding=torch.bfloat16)[:3]
    ref_out, ref_w, ref_tape = e23.reference(x["x"] @ x["w_x"].t(), x["z"], torch.eye(D, dtype=torch.float64),
                                             x["w_h"], x["w_wr"], x["b"], x["h0"], x["tape0"], N)
    for a, b in ((out, ref_out), (w_all[-1], ref_w), (tape_T, ref_tape)):
        assert rel_error(a.double(), b) < 2e-2


def _tape_grads(x, K, cot, rounding=None):
    """The persistent schedule's forward and backward: (out, w_T, tape_T, gradients)."""
    from elman.families.twogemm import schedule
    out, w_all, tape_T, ckpt, u_all, alpha_all, beta_all = schedule.tape_forward(**x, K=K,
                                                                                 rounding=rounding)
    grads = schedule.tape_backward(x["x"], x["z"], x["w_x"], x["w_h"], x["w_wr"], w_all, u_all,
                                   alpha_all, beta_all, ckpt, cot[0], cot[1], cot[2], K, rounding)
    return out, w_all[-1], tape_T, grads


def _tape_oracle(x, cot):
    """autograd through the reference (W_x x as its input, W_x a leaf)."""
    from elman.variants import e23
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    D = x["x"].shape[-1]
    out, w, tape = e23.reference(leaves["x"] @ leaves["w_x"].t(), leaves["z"],
                                 torch.eye(D, dtype=x["x"].dtype), leaves["w_h"], leaves["w_wr"],
                                 leaves["b"], leaves["h0"], leaves["tape0"], x["tape0"].shape[1])
    grads = torch.autograd.grad((out, w, tape), [leaves[k] for k in
                                ("x", "z", "w_x", "w_h", "w_wr", "b", "h0", "tape0")], cot)
    return out.detach(), w.detach(), tape.detach(), grads


def _cotangents(T, B, D, N, dtype=torch.float64):
    g = torch.Generator().manual_seed(11)
    return (torch.randn(T, B, D, generator=g, dtype=dtype), torch.randn(B, D, generator=g, dtype=dtype),
            torch.randn(B, N, D, generator=g, dtype=dtype))


@pytest.mark.parametrize("T,B,D,N,K", [(1, 1, 8, 8, 1), (5, 3, 100, 8, 2), (7, 2, 300, 32, 3),
                                       (9, 9, 512, 3, 3), (4, 4, 130, 1, 4), (11, 2, 64, 8, 24)])
def test_tape_persistent_backward_schedule_exact_in_fp64(T, B, D, N, K):
    """Segments recomputed from checkpoints with the stored u and beta, per-CTA partials in
    rank order, the hand-derived gradients: equal to autograd through the reference in fp64."""
    x = _tape_case(T, B, D, N)
    cot = _cotangents(T, B, D, N)
    out, w, tape, grads = _tape_grads(x, K, cot)
    ref_out, ref_w, ref_tape, ref_grads = _tape_oracle(x, cot)
    for a, b in ((out, ref_out), (w, ref_w), (tape, ref_tape)):
        assert (a - b).abs().max() < 1e-10
    for name, a, b in zip(("x", "z", "W_x", "W_h", "W_wr", "b", "h0", "tape0"), grads, ref_grads):
        assert (a - b).abs().max() < 1e-8 * max(1.0, b.abs().max().item()), name


@pytest.mark.parametrize("N", [8, 32])
def test_tape_persistent_backward_schedule_bf16_within_tolerance(N):
    """With the kernels' bf16 roundings (forward as above; du, d_pre, d_z rounded, dL/dw and
    dL/dM in fp32), 33 steps at B = 4, D = 512 stay within E23's bf16 tolerance."""
    T, B, D = 33, 4, 512
    x = _tape_case(T, B, D, N)
    x["tape0"] = 0.5 * x["tape0"]
    cot = _cotangents(T, B, D, N)
    rnd = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    out, w, tape, grads = _tape_grads({k: rnd(t) for k, t in x.items()}, 6,
                                      (rnd(cot[0]), rnd(cot[1]), cot[2].float()), torch.bfloat16)
    ref_out, ref_w, ref_tape, ref_grads = _tape_oracle(x, cot)
    for name, a, b in zip(("out", "w_T", "tape_T", "x", "z", "W_x", "W_h", "W_wr", "b", "h0",
                           "tape0"), (out, w, tape, *grads), (ref_out, ref_w, ref_tape, *ref_grads)):
        assert rel_error(a.double(), b) < 3e-2, name


class _ScheduleExtension:
    """The persistent E23 entry points of elman_twogemm, run by schedule.py in the inputs'
    dtype: the op's wiring (K, saved tensors, argument order, the GEMMs after the kernels)
    checked on the CPU."""
    def __init__(self, K: int):
        self.K, self.calls = K, []

    def tape_persistent_supported(self, B, D, N, bf16):
        return True, ""

    def tape_persistent_interval(self, T, D, N):
        return self.K

    def tape_persistent_backward_supported(self, B, D, N, K, bf16):
        return True, ""

    def tape_persistent_forward(self, wx, z, w_h, w_wr, b, h0, tape0, out, w_all, tape_T, ckpt, K,
                                u_all, alpha_all, beta_all):
        from elman.families.twogemm import schedule
        self.calls.append(("forward", K))
        eye = torch.eye(wx.shape[-1], dtype=wx.dtype)
        res = schedule.tape_forward(wx, z, eye, w_h, w_wr, b, h0, tape0, K=K)
        for dst, src in zip((out, w_all, tape_T, ckpt, u_all, alpha_all, beta_all), res):
            dst.copy_(src)

    def tape_persistent_backward(self, z, w_h, w_wr, w_all, u_all, alpha_all, beta_all, ckpt,
                                 d_out, d_hT, d_tapeT, d_pre, d_u, d_z, dh0, d_tape0, K):
        from elman.families.twogemm import schedule
        self.calls.append(("backward", K))
        res = schedule.tape_backward_steps(z, w_h, w_wr, w_all, u_all, alpha_all.to(z.dtype),
                                           beta_all.to(z.dtype), ckpt, d_out, d_hT,
                                           d_tapeT.to(z.dtype), K)
        for dst, src in zip((d_pre, d_u, d_z, dh0, d_tape0), res):
            dst.copy_(src)


@pytest.mark.parametrize("T,K", [(1, 1), (7, 3), (10, 2)])
def test_tape_op_persistent_wiring(monkeypatch, T, K):
    """TapeCell's persistent path with the kernels replaced by their CPU restatement: the
    interval K reaches both kernels and the checkpoints, the saved u, alpha, beta reach the
    backward, and outputs and every gradient equal autograd through the reference (up to the
    fp32 storage of alpha and beta)."""
    from elman.variants import e23
    fake = _ScheduleExtension(K)
    monkeypatch.setattr(op, "_ext", lambda: fake)
    B, D, N = 2, 40, 4
    x = _tape_case(T, B, D, N)
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    outs = op.TapeCell.apply(None, "persistent", *leaves.values())
    cot = _cotangents(T, B, D, N)
    grads = torch.autograd.grad(outs, list(leaves.values()), cot)
    assert fake.calls == [("forward", K), ("backward", K)]
    assert op.last_path == {"forward": "persistent", "backward": "persistent"}
    ref_leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    ref = e23.reference(*ref_leaves.values(), N)
    ref_grads = torch.autograd.grad(ref, list(ref_leaves.values()), cot)
    for a, b in zip(outs, ref):
        assert (a - b).abs().max() < 1e-10
    for name, a, b in zip(x, grads, ref_grads):
        assert rel_error(a, b) < 1e-5, name


@pytest.mark.parametrize("T", [0, 1, 2, 3, 4, 5, 9, 33])
def test_lowrank_forward_step_order(T):
    """The low-rank persistent forward (persistent.cu) reads each step's staged inputs only
    once every thread's copies are visible, refills a ring slot only after its last read, and
    stores each step's outputs once, after its state (kLead = 3)."""
    from elman.families.twogemm import schedule
    schedule.check_lowrank_forward_events(schedule.lowrank_forward_events(T, 3), T, 3)


def test_lowrank_forward_step_order_check_catches_races():
    """The check fails on orders with a race: the forward waiting one step too little, and an
    output stored before its state."""
    from elman.families.twogemm import schedule
    T, lead = 6, 3
    ev = schedule.lowrank_forward_events(T, lead)
    late = [("wait", lead) if e == ("wait", lead - 1) else e for e in ev]
    with pytest.raises(AssertionError, match="visible"):
        schedule.check_lowrank_forward_events(late, T, lead)
    early = [e for e in ev if e != ("store", 2)]
    early.insert(early.index(("state", 2)), ("store", 2))
    with pytest.raises(AssertionError, match="before its state"):
        schedule.check_lowrank_forward_events(early, T, lead)


def test_chapter_plan():
    """Every variant at the issue's shape first (the grid variants on every path, with the
    whole layer), then the grid variants' fast paths at the other shapes, D by D."""
    from elman.families.twogemm import bench
    plan = bench.chapter_plan(["E66", "E66r16"], [4, 64], [512, 1024], grid=["E66"])
    assert plan[:2] == [bench.Planned("E66", 4, 512, bench.FAST + bench.SLOW, True),
                        bench.Planned("E66r16", 4, 512, bench.FAST, True)]
    assert [(p.variant, p.B, p.D) for p in plan[2:]] == [("E66", 64, 512), ("E66", 4, 1024),
                                                          ("E66", 64, 1024)]
    assert all(p.impls == bench.FAST and not p.layer for p in plan[2:])
    assert bench.chapter_plan(["E4"], [4, 16], [512, 1024], quick=True) == [
        bench.Planned("E4", 4, 512, bench.FAST + bench.SLOW, True)]


def test_chapter_records_write_each_shape_and_resume(monkeypatch, tmp_path):
    """A chapter's run writes each shape's records when the shape is done: stopped in its
    third shape it keeps the first two, and a rerun into the same folder measures only what
    the folder lacks (cells by path, layers, E1's cell), on the paths the op has there."""
    from elman.core import records
    from elman.families.dense import bench as dense_bench
    from elman.families.twogemm import bench

    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(op, "paths", lambda B, D, dtype, rank=None, slots=None:
                        (["persistent"] if D <= 512 else []) + ["graph", "steps"])
    calls, stop = [], {(4, 1024)}

    def rec(name, impl, B, D, T, measure="cell"):
        return records.make("bench", name, impl, {"measure": measure, "T": T, "B": B, "D": D}, {})

    def cell(entry, B, D, T, quick=False, impls=None, gate=None):
        calls.append((entry.name, B, D, impls))
        if (B, D) in stop:
            raise KeyboardInterrupt  # the stage's time limit
        return [rec(entry.name, bench.BENCH_IMPL.get(i, i), B, D, T) for i in impls]

    def layer(e, B, D, T, quick=False):
        calls.append((e.name, B, D, "layer"))
        return rec(e.name, "cuda:graph", B, D, T, "layer")

    def e1_cell(e, B, D, T, quick=False, impls=()):
        calls.append((e.name, B, D, impls))
        return [rec(e.name, "cuda:persistent", B, D, T)]
    monkeypatch.setattr(bench, "cell_records", cell)
    monkeypatch.setattr(dense_bench, "cell_records", e1_cell)
    plan = bench.chapter_plan(["E4"], [4, 64], [512, 1024])
    args = (plan, [registry.get("E4")], registry.get("E1"), layer, lambda e, dtype: {})
    with pytest.raises(KeyboardInterrupt):
        bench.chapter_records(*args, T=16)
    kept = {(r["variant"], r["params"]["B"], r["params"]["D"]) for r in records.read([tmp_path])}
    assert kept == {(v, B, 512) for v in ("E4", "E1") for B in (4, 64)}
    assert ("E4", 4, 512, ("cuda:persistent", "cuda:graph", "cuda:steps", "torch:eager")) in calls
    assert ("E4", 4, 512, "layer") in calls
    calls.clear()
    stop.clear()
    new = bench.chapter_records(*args, T=16)
    assert calls == [("E4", 4, 1024, ("cuda:graph",)), ("E1", 4, 1024, ("cuda:persistent",)),
                     ("E4", 64, 1024, ("cuda:graph",)), ("E1", 64, 1024, ("cuda:persistent",))]
    assert len(new) == 4 and len(records.read([tmp_path])) == 9 + 4
    calls.clear()
    assert bench.chapter_records(*args, T=16) == [] and calls == []
