"""The diagonal family's scan on the GPU, beyond the registry's parity (tests/test_parity_gpu.py
runs every level): long-sequence stability against fp64, every access width (16 bytes down to
one element, forced through `vec`) bit-identical on the same values at T below, at and beyond
the ring's depth, misaligned and non-contiguous inputs, the binding's own checks, and every
output element written (poisoned buffers)."""
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
    """At B = 64 the plan takes 16-byte accesses (D = 4098 too: a thread's elements may cross
    from one sequence into the next, each with its own channel); the same values through
    misaligned views take narrower ones. Results agree."""
    T, B = 6, 64
    ext = ops.load("diagonal")
    sid = op.step_info(step)["id"]
    bf16 = dtype == torch.bfloat16
    wide = 8 if bf16 else 4
    assert ext.plan(sid, B, D, bf16, False)["vec"] == wide and ext.plan(sid, B, D, bf16, True)["vec"] == wide
    us, qs, h0 = _scan_inputs(step, T, B, D, dtype)
    base = _run(step, us, qs, h0)
    shifted = _run(step, [_misaligned(u) for u in us], qs, _misaligned(h0))
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    for a, b in zip(base, shifted):
        assert rel_error(a, b) < tol


def _raw(step, us, qs, h0, d_out, d_hT, vec):
    """The raw forward and backward at a forced width: (out, h_all, *d_inputs, dh0, d_params)."""
    info = op.step_info(step)
    T, B, D = us[0].shape
    out, h_all = torch.full_like(us[0], float("nan")), us[0].new_full((T + 1, B, D), float("nan"))
    op.forward_into(info["id"], us, qs, h0, out, h_all, vec)
    d_in = [torch.full_like(u, float("nan")) for u in us]
    dh0 = torch.full_like(h0, float("nan"))
    d_params = torch.full((len(qs), B, D), float("nan"), device="cuda")
    op.backward_into(info["id"], us, qs, h_all, d_out, d_hT, d_in, dh0, d_params, vec)
    return (out, h_all, *d_in, dh0, d_params)


@pytest.mark.parametrize("step", ["e34", "e61c", "e62b", "e65", "e68i"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("T", [1, 3, 19, 40])
def test_forced_widths_bit_identical(step, dtype, T):
    """Every width (1, 2, 4, 8 elements a thread where 16 bytes allow) computes each element
    the same way: outputs, states and gradients are bit-identical, at T below the ring's depth,
    not a multiple of it and beyond it, with B * D = 3 * 40 (elements of a thread in two
    sequences) and no element left unwritten (NaN-filled buffers)."""
    B, D = 3, 40
    us, qs, h0 = _scan_inputs(step, T, B, D, dtype)
    g = torch.Generator(device="cuda").manual_seed(5)
    d_out = torch.randn(T, B, D, device="cuda", generator=g).to(dtype)
    d_hT = torch.randn(B, D, device="cuda", generator=g).to(dtype)
    most = 8 if dtype == torch.bfloat16 else 4
    results = {v: _raw(step, us, qs, h0, d_out, d_hT, v) for v in (1, 2, 4, 8) if v <= most}
    for v, r in results.items():
        for a, b in zip(results[1], r):
            assert not a.isnan().any() and torch.equal(a, b), f"width {v}"


def test_forced_width_refused():
    """A width that B * D or 16 bytes do not allow is refused before any launch."""
    ext = ops.load("diagonal")
    sid = op.step_info("e61")["id"]
    with pytest.raises(ValueError, match="does not suit"):
        ext.plan(sid, 3, 5, True, False, 2)
    with pytest.raises(ValueError, match="does not suit"):
        ext.plan(sid, 64, 2048, False, False, 8)
    with pytest.raises(ValueError, match="vec must be"):
        ext.plan(sid, 64, 2048, True, False, 3)
    us, _, h0 = _scan_inputs("e61", 4, 3, 5, torch.bfloat16)
    with pytest.raises(ValueError, match="does not suit"):
        ext.forward(sid, us, [], h0, torch.empty_like(us[0]), us[0].new_empty(5, 3, 5), 2)


def test_plans():
    """Every plan covers the step with a width that divides B * D; an odd B * D takes one
    element a thread, and issue 21's shape B = 64, D = 2048 takes 16-byte accesses."""
    ext = ops.load("diagonal")
    for step in ("e61", "e62b", "e68"):
        sid = op.step_info(step)["id"]
        for B, D in ((1, 5), (64, 2050), (64, 2048), (64, 4096), (3, 7)):
            for bf16 in (False, True):
                for bwd in (False, True):
                    p = ext.plan(sid, B, D, bf16, bwd)
                    assert (B * D) % p["vec"] == 0 and p["blocks"] * p["threads"] * p["vec"] >= B * D
                    assert p["vec"] * (2 if bf16 else 4) <= 16
                    assert p["vec"] == 1 or (B * D) % 2 == 0
        for bf16 in (False, True):
            for bwd in (False, True):
                assert ext.plan(sid, 64, 2048, bf16, bwd)["vec"] == (8 if bf16 else 4)


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
