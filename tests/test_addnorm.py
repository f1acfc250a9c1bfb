"""norm="elman": the Triton add + RMSNorm against add_rms_norm_torch, run on the CPU by
Triton's interpreter in a subprocess (TRITON_INTERPRET=1 must be set before triton is
imported)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from elman.training.addnorm import add_rms_norm
from elman.training.lm import AddNorm, LadderLM

# Triton 3.6's interpreter turns a loop bound into an int with int() of a one-element array,
# which NumPy 2.4 refuses (triton-lang/triton#9171); the scripts take the element instead.
INTERPRETER_FIX = """
from triton.runtime import interpreter
_patch_lang_tensor = getattr(interpreter, "_patch_lang_tensor", None)
def _patch_with_item(tensor, scope):
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))
if _patch_lang_tensor is not None:
    interpreter._patch_lang_tensor = _patch_with_item
"""


def _interpret(script: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = INTERPRETER_FIX + textwrap.dedent(script)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-3000:]


def test_kernels_match_the_torch_norm_in_the_interpreter():
    """Outputs and every gradient, for fp32 and bf16 inputs, with and without a residual and
    a gradient reaching r, for widths 64, 1000 and 1280, 37 rows (not a multiple of the
    backward's row blocks), a time-major [T, B, N] input, a transposed (non-contiguous)
    input and output gradient, and a loss of r alone. fp32 results to fp32 rounding; bf16 y
    and dx within one bf16 ulp."""
    _interpret("""
        import torch
        from elman.training.addnorm import add_rms_norm
        from elman.training.lm import add_rms_norm_torch

        def check(x, res, w, dy, dr):
            results = []
            for fn in (add_rms_norm, add_rms_norm_torch):
                y, r = fn(x, w, res)
                loss = (y.float() * dy).sum() + ((r * dr).sum() if dr is not None else 0)
                inputs = (x, w) + ((res,) if res is not None else ())
                results.append((y, r) + torch.autograd.grad(loss, inputs))
            (y, r, dx, dw, *dres), (y0, r0, dx0, dw0, *dres0) = results
            assert y.dtype == y0.dtype and dx.dtype == x.dtype and r.dtype == dw.dtype == torch.float32
            assert torch.equal(r, r0)
            tight = dict(rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(dw, dw0, **tight)
            for a, b in zip(dres, dres0):
                assert a.dtype == torch.float32
                torch.testing.assert_close(a, b, **tight)
            if x.dtype == torch.float32:
                torch.testing.assert_close(y, y0, **tight)
                torch.testing.assert_close(dx, dx0, **tight)
            else:  # the interpreter casts to bf16 by truncation, CUDA rounds to nearest
                for a, b in ((y, y0), (dx, dx0)):
                    torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-6)

        g = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            for n in (64, 1000, 1280):
                w = (1 + 0.1 * torch.randn(n, generator=g)).requires_grad_()
                for shape in ((37, n), (5, 3, n)):
                    x = torch.randn(shape, generator=g).to(dtype).requires_grad_()
                    res = torch.randn(shape, generator=g).requires_grad_()
                    dy = torch.randn(shape, generator=g)
                    dr = torch.randn(shape, generator=g)
                    for r_in in (res, None):
                        for d in (dr, None):
                            check(x, r_in, w, dy, d)
        y, r = add_rms_norm(x, w, res)  # only r reaches the loss: no gradient for y
        dx, dw = torch.autograd.grad((r * dr).sum(), (x, w))
        torch.testing.assert_close(dx.float(), dr, rtol=2 ** -7, atol=0)
        assert not dw.any()
        x = torch.randn(4, 6, 64, generator=g).to(torch.bfloat16)
        xt = x.transpose(0, 1).requires_grad_()
        check(xt, torch.randn(6, 4, 64, generator=g).requires_grad_(), w[:64].detach().requires_grad_(),
              torch.randn(4, 6, 64, generator=g).transpose(0, 1), torch.randn(6, 4, 64, generator=g))
        print("ok")
        """)


def test_model_with_the_kernels_matches_the_torch_model_in_the_interpreter():
    """LadderLM with norm="elman" against norm="torch", same weights: the loss and every
    parameter gradient, through the residual stream of every layer and the final norm; and
    compare_norms(impl="elman")."""
    _interpret("""
        import torch
        from elman.training.lm import LadderLM, compare_norms
        torch.manual_seed(0)
        ref = LadderLM("E1", 48, 3, backend="reference", norm="torch")
        new = LadderLM("E1", 48, 3, backend="reference", norm="elman")
        with torch.no_grad():
            for p in ref.parameters():
                p.mul_(1 + 0.1 * torch.randn_like(p))
        new.load_state_dict(ref.state_dict())
        batch = torch.randint(0, 256, (2, 17))
        losses = []
        for m in (ref, new):
            loss = m.loss(batch)
            loss.backward()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) < 1e-5 * losses[0], losses
        for (name, p), q in zip(ref.named_parameters(), new.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
        diff = compare_norms(dim=1000, rows=37, device="cpu", impl="elman")
        assert diff["max_abs_residual"] == 0 and diff["max_abs_out"] <= 2 ** -5, diff
        assert diff["max_abs_grad_residual"] < 1e-5 and diff["max_abs_grad_weight"] < 1e-4, diff
        print("ok")
        """)


def test_elman_norm_refuses_cpu_tensors_outside_the_interpreter():
    norm = AddNorm(8, "elman")
    with pytest.raises(RuntimeError, match="needs CUDA.*norm='torch'"):
        norm(torch.randn(2, 8))
    assert LadderLM("E1", 16, 1, backend="reference", norm="elman").norms[0].impl == "elman"


@pytest.mark.parametrize("case, error, match", [
    (lambda: (torch.randn(2, 8), torch.ones(7), None), ValueError, "weight must have shape"),
    (lambda: (torch.randn(2, 8), torch.ones(8), torch.randn(2, 8).bfloat16()), ValueError, "residual must be fp32"),
    (lambda: (torch.randn(2, 8), torch.ones(8), torch.randn(3, 8)), ValueError, "residual must be fp32"),
    (lambda: (torch.zeros(2, 8, dtype=torch.long), torch.ones(8), None), ValueError, "x must be fp32, bf16 or fp16"),
    (lambda: (torch.randn(2, 8193), torch.ones(8193), None), ValueError, "rows of 1 to 8192"),
    (lambda: (torch.randn(2, 8), torch.ones(8), None), RuntimeError, "needs CUDA"),
])
def test_bad_inputs_raise_before_launch(case, error, match):
    x, w, res = case()
    with pytest.raises(error, match=match):
        add_rms_norm(x, w, res)
