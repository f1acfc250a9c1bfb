"""GPU checks of the matrix family's kernels (skipped without CUDA): the op against the
PyTorch schedule (checkpoints included) and the fp64 reference for every step kind, decay kind
and write gate, every supported (n, v), several checkpoint intervals; memory that grows as
T / K; bad input raising before launch. The registry's levels run through
tests/test_parity_gpu.py."""
from __future__ import annotations

import pytest
import torch

from elman.core.entry import Shape, run_case
from elman.families.matrix import inputs, op, reference as ref, schedule
from elman.variants import e75, e88

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _inputs(T, B, H, n, v, column=False, beta=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    names = ("q", "k", "v", "decay", "beta", "h0") if beta else ("q", "k", "v", "decay", "h0")
    kw = inputs.random_inputs(T, B, H, n, v, names, "cuda", g, "column" if column else "scalar")
    kw.setdefault("beta", None)
    return kw


@pytest.mark.parametrize("step", ref.STEPS)
@pytest.mark.parametrize("column,beta", [(False, True), (False, False), (True, False)])
@pytest.mark.parametrize("K", [1, 4, 16])
@pytest.mark.parametrize("n,v,group", [(16, 32, g) for g in op.layouts(16, 32)]
                         + [(n, n, g) for n in op.WARP_SIZES for g in (op.WARP, op.RING)])
def test_op_matches_the_schedule_fp32(step, column, beta, K, n, v, group):
    kw = _inputs(19, 2, 3, n, v, column, beta)
    plain = {k: None if t is None else t.detach().float() for k, t in kw.items()}
    o, S_T = op.recurrence(**plain, step=step, K=K, group=group)
    o_ref, S_ref, ckpt = schedule.forward(**{k: None if t is None else t.detach() for k, t in kw.items()},
                                          step=step, K=K)
    torch.testing.assert_close(o.double(), o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S_T.double(), S_ref, rtol=1e-5, atol=1e-5)
    _, _, ckpt_op = op.forward(plain["q"], plain["k"], plain["v"], plain["decay"], plain["beta"],
                               plain["h0"], step, K, group)
    torch.testing.assert_close(ckpt_op.double(), ckpt, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,v", [(n, v) for n in op.SIZES for v in op.SIZES])
def test_every_supported_pair(dtype, n, v):
    for case in inputs.core_cases(e88.reference, e88.cell, Shape(21, 2, 1, 3, n, v), "cuda",
                                  torch.Generator(device="cuda").manual_seed(n * v)):
        errors = run_case(case, DTYPES[dtype], torch.Generator(device="cuda").manual_seed(1))
        tol = inputs.TOLERANCE[dtype]
        assert max(e for k, e in errors.items() if k.startswith("fwd:")) <= tol.fwd, (case.impl, errors)
        assert max(e for k, e in errors.items() if k.startswith("grad:")) <= tol.bwd, (case.impl, errors)


@pytest.mark.parametrize("dtype", DTYPES)
def test_e75_core(dtype):
    for case in inputs.core_cases(e75.reference, e75.cell, Shape(33, 2, 1, 2, 32, 32), "cuda",
                                  torch.Generator(device="cuda").manual_seed(0)):
        errors = run_case(case, DTYPES[dtype], torch.Generator(device="cuda").manual_seed(1))
        tol = inputs.TOLERANCE[dtype]
        assert max(errors.values()) <= max(tol.fwd, tol.bwd), (case.impl, errors)


def test_backward_memory_grows_with_T_over_K():
    def peak(T, K):
        kw = {k: None if t is None else t.detach().float().requires_grad_(t is not None)
              for k, t in _inputs(T, 4, 8, 32, 32).items()}
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        o, S = op.recurrence(**kw, K=K)
        (o.sum() + S.sum()).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    # checkpoints: ceil(T / K) states; with K = T there is one, with K = 1 there are T.
    assert peak(256, 64) < peak(256, 1)


def test_unsupported_sizes_raise_before_launch():
    kw = {k: None if t is None else t.detach().float() for k, t in _inputs(4, 1, 1, 40, 32).items()}
    with pytest.raises(ValueError, match="take n and v"):
        op.recurrence(**kw)
    ext = op._ext()
    g = {k: None if t is None else t.detach().float() for k, t in _inputs(4, 1, 1, 32, 32).items()}
    o, S_T, ckpt = (torch.empty_like(g["v"]), torch.empty_like(g["h0"]), torch.empty(1, 1, 1, 32, 32, device="cuda"))
    with pytest.raises(ValueError, match="do not take"):
        ext.forward(kw["q"], kw["k"], kw["v"], kw["decay"], kw["beta"], kw["h0"], o, S_T, ckpt, 0, 16)
    with pytest.raises(ValueError, match="step"):
        ext.forward(g["q"], g["k"], g["v"], g["decay"], g["beta"], g["h0"], o, S_T, ckpt, 7, 16)
    with pytest.raises(TypeError, match="dtype"):
        ext.forward(g["q"], g["k"], g["v"], g["decay"].double(), g["beta"], g["h0"], o, S_T, ckpt, 0, 16)
    with pytest.raises(ValueError, match="o has shape"):
        ext.forward(g["q"], g["k"], g["v"], g["decay"], g["beta"], g["h0"], o[:, :, :, :8].contiguous(),
                    S_T, ckpt, 0, 16)


@pytest.mark.parametrize("n,v", [(24, 48), (32, 32), (24, 24)])
def test_outputs_are_fully_written(n, v):
    from elman.core import extension
    kw = {k: None if t is None else t.detach().float() for k, t in _inputs(21, 2, 3, n, v).items()}
    with extension.poisoned():
        o, S_T, ckpt = op.forward(kw["q"], kw["k"], kw["v"], kw["decay"], kw["beta"], kw["h0"], "tanh", 16)
        grads = op.backward(kw["q"], kw["k"], kw["v"], kw["decay"], kw["beta"], ckpt, torch.randn_like(o),
                            torch.randn_like(S_T), "tanh", 16)
    for t in (o, S_T, ckpt, *grads):
        assert torch.isfinite(t).all()


def test_layer_runs_under_autocast():
    layer = e88.E88(128, n_heads=4, n_state=32).cuda()
    y = torch.randn(2, 40, 128, device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        out, S = layer(y)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("level", ["E88h8n32", "E88f_h24n24", "E75h4n32"])
def test_layer_under_bf16_autocast_matches_the_fp32_reference(level):
    from elman import registry
    from elman.core.entry import rel_error
    torch.manual_seed(0)
    layer = registry.get(level).layer(256, backend="cuda").cuda()
    y = torch.randn(2, 70, 256, device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        out, S = layer(y)
    layer.backend = "reference"
    ref_out, ref_S = layer(y)
    assert rel_error(out.float(), ref_out) < 3e-2 and rel_error(S, ref_S) < 3e-2


@pytest.mark.parametrize("column,beta", [(False, True), (True, False)])
@pytest.mark.parametrize("n,v,K,slots", [(32, 32, 16, 0), (32, 32, 16, 5), (16, 64, 8, 3), (64, 64, 16, 0),
                                         (24, 48, 4, 0), (8, 8, 16, 1), (32, 32, 16, 16), (24, 24, 16, 0),
                                         (16, 16, 4, 3), (32, 32, 8, 3)])
@pytest.mark.parametrize("group", (0, op.RING, op.TILED, op.COLUMNS))
def test_backward_matches_the_schedule_fp32(column, beta, n, v, K, slots, group):
    if group not in op.layouts(n, v):
        pytest.skip(f"group {group} does not run at n={n}, v={v}")
    kw = {k: None if t is None else t.detach().float() for k, t in _inputs(37, 2, 3, n, v, column, beta).items()}
    o, S_T, ckpt = op.forward(kw["q"], kw["k"], kw["v"], kw["decay"], kw["beta"], kw["h0"], "tanh", K, group)
    g = torch.Generator(device="cuda").manual_seed(5)
    d_o, d_S = torch.randn(o.shape, device="cuda", generator=g), torch.randn(S_T.shape, device="cuda", generator=g)
    got = op.backward(kw["q"], kw["k"], kw["v"], kw["decay"], kw["beta"], ckpt, d_o, d_S, "tanh", K, group, slots)
    d64 = {k: None if t is None else t.double() for k, t in kw.items()}
    _, _, ckpt64 = schedule.forward(**d64, step="tanh", K=K)
    want = schedule.backward(d64["q"], d64["k"], d64["v"], d64["decay"], d64["beta"], ckpt64, d_o.double(),
                             d_S.double(), "tanh", K, slots)
    for name, a, b in zip(("dq", "dk", "dv", "d_decay", "d_beta", "dh0"), got, want):
        if b is not None:
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_warp_kernels_match_the_tiled_ones(dtype):
    """The 480M geometry's layout (n = v = 32) in both dtypes against the tiled kernels, a chunk
    boundary inside T, every output and gradient."""
    kw = {k: None if t is None else t.detach().float() for k, t in _inputs(45, 2, 5, 32, 32).items()}
    x = {k: kw[k].to(DTYPES[dtype]) for k in ("q", "k", "v")}
    g = torch.Generator(device="cuda").manual_seed(3)
    d_o = torch.randn(45, 2, 5, 32, device="cuda", generator=g).to(DTYPES[dtype])
    d_S = torch.randn(2, 5, 32, 32, device="cuda", generator=g)
    out = {}
    for group in (op.WARP, op.RING, op.TILED):
        o, S_T, ckpt = op.forward(x["q"], x["k"], x["v"], kw["decay"], kw["beta"], kw["h0"], "tanh", 16, group)
        grads = op.backward(x["q"], x["k"], x["v"], kw["decay"], kw["beta"], ckpt, d_o, d_S, "tanh", 16, group)
        out[group] = (o, S_T, ckpt, *grads)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for group in (op.WARP, op.RING):
        for a, b in zip(out[group], out[op.TILED]):
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", op.WARP_SIZES)
@pytest.mark.parametrize("column,beta", [(False, True), (False, False), (True, True)])
@pytest.mark.parametrize("T,B,H,K,slots", [(37, 1, 5, 16, 0), (37, 1, 5, 16, 5), (21, 2, 3, 4, 0),
                                           (21, 2, 3, 4, 1), (45, 1, 3, 8, 8), (1, 1, 3, 16, 0)])
def test_ring_equals_the_warp_kernels(dtype, n, column, beta, T, B, H, K, slots):
    """The cp.async input ring changes only how the inputs reach the lanes, not the arithmetic:
    every output, checkpoint and gradient equals the warp kernels' bit for bit (T not a multiple
    of K, B = 1, odd H, the backward's sub-chunks and automatic slots)."""
    kw = {k: None if t is None else t.detach().float() for k, t in _inputs(T, B, H, n, n, column, beta).items()}
    x = {k: kw[k].to(DTYPES[dtype]) for k in ("q", "k", "v")}
    g = torch.Generator(device="cuda").manual_seed(7)
    d_o = torch.randn(T, B, H, n, device="cuda", generator=g).to(DTYPES[dtype])
    d_S = torch.randn(B, H, n, n, device="cuda", generator=g)
    out = {}
    for group in (op.WARP, op.RING):
        o, S_T, ckpt = op.forward(x["q"], x["k"], x["v"], kw["decay"], kw["beta"], kw["h0"], "tanh", K, group)
        grads = op.backward(x["q"], x["k"], x["v"], kw["decay"], kw["beta"], ckpt, d_o, d_S, "tanh", K, group,
                            slots)
        out[group] = (o, S_T, ckpt, *grads)
    names = ("o", "S_T", "ckpt", "dq", "dk", "dv", "d_decay", "d_beta", "dh0")
    for name, a, b in zip(names, out[op.RING], out[op.WARP]):
        if b is not None:
            assert torch.equal(a, b), (name, (a.float() - b.float()).abs().max().item())


@pytest.mark.parametrize("level", ("E88h4n32", "E75h4n32"))
def test_layer_group_option_runs_that_layout(level):
    """The layer's `group` option (the chapter times the layer on the fastest layout) reaches the
    op: the ring layout's layer gives the default (warp) layer's outputs and gradients bit for bit."""
    out = {}
    for group in (0, op.RING):
        torch.manual_seed(0)
        layer = (e88.layer_for(level, 128, group=group) if level.startswith("E88") else
                 e75.E75(128, n_heads=4, n_state=32, group=group)).cuda()
        y = torch.randn(2, 37, 128, device="cuda", requires_grad=True)
        with torch.autocast("cuda", torch.bfloat16):
            o, S = layer(y)
        (o.float().square().sum() + S.float().sum()).backward()
        assert op.last_path == dict.fromkeys(("forward", "backward"), "ring" if group else "warp")
        out[group] = (o, S, y.grad, *(p.grad for p in layer.parameters()))
    for a, b in zip(out[op.RING], out[0]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("group", (op.WARP, op.RING))
def test_warp_kernels_fall_back_on_unaligned_tensors(group):
    """k 8 bytes off a 16-byte boundary: the warp kernels read k in 16-byte vectors, so without
    the fall-back to the tiled kernels this input faults."""
    kw = {k: None if t is None else t.detach().float() for k, t in _inputs(20, 2, 3, 32, 32).items()}
    flat = kw["k"].flatten()
    k_off = torch.cat([flat[:2], flat])[2:].view_as(kw["k"])
    assert k_off.data_ptr() % 16 and torch.equal(k_off, kw["k"])
    rest = (kw["v"], kw["decay"], kw["beta"], kw["h0"], "tanh", 16, group)
    o, S_T, _ = op.forward(kw["q"], k_off, *rest)
    o_ref, S_ref, _ = op.forward(kw["q"], kw["k"], *rest)
    torch.testing.assert_close(o, o_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(S_T, S_ref, rtol=1e-6, atol=1e-6)
