"""LadderLM: structure, parameter count, norms, fp32 residual, gradient checkpointing."""
from __future__ import annotations

import math

import pytest
import torch

from elman import registry
from elman.core.layer import time_major
from elman.training.lm import EPS, AddNorm, LadderLM, add_rms_norm_torch, compare_norms, n_params

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def tiny(level="E1", **kw):
    torch.manual_seed(0)
    return LadderLM(level, dim=24, depth=2, backend="reference", **kw)


@pytest.mark.parametrize("level", ["E0", "E1"])
def test_parameter_count_is_the_wrapper_formula(level):
    d, L, e = 48, 3, 1.5
    m = LadderLM(level, d, L, e, backend="reference")
    assert n_params(m) == 256 * d + L * (registry.get(level).layer_params(d, e) + d) + d


def test_head_is_tied_to_the_embedding_and_init_loss_is_near_uniform():
    m = tiny()
    x = torch.randint(0, 256, (3, 17))
    logits = m(x[:, :-1])
    assert logits.shape == (3, 16, 256)
    assert m.embedding.weight.grad is None
    m.loss(x).backward()
    assert m.embedding.weight.grad is not None
    assert not any("head" in n for n, _ in m.named_parameters())
    assert abs(m.loss(x).item() - math.log(256)) < 0.05
    assert m.embedding.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_forward_matches_the_written_out_definition():
    m = tiny().eval()  # eval: the spectral norm's power-iteration vector stays put
    x = torch.randint(0, 256, (2, 9))

    def rms(r, w):
        return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * w

    with torch.no_grad():
        m.norms[1].weight.uniform_(0.5, 1.5)
        h = m.embedding(x)
        residual = h
        for i, layer in enumerate(m.layers):
            residual = h if i == 0 else h + residual
            h = layer(rms(residual, m.norms[i].weight))[0]
        want = rms(h + residual, m.final_norm.weight) @ m.embedding.weight.t()
        assert torch.allclose(m(x), want, atol=1e-5, rtol=1e-5)


def test_time_major_stream_changes_no_value():
    """The time-major residual stream (every E-series layer computes time-major) against the
    batch-major one: the same logits, loss and gradients up to fp32 summation order."""
    x = torch.randint(0, 256, (3, 11))
    out = []
    for layout in ("auto", "batch"):
        m = tiny(layout=layout)
        assert m.time_major == (layout == "auto")
        logits = m(x[:, :-1])
        assert logits.shape == (3, 10, 256) and logits.transpose(0, 1).is_contiguous() == m.time_major
        loss = m.loss(x)
        loss.backward()
        out.append((logits.detach(), loss.detach(), [p.grad for p in m.parameters()]))
    (la, a, ga), (lb, b, gb) = out
    assert torch.allclose(la, lb, atol=1e-6, rtol=1e-5) and torch.allclose(a, b, atol=1e-6, rtol=1e-6)
    for p, q in zip(ga, gb):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-4)


def test_layout_follows_the_layers():
    assert tiny("E0").time_major and tiny("E42").time_major
    assert not tiny("E70").time_major            # the matrix family's layers are batch-major
    assert tiny("E70", layout="time").time_major
    with pytest.raises(ValueError, match="layout must be"):
        tiny(layout="column")


def test_time_major_input_copies_at_most_once():
    stream = torch.randn(7, 3, 8, dtype=torch.bfloat16)            # time-major storage
    y = stream.transpose(0, 1)                                      # the [B, T, d] view a layer gets
    assert time_major(y, torch.bfloat16).data_ptr() == stream.data_ptr()
    cast = time_major(y.float(), torch.bfloat16)                    # a cast is the one copy
    assert cast.is_contiguous() and torch.equal(cast, stream)
    batch = torch.randn(3, 7, 8)                                    # batch-major storage
    assert time_major(batch, torch.float32).is_contiguous()
    assert torch.equal(time_major(batch, torch.float32), batch.transpose(0, 1))


def test_residual_stays_fp32_under_bf16_autocast():
    norm = AddNorm(8)
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    res = torch.randn(2, 3, 8)
    y, r = norm(x, res)
    assert y.dtype == torch.bfloat16 and r.dtype == torch.float32
    assert torch.equal(r, x.float() + res)
    m = tiny()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m.loss(torch.randint(0, 256, (2, 9)))
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())


def test_torch_norm_agrees_with_fp64_to_fp32_rounding():
    g = torch.Generator().manual_seed(1)
    x, res = (torch.randn(64, 1280, generator=g) for _ in range(2))
    w = torch.randn(1280, generator=g)
    y, _ = add_rms_norm_torch(x, w, res)
    r = x.double() + res.double()
    want = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    assert (y.double() - want).abs().max().item() < 1e-5


def test_gradient_checkpointing_changes_nothing_but_memory():
    """Also across the spectral norm's in-forward update of its power-iteration vector:
    the recomputation must see the vector the forward saw."""
    x = torch.randint(0, 256, (2, 13))
    grads = []
    for ckpt in (False, True):
        m = tiny(gradient_checkpointing=ckpt)
        loss = m.loss(x)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert len(grads[0][1]) == len(grads[1][1])
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_levels_resolve_through_the_registry_and_options_pass_through():
    assert tiny("1").level == "E1"
    m = LadderLM("e0", 16, 1, backend="reference", r_h_mode="none")
    assert m.layers[0].w_h.mode == "none"
    with pytest.raises(KeyError, match="unknown level"):
        LadderLM("E999", 16, 1)
    with pytest.raises(TypeError):
        LadderLM("E1", 16, 1, backend="reference", no_such_option=3)
    with pytest.raises(ValueError, match="norm must be"):
        LadderLM("E1", 16, 1, norm="layernorm")


def test_norm_choice_follows_the_backend():
    assert tiny().norm == "torch"
    assert tiny(norm="torch").norms[0].impl == "torch"


def test_fused_norm_refuses_cpu_tensors():
    try:
        norm = AddNorm(8, "fused")
    except ImportError as exc:
        assert "mamba-ssm" in str(exc)
        return
    with pytest.raises(RuntimeError, match="needs CUDA"):
        norm(torch.randn(2, 8))


def test_bad_token_shape():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        tiny()(torch.zeros(5, dtype=torch.long))


@gpu
@needs_cuda
@pytest.mark.parametrize("impl", ["elman", "fused"])
def test_fused_norm_matches_torch_norm_on_gpu(impl):
    diff = compare_norms(dim=1280, rows=4096, impl=impl)
    assert diff["max_abs_residual"] == 0.0            # both add in fp32
    assert diff["max_abs_out"] < 0.05                 # bf16 output: at most an ulp or so
    assert diff["frac_out_differ"] < 0.05
    assert diff["max_abs_grad_residual"] < 1e-3 and diff["max_abs_grad_weight"] < 1.0


@gpu
@needs_cuda
@pytest.mark.parametrize("norm", ["elman", "fused"])
@pytest.mark.parametrize("level", ["E0", "E1"])
def test_cuda_model_matches_reference_model(level, norm):
    torch.manual_seed(0)
    ref = LadderLM(level, 256, 2, backend="reference", norm="torch").cuda()
    fast = LadderLM(level, 256, 2, backend="cuda", norm=norm).cuda()
    fast.load_state_dict(ref.state_dict())
    x = torch.randint(0, 256, (4, 65), device="cuda")
    losses = []
    for m in (ref, fast):
        loss = m.loss(x)
        loss.backward()
        losses.append((loss.item(), torch.cat([p.grad.flatten() for p in m.parameters()])))
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-4)
    assert (losses[0][1] - losses[1][1]).norm() / losses[0][1].norm() < 1e-3


@gpu
@needs_cuda
def test_bf16_training_step_on_gpu():
    torch.manual_seed(0)
    m = LadderLM("E1", 512, 2).cuda()
    assert m.backend == "cuda" and m.norm == "elman"
    x = torch.randint(0, 256, (8, 513), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = m.loss(x)
    loss.backward()
    assert math.isfinite(loss.item()) and all(p.grad is not None for p in m.parameters())
    assert all(p.dtype == torch.float32 for p in m.parameters())
