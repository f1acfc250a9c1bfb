"""GPU checks of E70-E74, E73cp and E14 on the matrix family's gated kernels: parity of every
registered level (fp32, bf16), every rule and step of the op against its PyTorch schedule at
awkward shapes (T = 1, B = 1, T not a multiple of K, n != v), E73cp against E73 (same outputs
and gradients, less memory), errors before launch (run by scripts/gpu_pass.sh; skipped without
CUDA)."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.core import extension as ops
from elman.core.entry import rel_error
from elman.families.matrix import gated, gated_op
from elman.harness import parity

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LEVELS = [e.name for e in registry.variants() if e.name.startswith(("E70", "E71", "E72", "E73", "E74", "E14"))]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_level_parity(level, dtype):
    recs = parity.check_entry(registry.get(level), [dtype])
    failed = [r for r in recs if not r["metrics"]["passed"]]
    assert recs and not failed, parity.table(failed)


def _op_inputs(T, B, H, n, v, rule, modulated, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", dtype=torch.float64, generator=g)
    x = {"q": torch.randn(T, B, H, n, **kw) / n ** 0.5, "k": torch.randn(T, B, H, n, **kw) / n ** 0.5,
         "v": torch.randn(T, B, H, v, **kw), "c": 0.5 + 0.5 * torch.rand(T, B, H, v, **kw),
         "h0": torch.rand(B, H, n, v, **kw) - 0.5}
    if modulated:
        x["m"] = 2 * torch.rand(T, B, H, n, **kw) - 1
    if "e" in gated.NEEDS[rule]:
        x["e"] = torch.rand(T, B, H, v, **kw) - 0.5
    if "f" in gated.NEEDS[rule]:
        x["f"] = torch.rand(T, B, H, v, **kw) - 0.5
    if rule == "write_gate":  # with the erase, as E74's ntm rule runs it
        x["x"] = torch.rand(T, B, H, v, **kw)
    return x


def _compare(ref, fast, ref_in, fast_in, dtype) -> None:
    """Outputs and every input's gradient of the op (poisoned outputs) against its schedule in
    fp64, under one random upstream gradient, within the family's tolerance of `dtype`."""
    g = torch.Generator(device="cuda").manual_seed(1)
    grads = [torch.randn(r.shape, device="cuda", dtype=torch.float64, generator=g) for r in ref]
    torch.autograd.backward(ref, grads)
    with ops.poisoned():
        torch.autograd.backward(fast, [gr.to(f.dtype) for gr, f in zip(grads, fast)])
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-2, 5e-2)
    for name, a, b in zip(("o", "S_T"), fast, ref):
        assert rel_error(a, b) < tol[0], f"{name}: {rel_error(a, b):.2e}"
    for name in ref_in:
        err = rel_error(fast_in[name].grad, ref_in[name].grad)
        assert err < tol[1], f"grad {name}: {err:.2e}"


SHAPES = [(1, 1, 1, 8, 8), (17, 2, 3, 16, 32), (40, 1, 2, 64, 64), (23, 3, 1, 96, 48),
          (9, 2, 1, 128, 64), (19, 1, 2, 48, 128), (18, 2, 1, 128, 128)]


@pytest.mark.parametrize("rule", gated.RULES)
@pytest.mark.parametrize("step", ["tanh", "linear"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gated_op_matches_its_schedule(rule, step, shape, dtype):
    modulated = rule == "decay"
    x = _op_inputs(*shape, rule, modulated)
    ref_in = {k: t.clone().requires_grad_() for k, t in x.items()}
    fast_in = {k: (t.to(dtype) if k in "qkv" else t.float()).requires_grad_() for k, t in x.items()}
    K = 4
    ref = gated_op.recurrence(rule=rule, step=step, K=K, engine="schedule", **ref_in)
    with ops.poisoned():
        fast = gated_op.recurrence(rule=rule, step=step, K=K, **fast_in)
    _compare(ref, fast, ref_in, fast_in, dtype)


def test_e73cp_matches_e73_and_stores_less():
    torch.manual_seed(0)
    a = registry.get("E73").layer(256, expansion=2.0, n_state=64).cuda()
    b = registry.get("E73cp").layer(256, expansion=2.0, n_state=64).cuda()
    b.load_state_dict(a.state_dict())
    y = torch.randn(4, 512, 256, device="cuda", requires_grad=True)
    peaks, outs, grads = [], [], []
    for layer in (a, b):
        y.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out, _ = layer(y)
        out.square().mean().backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        outs.append(out.detach())
        grads.append(y.grad.clone())
    assert rel_error(outs[1], outs[0]) < 1e-6
    assert rel_error(grads[1], grads[0]) < 1e-5
    assert peaks[1] < peaks[0]


def test_gated_op_errors_before_launch():
    x = _op_inputs(5, 2, 1, 16, 16, "decay", False)
    q, k, v, c, h0 = (x[n].float() for n in ("q", "k", "v", "c", "h0"))
    with pytest.raises(ValueError, match="n and v in"):
        gated_op.recurrence(q[..., :12], k[..., :12], v, c, h0[:, :, :12], "decay")
    with pytest.raises(TypeError, match="dtype"):
        gated_op.recurrence(q.half(), k.half(), v.half(), c, h0, "decay")
    with pytest.raises(ValueError, match="h0 has shape"):
        gated_op.recurrence(q, k, v, c, h0[:1], "decay")
    with pytest.raises(ValueError, match="empty"):
        gated_op.recurrence(q[:, :0], k[:, :0], v[:, :0], c[:, :0], h0[:0], "decay")
    o, _ = gated_op.recurrence(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, c, h0, "decay")
    assert torch.isfinite(o).all()  # a non-contiguous q is copied, not misread


@pytest.mark.parametrize("level,what", [("74v2-residual", "update='residual'"),
                                        ("E74-full-full-n32", "proj='full'")])
def test_e74_without_kernel_raises_on_gpu(level, what):
    layer = registry.get(level).layer(64).cuda()
    with pytest.raises(ValueError, match=what):
        layer(torch.randn(1, 4, 64, device="cuda"))


@pytest.mark.parametrize("rule", ["delta", "simple", "ema"])
@pytest.mark.parametrize("step", ["tanh", "linear"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 8), (17, 2, 3, 33), (40, 3, 2, 96)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_diagonal_op_matches_its_schedule(rule, step, shape, dtype):
    from elman.families.matrix import diagonal_op
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.float64, generator=g)
    T, B, H, n = shape
    k = torch.randn(T, B, H, n, **kw)
    x = {"q": torch.randn(T, B, H, n, **kw), "k": k / (k.norm(dim=-1, keepdim=True) + 1e-6),
         "v": torch.randn(T, B, H, n, **kw), "c": 0.5 + 0.5 * torch.rand(T, B, H, n, **kw),
         "h0": torch.rand(B, H, n, **kw) - 0.5}
    ref_in = {k: t.clone().requires_grad_() for k, t in x.items()}
    fast_in = {k: (t.to(dtype) if k in "qkv" else t.float()).requires_grad_() for k, t in x.items()}
    ref = diagonal_op.recurrence(rule=rule, step=step, engine="schedule", **ref_in)
    with ops.poisoned():
        fast = diagonal_op.recurrence(rule=rule, step=step, **fast_in)
    _compare(ref, fast, ref_in, fast_in, dtype)
