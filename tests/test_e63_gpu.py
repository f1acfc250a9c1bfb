"""E63 a/b/c/d on the GPU (skipped without CUDA; the registry-wide parity of every path and
dtype is tests/test_parity_gpu.py): the compiled op against the PyTorch statement of its
schedule (out, h_all, the stored activations, d_pre, dh0) in fp32 and bf16 on both paths, graph
against steps, each layer on the CUDA backend against its reference backend
(every parameter's gradient), autocast, and the binding's errors before any launch."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.core.entry import rel_error
from elman.families.dense import delta

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NAMES = ("E63", "E63b", "E63c", "E63d")
MODES = tuple(delta.MODES)


def _op_inputs(mode, T, B, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    G, R = delta.CHANNELS[mode], delta.RECURRENT[mode]
    pre = torch.randn(T, B, G * D, device="cuda", generator=g, dtype=torch.float64)
    w = torch.randn(R * D, D, device="cuda", generator=g, dtype=torch.float64)
    w_rec = w * (0.9 / torch.linalg.matrix_norm(w[:D], ord=2))
    h0 = torch.rand(B, D, device="cuda", generator=g, dtype=torch.float64) - 0.5
    return pre.to(dtype), w_rec.to(dtype), h0.to(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["graph", "steps"])
@pytest.mark.parametrize("T,B,D", [(1, 1, 32), (7, 3, 100), (5, 16, 1024), (3, 4, 2048)])
def test_op_matches_its_schedule(mode, dtype, path, T, B, D):
    pre, w_rec, h0 = _op_inputs(mode, T, B, D, dtype)
    out = torch.full((T, B, D), float("nan"), device="cuda", dtype=dtype)
    h_all = torch.full((T + 1, B, D), float("nan"), device="cuda", dtype=dtype)
    act = torch.full_like(pre, float("nan"))
    delta.forward_into(path, mode, pre, w_rec, h0, out, h_all, act)
    r_out, r_hall, r_act = delta.emulate_forward(mode, pre.double(), w_rec.double(), h0.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b, n in ((out, r_out, "out"), (h_all, r_hall, "h_all"), (act, r_act, "act")):
        assert rel_error(a.double(), b) < tol, n
    g = torch.Generator(device="cuda").manual_seed(1)
    d_out = torch.randn(T, B, D, device="cuda", generator=g).to(dtype)
    d_hT = torch.randn(B, D, device="cuda", generator=g).to(dtype)
    d_pre = torch.full_like(pre, float("nan"))
    dh0 = torch.full_like(h0, float("nan"))
    delta.backward_into(path, mode, w_rec, h_all, act, d_out, d_hT, d_pre, dh0)
    r_dpre, r_dh0, _ = delta.emulate_backward(mode, w_rec.double(), h_all.double(), act.double(),
                                              d_out.double(), d_hT.double())
    assert rel_error(d_pre.double(), r_dpre) < tol and rel_error(dh0.double(), r_dh0) < tol


@pytest.mark.parametrize("mode", MODES)
def test_graph_and_steps_agree(mode):
    """The same kernels from a stream and from a CUDA graph (cuBLAS may pick another algorithm
    under capture, so the sums may differ in their last bits)."""
    pre, w_rec, h0 = _op_inputs(mode, 9, 8, 512, torch.float32, seed=4)
    (a, ha), (b, hb) = (delta.cell(mode, pre, w_rec, h0, path) for path in ("graph", "steps"))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ha, hb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("path", ["graph", "steps"])
def test_layer_cuda_matches_reference_backend(name, path):
    torch.manual_seed(0)
    cls = registry.get(name).layer
    ref = cls(256, backend="reference").cuda()
    fast = cls(256, backend="cuda", path=path).cuda()
    fast.load_state_dict(ref.state_dict())
    y = torch.randn(4, 9, 256, device="cuda")
    h0 = 0.3 * torch.randn(4, 256, device="cuda")
    g = torch.randn(4, 9, 256, device="cuda")
    out_r, h_r = ref(y, h0)
    (out_r * g).sum().add(h_r.sum()).backward()
    out_f, h_f = fast(y, h0)
    (out_f * g).sum().add(h_f.sum()).backward()
    assert delta.last_path == {"forward": path, "backward": path}
    assert rel_error(out_f, out_r) < 1e-4 and rel_error(h_f, h_r) < 1e-4
    grads_r = dict(ref.named_parameters())
    for n, p in fast.named_parameters():
        assert rel_error(p.grad, grads_r[n].grad) < 1e-4, f"{name} {path}: grad of {n}"


@pytest.mark.parametrize("name", NAMES)
def test_layer_under_bf16_autocast(name):
    torch.manual_seed(1)
    cls = registry.get(name).layer
    ref = cls(128, backend="reference").cuda()
    fast = cls(128, backend="cuda").cuda()
    fast.load_state_dict(ref.state_dict())
    y = torch.randn(2, 7, 128, device="cuda")
    out_r, _ = ref(y)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_f, _ = fast(y)
    assert out_f.dtype == torch.bfloat16 and rel_error(out_f.float(), out_r) < 3e-2
    out_f.float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in fast.parameters())


def test_binding_rejects_bad_operands_before_launch():
    ext = delta._ext()
    pre, w_rec, h0 = _op_inputs("c", 3, 2, 64, torch.float32)
    out = torch.empty(3, 2, 64, device="cuda")
    h_all = torch.empty(4, 2, 64, device="cuda")
    act = torch.empty_like(pre)
    with pytest.raises(ValueError, match="mode"):
        ext.delta_forward(7, pre, w_rec, h0, out, h_all, act)
    with pytest.raises(ValueError, match="W_rec"):
        ext.delta_forward(2, pre, w_rec[:64].contiguous(), h0, out, h_all, act)
    with pytest.raises(ValueError, match="blocks"):
        ext.delta_forward(2, pre[..., :-1].contiguous(), w_rec, h0, out, h_all, act)
    with pytest.raises(ValueError, match="contiguous"):
        ext.delta_forward(2, pre, w_rec.t().contiguous().t(), h0, out, h_all, act)
    with pytest.raises(TypeError, match="dtype"):
        ext.delta_forward(2, pre, w_rec, h0.double(), out, h_all, act)
    with pytest.raises(ValueError, match="empty"):
        ext.delta_forward(2, pre[:0], w_rec, h0, out[:0], h_all[:1], act[:0])
    with pytest.raises(ValueError, match="persistent"):
        delta.cell("c", pre, w_rec, h0, "persistent")
