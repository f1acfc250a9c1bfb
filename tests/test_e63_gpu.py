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


# ---- the persistent path (E63a, b, d in bf16: the delta_* epilogues of the dense kernels) ----
PERSISTENT_MODES = ("a", "b", "d")
PERSISTENT_SHAPES = [(5, 1, 256), (7, 64, 256), (5, 1, 1024), (9, 64, 1024), (5, 4, 2048)]


def _planes_inputs(mode, T, B, D, seed=0):
    pre, w_rec, h0 = _op_inputs(mode, T, B, D, torch.bfloat16, seed)
    G = delta.CHANNELS[mode]
    planes = pre.view(T, B, G, D).permute(2, 0, 1, 3).contiguous()
    return pre, planes, w_rec, h0


@pytest.mark.parametrize("mode", PERSISTENT_MODES)
@pytest.mark.parametrize("T,B,D", PERSISTENT_SHAPES)
def test_persistent_matches_its_schedule(mode, T, B, D):
    """Forward (out, h_all, v_all) and backward (every pre-activation gradient, dh0) of the
    persistent kernels (cluster design at D <= 1024, grid design beyond) against the
    epilogue's schedule in fp64 on the same bf16 inputs."""
    pre, planes, w_h, h0 = _planes_inputs(mode, T, B, D)
    nan = dict(device="cuda", dtype=torch.bfloat16)
    out = torch.full((T, B, D), float("nan"), **nan)
    h_all = torch.full((T + 1, B, D), float("nan"), **nan)
    v_all = torch.full((T, B, D), float("nan"), **nan)
    delta.persistent_forward_into(mode, planes, w_h, h0, out, h_all, v_all)
    r_out, r_hall, r_v = delta.emulate_persistent_forward(mode, pre.double(), w_h.double(), h0.double())
    tol = 2e-2 if mode != "d" else 3e-2
    for a, b, n in ((out, r_out, "out"), (h_all, r_hall, "h_all"), (v_all, r_v, "v_all")):
        assert rel_error(a.double(), b) < tol, n
    g = torch.Generator(device="cuda").manual_seed(1)
    d_out = torch.randn(T, B, D, device="cuda", generator=g).bfloat16()
    d_hT = torch.randn(B, D, device="cuda", generator=g).bfloat16()
    dv = torch.full((T, B, D), float("nan"), **nan)
    d_gates = [torch.full((T, B, D), float("nan"), **nan) for _ in range(delta.CHANNELS[mode] - 1)]
    dh0 = torch.full((B, D), float("nan"), **nan)
    delta.persistent_backward_into(mode, w_h, h_all, v_all, planes, d_out, d_hT, dv, d_gates, dh0)
    r_dpre, r_dh0 = delta.emulate_persistent_backward(mode, w_h.double(), h_all.double(),
                                                      v_all.double(), pre.double(),
                                                      d_out.double(), d_hT.double())
    d_pre = torch.stack([dv, *d_gates], 2).view(T, B, -1)
    assert rel_error(d_pre.double(), r_dpre) < tol and rel_error(dh0.double(), r_dh0) < tol


@pytest.mark.parametrize("mode", PERSISTENT_MODES)
@pytest.mark.parametrize("T,B,D", [(7, 64, 1024), (5, 4, 2048)])
def test_persistent_agrees_with_graph(mode, T, B, D):
    """The autograd cell on the persistent path against the graph path (bf16): outputs, h_T
    and the gradients of pre, W_h and h0."""
    results = {}
    for path in ("persistent", "graph"):
        pre, _, w_h, h0 = _planes_inputs(mode, T, B, D, seed=2)
        pre, w_h, h0 = (t.requires_grad_() for t in (pre, w_h, h0))
        out, h_T = delta.cell(mode, pre, w_h, h0, path)
        assert delta.last_path["forward"] == path
        g = torch.Generator(device="cuda").manual_seed(5)
        (out.float() * torch.randn(out.shape, device="cuda", generator=g)).sum().add(
            h_T.float().sum()).backward()
        assert delta.last_path["backward"] == path
        results[path] = (out, h_T, pre.grad, w_h.grad, h0.grad)
    for a, b, n in zip(results["persistent"], results["graph"], ("out", "h_T", "pre", "W_h", "h0")):
        assert rel_error(a.double(), b.double()) < 3e-2, n


def test_auto_takes_persistent_where_it_runs():
    for mode, D, dtype, want in (("a", 1024, torch.bfloat16, "persistent"),
                                 ("b", 2048, torch.bfloat16, "persistent"),
                                 ("d", 256, torch.bfloat16, "persistent"),
                                 ("c", 1024, torch.bfloat16, "graph"),
                                 ("a", 1024, torch.float32, "graph"),
                                 ("a", 100, torch.bfloat16, "graph")):
        pre, w_rec, h0 = _op_inputs(mode, 3, 4, D, dtype)
        delta.cell(mode, pre, w_rec, h0)
        assert delta.last_path["forward"] == want, (mode, D, dtype)
        assert delta.paths(mode, 4, D, dtype)[0] == want


@pytest.mark.parametrize("name", ("E63", "E63b", "E63d"))
def test_layer_on_the_persistent_path(name):
    torch.manual_seed(0)
    cls = registry.get(name).layer
    ref = cls(256, backend="reference").cuda()
    fast = cls(256, backend="cuda", path="persistent").cuda()
    fast.load_state_dict(ref.state_dict())
    y = torch.randn(4, 9, 256, device="cuda")
    h0 = 0.3 * torch.randn(4, 256, device="cuda")
    g = torch.randn(4, 9, 256, device="cuda")
    out_r, h_r = ref(y, h0)
    (out_r * g).sum().add(h_r.sum()).backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_f, h_f = fast(y, h0)
    (out_f.float() * g).sum().add(h_f.float().sum()).backward()
    assert delta.last_path == {"forward": "persistent", "backward": "persistent"}
    assert rel_error(out_f.float(), out_r) < 3e-2 and rel_error(h_f.float(), h_r) < 3e-2
    grads_r = dict(ref.named_parameters())
    for n, p in fast.named_parameters():
        assert rel_error(p.grad, grads_r[n].grad) < 5e-2, f"{name}: grad of {n}"


@pytest.mark.parametrize("level,dtype,shapes,impls", [
    ("E63", "bfloat16", [(5, 1, 256), (7, 64, 1024), (3, 4, 2048)], 3),
    ("E63b", "bfloat16", [(5, 1, 256), (7, 64, 1024), (3, 4, 2048)], 3),
    ("E63d", "bfloat16", [(5, 1, 256), (7, 64, 1024), (3, 4, 2048)], 3),
    ("E63c", "bfloat16", [(5, 1, 256), (7, 64, 1024), (3, 4, 2048)], 2),
    ("E63", "float32", [(5, 3, 100), (3, 4, 2048)], 2),
    ("E63c", "float32", [(5, 3, 100), (3, 4, 2048)], 2),
])
def test_registry_parity_on_every_path(level, dtype, shapes, impls):
    """The harness's parity (every output, h_T, every gradient against the reference) on each
    path the op lists: persistent + graph + steps for 63a/b/d in bf16, graph + steps else."""
    from elman.harness import parity
    recs = parity.check_entry(registry.get(level), [dtype], shapes=shapes)
    assert len(recs) == impls * len(shapes)
    if impls == 3:
        assert sum(r["impl"] == "cuda:persistent" for r in recs) == len(shapes)
    failed = [r for r in recs if not r["metrics"]["passed"]]
    assert not failed, parity.table(failed)


def test_persistent_rejects_bad_operands_before_launch():
    from elman.families.dense import op as dense
    ext = delta._ext()
    table = ext.epilogues()
    eid = table["delta_complementary"]["id"]
    assert table["delta_independent"]["gates"] == 2 and table["delta_additive"]["gates"] == 1
    _, planes, w_h, h0 = _planes_inputs("a", 3, 2, 256)
    out = torch.empty(3, 2, 256, device="cuda", dtype=torch.bfloat16)
    h_all = torch.empty(4, 2, 256, device="cuda", dtype=torch.bfloat16)
    v_all = torch.empty_like(out)
    args = (eid, planes[0], [planes[1]], w_h, None, h0, out, h_all)
    with pytest.raises(ValueError, match="needs v_all"):
        ext.forward(*args, True)
    with pytest.raises(ValueError, match="persistent path only"):
        ext.forward(*args, False, v_all)
    with pytest.raises(ValueError, match="v_all"):
        ext.forward(*args, True, v_all[:2].contiguous())
    with pytest.raises(ValueError, match="does not read"):
        ext.forward(table["tanh_silu_gate"]["id"], *args[1:], True, v_all)
    with pytest.raises(ValueError, match="gates"):
        ext.forward(eid, planes[0], [], w_h, None, h0, out, h_all, True, v_all)
    with pytest.raises(ValueError, match="persistent path only"):
        ext.backward(eid, w_h, h_all, [planes[1]], out, h0, out.clone(), [out.clone()], h0.clone(),
                     False, v_all)
    pre, w_rec, h0 = _op_inputs("a", 3, 2, 100, torch.bfloat16)
    with pytest.raises(ValueError, match="does not take"):
        delta.cell("a", pre, w_rec, h0, "persistent")
    pre, w_rec, h0 = _op_inputs("a", 3, 65, 2048, torch.bfloat16)
    with pytest.raises(ValueError, match="B must be <= 64"):
        delta.cell("a", pre, w_rec, h0, "persistent")
    pre, w_rec, h0 = _op_inputs("b", 3, 2, 256, torch.float32)
    with pytest.raises(ValueError, match="bf16 only"):
        delta.cell("b", pre, w_rec, h0, "persistent")
    pre, w_rec, h0 = _op_inputs("c", 3, 2, 256, torch.bfloat16)
    with pytest.raises(ValueError, match="E63c has no persistent path"):
        delta.cell("c", pre, w_rec, h0, "persistent")
    assert "delta_additive" in dense.epilogues()
