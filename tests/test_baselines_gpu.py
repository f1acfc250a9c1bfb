"""The baselines on the GPU (skipped without CUDA): parity of each library path against its
reference in every dtype with a tolerance, the fla-gdn verification (scripts/verify_gdn.py's
comparison), each CUDA layer against its reference layer with the same weights, the layers
as `elman bench` runs them, and the cuDNN dtype actually used."""
from __future__ import annotations

import pytest
import torch

from elman.core.entry import Shape
from elman.harness import parity
from elman import registry
from elman.baselines import gdn, rnn
from elman.results import baselines as report

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NAMES = ("mamba2", "fla-gdn", "gru", "lstm", "llama")
CASES = [(e.name, dt) for e in registry.baselines() for dt in e.tolerance]


@pytest.mark.parametrize("level,dtype", CASES)
def test_baseline_parity(level, dtype):
    recs = parity.check_entry(registry.get(level), [dtype])
    failed = [r for r in recs if not r["metrics"]["passed"]]
    assert recs and not failed, parity.table(failed)


def test_gdn_verification_passes_on_our_shapes():
    rows = gdn.verify(modes=("auto",))
    failed = [r for r in rows if not r["passed"]]
    assert rows and not failed, report.verify_table(failed)
    if gdn.fla_refuses():
        assert all(r["path"] == "torch" and r["torch_dqkwg_calls"] > 0 for r in rows)


def test_gdn_torch_dqkwg_is_used_where_fla_refuses_and_fla_refuses_there():
    case, = gdn.parity(Shape(130, 2, 256), torch.bfloat16, "cuda", torch.Generator(device="cuda").manual_seed(0))
    inputs = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in case.inputs.items()}
    if gdn.fla_refuses():
        with gdn.dqkwg("triton"), pytest.raises(RuntimeError, match="incorrect results"):
            out, s = case.fast(**inputs)
            (out.float().sum() + s.float().sum()).backward()
    before = gdn.calls["torch"]
    with gdn.dqkwg("torch"):
        out, s = case.fast(**{k: v.detach().requires_grad_() for k, v in inputs.items()})
        (out.float().sum() + s.float().sum()).backward()
    assert gdn.calls["torch"] > before


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("name", NAMES)
def test_cuda_layer_matches_reference_layer(name):
    """Same weights, fp32: the library path against the reference path, output and every
    parameter gradient (TF32 and chunked algorithms: a few 1e-3 at most)."""
    torch.manual_seed(0)
    e = registry.get(name)
    options = {"rnn_dtype": "float32"} if name in ("gru", "lstm") else {}
    fast = e.layer(256, expansion=2.0, backend="cuda", **options).cuda()
    if name in ("gru", "lstm"):
        torch.nn.init.normal_(fast.w_out, std=0.05)   # zero at init
    ref = e.layer(256, expansion=2.0, backend="reference").cuda()
    ref.load_state_dict(fast.state_dict())
    y = torch.randn(2, 100, 256, device="cuda")
    g = torch.randn(2, 100, 256, device="cuda")
    outs = []
    for m in (fast, ref):
        out, _ = m(y)
        out.backward(g)
        outs.append(out)
    tol = 1e-4 if name in ("gru", "lstm", "llama") else 1e-2
    assert _rel(outs[0], outs[1]) < tol
    for (n, p), (_, q) in zip(fast.named_parameters(), ref.named_parameters()):
        assert _rel(p.grad, q.grad) < 5 * tol, n


@pytest.mark.parametrize("name", NAMES)
def test_layer_runs_as_the_bench_runs_it(name):
    """fp32 weights, bf16 autocast (cuDNN levels: each of their dtypes), fwd + bwd."""
    e = registry.get(name)
    for dtype in [d for d in e.dtypes if d != "float32"] or ["bfloat16"]:
        options = {"rnn_dtype": dtype} if name in ("gru", "lstm") else {}
        layer = e.layer(512, 1.0, backend="cuda", **options).cuda()
        y = torch.randn(4, 512, 512, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=getattr(torch, dtype)):
            out, _ = layer(y)
        out.float().square().mean().backward()
        assert out.shape == y.shape and torch.isfinite(out).all()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cudnn_runs_in_rnn_dtype_under_any_autocast(cell, dtype, monkeypatch):
    seen = []
    inner = rnn._cudnn

    def spy(module, x, *args):
        seen.append(x.dtype)
        return inner(module, x, *args)

    monkeypatch.setattr(rnn, "_cudnn", spy)
    layer = registry.get(cell).layer(256, rnn_dtype=dtype).cuda()
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    with torch.autocast("cuda", dtype=other):
        layer(torch.randn(2, 16, 256, device="cuda"))
    assert seen == [dtype]


def test_kernel_names_show_the_cudnn_kernels():
    layer = registry.get("lstm").layer(512, rnn_dtype="float16").cuda()
    y = torch.randn(16, 64, 512, device="cuda", requires_grad=True)

    def step():
        out, _ = layer(y)
        out.float().sum().backward()

    names = report.kernel_names(step)
    assert names and all(isinstance(n, str) for n in names)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("dtype,tol", [("float16", 1e-2), ("bfloat16", 5e-2)])
def test_half_precision_cudnn_layer_tracks_the_fp32_reference(cell, dtype, tol):
    """The weights are cast per call and cuDNN re-packs them: the output and the gradients
    of the fp32 master weights still follow the reference layer."""
    torch.manual_seed(0)
    fast = registry.get(cell).layer(256, rnn_dtype=dtype).cuda()
    torch.nn.init.normal_(fast.w_out, std=0.05)
    ref = registry.get(cell).layer(256, backend="reference").cuda()
    ref.load_state_dict(fast.state_dict())
    y = torch.randn(4, 64, 256, device="cuda")
    g = torch.randn(4, 64, 256, device="cuda")
    outs = []
    for m in (fast, ref):
        out, _ = m(y)
        out.float().backward(g)
        outs.append(out)
    assert _rel(outs[0], outs[1]) < tol
    for (n, p), (_, q) in zip(fast.named_parameters(), ref.named_parameters()):
        assert _rel(p.grad, q.grad) < 2 * tol, n
    out2, _ = fast(y)                                   # a second call after the re-packing
    assert _rel(out2, outs[0]) < 1e-3
