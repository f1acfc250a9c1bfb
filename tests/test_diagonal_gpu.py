"""The diagonal family's scan on the GPU, beyond the registry's parity (tests/test_parity_gpu.py
runs every level): long-sequence stability against fp64, each access width (16-byte, 2-element,
scalar) on the same values, misaligned and non-contiguous inputs, the binding's own checks, and
every output element written (poisoned buffers)."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.core import extension as ops
from elman.core.entry import Shape, rel_error
from elman.families.diagonal import inputs, op

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LEVELS = [e.name for e in registry.entries(family="diagonal")]


def _scan_inputs(step: str, T: int, B: int, D: int, dtype, seed: int = 0):
    info = op.step_info(step)
    g = torch.Generator(device="cuda").manual_seed(seed)
    us = [torch.randn(T, B, D, device="cuda", generator=g).to(dtype) for _ in range(info["inputs"])]
    qs = [0.3 + 0.6 * torch.rand(D, device="cuda", generator=g) for _ in range(info["params"])]
    h0 = (torch.rand(B, D, device="cuda", generator=g) - 0.5).to(dtype)
    return us, qs, h0


def _run(step, us, qs, h0, seed=1):
    leaves = [t.detach().clone().requires_grad_() for t in (*us, *qs, h0)]
    k = len(us)
    with ops.poisoned():
        out, hT = op.scan(step, leaves[:k], leaves[k:-1], leaves[-1])
    g = torch.Generator(device="cuda").manual_seed(seed)
    d_out = torch.randn(out.shape, device="cuda", generator=g).to(out.dtype)
    d_hT = torch.randn(hT.shape, device="cuda", generator=g).to(hT.dtype)
    with ops.poisoned():
        torch.autograd.backward((out, hT), (d_out, d_hT))
    return (out.detach(), hT.detach(), *[t.grad for t in leaves])


@pytest.mark.parametrize("level", LEVELS)
def test_long_sequence_matches_fp64(level):
    """T = 4096 in fp32 against the fp64 reference: errors do not grow with T."""
    entry = registry.get(level)
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = inputs.reference_inputs(entry.reference, Shape(4096, 2, 64), "cuda", g)
    with torch.no_grad():
        ref = entry.reference(**kw)
        module = __import__(entry.layer.__module__, fromlist=["x"])
        cell = getattr(module, "cell" + entry.reference.__name__[len("reference"):])
        fast = cell(**{k: v.float() for k, v in kw.items()}, backend="cuda")
    for f, r in zip(fast, ref):
        assert torch.isfinite(f).all()
        assert rel_error(f, r) < 1e-4


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    v = t.new_empty(t.numel() + 1)[1:].view(t.shape)
    v.copy_(t)
    return v


@pytest.mark.parametrize("step", ["e61", "e62b", "e68i", "e34"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [4096, 4098])
def test_widths_agree(step, dtype, D):
    """At B = 64 the plan takes 4 elements per thread (D = 4096) or 2 (D = 4098, not a
    multiple of 4); the same values through misaligned views take 1. Results agree."""
    T, B = 6, 64
    ext = ops.load("diagonal")
    sid = op.step_info(step)["id"]
    bf16 = dtype == torch.bfloat16
    assert ext.plan(sid, B, D, bf16, False)["vec"] > 1 and ext.plan(sid, B, D, bf16, True)["vec"] > 1
    us, qs, h0 = _scan_inputs(step, T, B, D, dtype)
    base = _run(step, us, qs, h0)
    shifted = _run(step, [_misaligned(u) for u in us], qs, _misaligned(h0))
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    for a, b in zip(base, shifted):
        assert rel_error(a, b) < tol


def test_plans():
    """Every plan covers the step with a width that divides D; tiny sizes take one element
    per thread, and B = 64, D = 4096 (too many threads for one wave at one element) a wider one."""
    ext = ops.load("diagonal")
    for step in ("e61", "e62b", "e68"):
        sid = op.step_info(step)["id"]
        for B, D in ((1, 5), (64, 2050), (64, 2048), (64, 4096)):
            for bf16 in (False, True):
                for bwd in (False, True):
                    p = ext.plan(sid, B, D, bf16, bwd)
                    assert D % p["vec"] == 0 and p["blocks"] * p["threads"] * p["vec"] >= B * D
                    assert p["vec"] == 1 or (B, D) != (1, 5)
        assert ext.plan(sid, 64, 4096, True, False)["vec"] > 1


def test_noncontiguous_inputs():
    us, qs, h0 = _scan_inputs("e67", 9, 4, 40, torch.float32)
    wide = [torch.stack([u, torch.full_like(u, float("nan"))], -1)[..., 0] for u in us]  # stride 2
    assert not wide[0].is_contiguous()
    a, b = _run("e67", us, qs, h0), _run("e67", wide, qs, h0)
    for x, y in zip(a, b):
        assert rel_error(x, y) < 1e-6


def test_binding_checks():
    ext = ops.load("diagonal")
    sid = op.step_info("e61")["id"]
    us, _, h0 = _scan_inputs("e61", 4, 2, 8, torch.float32)
    out, h_all = torch.empty_like(us[0]), us[0].new_empty(5, 2, 8)
    with pytest.raises(ValueError, match="takes 2 inputs"):
        ext.forward(sid, us[:1], [], h0, out, h_all)
    with pytest.raises(ValueError, match="shape"):
        ext.forward(sid, us, [], h0, out, us[0].new_empty(4, 2, 8))
    with pytest.raises(TypeError, match="dtype"):
        ext.forward(sid, [us[0], us[1].double()], [], h0, out, h_all)
    with pytest.raises(ValueError, match="unknown diagonal step"):
        ext.forward(999, us, [], h0, out, h_all)
    with pytest.raises(ValueError, match="empty"):
        ext.forward(sid, [u[:0] for u in us], [], h0, out[:0], h_all[:1])
