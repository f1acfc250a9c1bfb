"""GPU parity of every registered variant's CUDA paths against its fp64 reference, forward
and every gradient, fp32 and bf16 (run by scripts/gpu_pass.sh; skipped without CUDA)."""
import pytest
import torch

from elman.core import extension as ops
from elman.families.dense import inputs as dense_inputs, op as dense
from elman.harness import parity
from elman import registry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CASES = [(e.name, dt) for e in registry.variants() for dt in e.dtypes]
EPILOGUE = "tanh_silu_gate"  # E0's and E1's


@pytest.mark.parametrize("level,dtype", CASES)
def test_variant_parity(level, dtype):
    recs = parity.check_entry(registry.get(level), [dtype])
    failed = [r for r in recs if not r["metrics"]["passed"]]
    assert recs and not failed, parity.table(failed)


def test_every_path_checked():
    recs = parity.check_entry(registry.get("E1"), ["bfloat16"], shapes=[(5, 4, 512), (3, 2, 100)])
    assert [r["impl"] for r in recs] == ["cuda:persistent", "cuda:graph", "cuda:steps",
                                         "cuda:graph", "cuda:steps"]


def _inputs(T=3, B=2, D=256, dtype=torch.bfloat16, device="cuda"):
    g = torch.Generator(device=device).manual_seed(1)
    t = dense_inputs.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), device, g)
    t = {k: v.detach().to(dtype) for k, v in t.items()}
    t["gates"] = (t.pop("z"),)
    return t


def _cell(path="auto", **kw):
    return dense.cell(EPILOGUE, **kw, path=path)


def test_epilogue_table_read_from_the_extension():
    table = dense.epilogues()
    assert table[EPILOGUE] == {"id": dense.epilogue_id(EPILOGUE), "gates": 1}
    with pytest.raises(ValueError, match="unknown dense epilogue"):
        dense.epilogue_id("no_such_epilogue")


def test_path_reported():
    kw = _inputs()
    for path in ("persistent", "graph", "steps"):
        _cell(path, **kw)
        assert dense.last_path["forward"] == path
    _cell(**_inputs(D=100))
    assert dense.last_path["forward"] == "graph"


def test_graph_path_reuses_one_capture_per_shape():
    kw = _inputs(T=4, B=3, D=96)
    a = _cell("graph", **kw)[0]
    graphs = dict(dense._graphs)  # the cache may be full: the count alone cannot show reuse
    b = _cell("graph", **kw)[0]
    assert dense._graphs.keys() == graphs.keys() and torch.equal(a, b)
    assert all(dense._graphs[k][0] is graphs[k][0] for k in graphs)  # replayed, not recaptured


@pytest.mark.parametrize("path", ["persistent", "graph", "steps"])
def test_no_bias_and_no_input_projection(path):
    """b = None is a zero bias and W_x = None feeds x as wx (E39), with gradients for the rest."""
    kw = _inputs()
    x = kw["x"].clone().requires_grad_()
    zero_b = torch.zeros_like(kw["b"])
    eye = torch.eye(x.shape[-1], device="cuda", dtype=x.dtype)
    a, ha = _cell(path, **{**kw, "x": x, "b": None, "w_x": None})
    b, hb = _cell(path, **{**kw, "b": zero_b, "w_x": eye})
    assert torch.equal(a, b) and torch.equal(ha, hb)
    a.float().sum().backward()
    assert x.grad is not None and not x.grad.isnan().any()


def test_persistent_refuses_unsupported_sizes():
    with pytest.raises(ValueError, match="persistent kernel does not take"):
        _cell("persistent", **_inputs(D=100))
    with pytest.raises(ValueError, match="persistent kernel does not take"):
        _cell("persistent", **_inputs(dtype=torch.float32))


def test_bad_inputs_raise_before_launch():
    kw = _inputs()
    with pytest.raises(ValueError, match="W_h must be a CUDA tensor"):
        _cell(**{**kw, "w_h": kw["w_h"].cpu()})
    with pytest.raises(TypeError, match="b has dtype float32"):
        _cell(**{**kw, "b": kw["b"].float()})
    with pytest.raises(ValueError, match=r"gates\[0\] has shape"):
        _cell(**{**kw, "gates": (kw["gates"][0][:, :1],)})
    with pytest.raises(ValueError, match="takes 1 gate input"):
        _cell(**{**kw, "gates": ()})
    ext = ops.load("dense")
    eid = dense.epilogue_id(EPILOGUE)
    T, B, D = kw["x"].shape
    z = kw["gates"][0]
    wx = torch.randn(D, B, T, device="cuda", dtype=torch.bfloat16).permute(2, 1, 0)  # not contiguous
    out = torch.empty(T, B, D, device="cuda", dtype=torch.bfloat16)
    h_all = torch.empty(T + 1, B, D, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        ext.forward(eid, wx, [z], kw["w_h"], kw["b"], kw["h0"], out, h_all, False)
    with pytest.raises(ValueError, match="unknown dense epilogue id 7"):
        ext.forward(7, wx.contiguous(), [z], kw["w_h"], kw["b"], kw["h0"], out, h_all, False)
    with pytest.raises(ValueError, match="takes 1 gates, got 2"):
        ext.forward(eid, wx.contiguous(), [z, z], kw["w_h"], kw["b"], kw["h0"], out, h_all, False)
    with pytest.raises(ValueError, match="got 2 dimensions"):
        ext.forward(eid, wx[0].contiguous(), [z], kw["w_h"], kw["b"], kw["h0"], out, h_all, False)
    # the crash of the report: an empty batch, a zero width, a wrong W_h or bias, on both paths
    for persistent in (True, False):
        empty = torch.zeros(T, 0, D, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="empty dimension"):
            ext.forward(eid, empty, [empty], kw["w_h"], kw["b"], kw["h0"][:0], empty,
                        torch.zeros(T + 1, 0, D, device="cuda", dtype=torch.bfloat16), persistent)
        with pytest.raises(ValueError, match=r"W_h has shape \[256, 255\]; expected \[256, 256\]"):
            ext.forward(eid, wx.contiguous(), [z], kw["w_h"][:, 1:].contiguous(), kw["b"], kw["h0"],
                        out, h_all, persistent)
        with pytest.raises(ValueError, match=r"b has shape \[255\]; expected \[256\]"):
            ext.forward(eid, wx.contiguous(), [z], kw["w_h"], kw["b"][1:].contiguous(), kw["h0"],
                        out, h_all, persistent)
    with pytest.raises(ValueError, match="does not take B=.*D=100"):
        x = torch.zeros(T, B, 100, device="cuda", dtype=torch.bfloat16)
        ext.forward(eid, x, [x], torch.zeros(100, 100, device="cuda", dtype=torch.bfloat16),
                    x[0, 0], x[0], x, torch.zeros(T + 1, B, 100, device="cuda", dtype=torch.bfloat16),
                    True)
    _cell(**kw)  # the context still works
    torch.cuda.synchronize()


def test_misaligned_views_raise_and_lose_nothing():
    """A contiguous view that starts 2 bytes past a 16-byte boundary: the persistent kernels'
    16-byte input copies would fault (and take the CUDA context with it). The binding refuses
    it before launch and the next call still runs; the op (forward and backward) passes an
    aligned copy instead."""
    kw = _inputs(T=3, B=2, D=256)
    ext = ops.load("dense")
    eid = dense.epilogue_id(EPILOGUE)
    z = kw["gates"][0]
    T, B, D = kw["x"].shape
    odd = torch.randn(T * B * D + 1, device="cuda", dtype=torch.bfloat16)[1:].view(T, B, D)
    assert odd.is_contiguous() and odd.data_ptr() % 16 != 0
    out = torch.empty(T, B, D, device="cuda", dtype=torch.bfloat16)
    h_all = torch.empty(T + 1, B, D, device="cuda", dtype=torch.bfloat16)
    args = (kw["w_h"], kw["b"], kw["h0"], out, h_all, True)
    with pytest.raises(ValueError, match="wx must start at a 16-byte aligned address"):
        ext.forward(eid, odd, [z], *args)
    with pytest.raises(ValueError, match=r"gates\[0\] must start at a 16-byte aligned address"):
        ext.forward(eid, kw["x"], [odd], *args)
    ext.forward(eid, kw["x"], [z], *args)
    dv, dz, dh0 = torch.empty_like(out), torch.empty_like(out), torch.empty_like(kw["h0"])
    with pytest.raises(ValueError, match="d_out must start at a 16-byte aligned address"):
        ext.backward(eid, kw["w_h"], h_all, [z], odd, kw["h0"], dv, [dz], dh0, True)
    ext.backward(eid, kw["w_h"], h_all, [z], torch.randn_like(out), kw["h0"], dv, [dz], dh0, True)
    torch.cuda.synchronize()
    assert not dv.isnan().any() and not dh0.isnan().any()
    # the same view on the per-step path is fine (its kernels make no 16-byte accesses)
    ext.forward(eid, odd, [z], kw["w_h"], kw["b"], kw["h0"], out, h_all, False)
    torch.cuda.synchronize()
    # the op itself takes such a view on the persistent path (it passes an aligned copy)
    a = _cell("persistent", **kw)[0]
    b = _cell("persistent", **{**kw, "gates": (odd.copy_(z),)})[0]
    assert torch.equal(a, b)
    x = kw["x"].clone().requires_grad_()
    out, _ = _cell("persistent", **{**kw, "x": x})
    out.backward(odd)  # a misaligned upstream gradient reaches the persistent backward
    assert dense.last_path["backward"] == "persistent" and not x.grad.isnan().any()


def test_deterministic():
    kw = _inputs(T=9, B=5, D=512)
    a = _cell("persistent", **kw)[0]
    b = _cell("persistent", **kw)[0]
    assert torch.equal(a, b)


def test_production_extension_has_no_probes_and_dev_has_the_trace():
    ext, dev = ops.load("dense"), ops.load("dev")
    assert not hasattr(ext, "clock_probe") and not hasattr(ext, "dense_forward_traced")
    kw = _inputs(T=4, B=3, D=512)
    T, B, D = kw["x"].shape
    out = torch.empty(T, B, D, device="cuda", dtype=torch.bfloat16)
    h_all = torch.empty(T + 1, B, D, device="cuda", dtype=torch.bfloat16)
    trace = torch.zeros(T * 6 + 4, device="cuda", dtype=torch.int64)
    dev.dense_forward_traced(dense.epilogue_id(EPILOGUE), kw["x"], list(kw["gates"]), kw["w_h"],
                             kw["b"], kw["h0"], out, h_all, trace)
    plain, plain_h = torch.empty_like(out), torch.empty_like(h_all)
    ext.forward(dense.epilogue_id(EPILOGUE), kw["x"], list(kw["gates"]), kw["w_h"], kw["b"],
                kw["h0"], plain, plain_h, True)
    torch.cuda.synchronize()
    assert torch.equal(out, plain) and (trace[:T * 6] > 0).all()


def test_throughput_probe_reports_plausible_rates():
    from elman.harness import probes

    rates = {r["params"]["op"]: r["metrics"]["per_clock_per_sm"] for r in probes.throughput_records(iters=512)}
    assert set(rates) == set(probes.THROUGHPUT_OPS)
    # four FP32 pipes of 32 lanes at most; the special-function units (16 lanes an SM) below them
    assert 16 <= rates["fma"] <= 128.5 and 0 < rates["tanh_approx"] <= 16.5
    with pytest.raises(ValueError, match="sink"):
        ops.load("dev").throughput(0, 1, 32, 1, torch.zeros(3, dtype=torch.int64, device="cuda"),
                                   torch.zeros(1, dtype=torch.int32, device="cuda"))
