"""GPU parity of every registered variant's CUDA paths against its fp64 reference, forward
and every gradient, fp32 and bf16 (run by scripts/gpu_pass.sh; skipped without CUDA)."""
import pytest
import torch

from elman.families.dense import op as dense
from elman.harness import parity
from elman import registry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CASES = [(e.name, dt) for e in registry.variants() for dt in e.dtypes]


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
    t = dense.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), device, g)
    return {k: v.detach().to(dtype) for k, v in t.items()}


def test_path_reported():
    kw = _inputs()
    for path in ("persistent", "graph", "steps"):
        dense.gated_cell_cuda(**kw, path=path)
        assert dense.last_path["forward"] == path
    dense.gated_cell_cuda(**_inputs(D=100))
    assert dense.last_path["forward"] == "graph"


def test_graph_path_reuses_one_capture_per_shape():
    kw = _inputs(T=4, B=3, D=96)
    a = dense.gated_cell_cuda(**kw, path="graph")[0]
    graphs = dict(dense._graphs)  # the cache may be full: the count alone cannot show reuse
    b = dense.gated_cell_cuda(**kw, path="graph")[0]
    assert dense._graphs.keys() == graphs.keys() and torch.equal(a, b)
    assert all(dense._graphs[k][0] is graphs[k][0] for k in graphs)  # replayed, not recaptured


def test_persistent_refuses_unsupported_sizes():
    with pytest.raises(ValueError, match="persistent kernel does not take"):
        dense.gated_cell_cuda(**_inputs(D=100), path="persistent")
    with pytest.raises(ValueError, match="persistent kernel does not take"):
        dense.gated_cell_cuda(**_inputs(dtype=torch.float32), path="persistent")


def test_bad_inputs_raise_before_launch():
    kw = _inputs()
    with pytest.raises(ValueError, match="CUDA tensors"):
        dense.gated_cell_cuda(**{**kw, "w_h": kw["w_h"].cpu()})
    with pytest.raises(RuntimeError, match="dtype"):
        dense.gated_cell_cuda(**{**kw, "b": kw["b"].float()})
    with pytest.raises(ValueError, match="shape"):
        dense.gated_cell_cuda(**{**kw, "z": kw["z"][:, :1]})
    ext = __import__("elman.core.extension", fromlist=["load"]).load()
    T, B, D = kw["x"].shape
    wx = torch.randn(D, B, T, device="cuda", dtype=torch.bfloat16).permute(2, 1, 0)  # not contiguous
    out = torch.empty(T, B, D, device="cuda", dtype=torch.bfloat16)
    h_all = torch.empty(T + 1, B, D, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.dense_forward(wx, kw["z"], kw["w_h"], kw["b"], kw["h0"], out, h_all, 0, False)
    with pytest.raises(RuntimeError, match="epilogue"):
        ext.dense_forward(wx.contiguous(), kw["z"], kw["w_h"], kw["b"], kw["h0"], out, h_all, 7, False)
    with pytest.raises(RuntimeError, match="got 2 dimensions"):
        ext.dense_forward(wx[0].contiguous(), kw["z"], kw["w_h"], kw["b"], kw["h0"], out, h_all, 0, False)
    with pytest.raises(RuntimeError, match="does not take B=.*D=100"):
        x = torch.zeros(T, B, 100, device="cuda", dtype=torch.bfloat16)
        ext.dense_forward(x, x, torch.zeros(100, 100, device="cuda", dtype=torch.bfloat16),
                          x[0, 0], x[0], x, torch.zeros(T + 1, B, 100, device="cuda", dtype=torch.bfloat16),
                          0, True)


def test_misaligned_views_raise_and_lose_nothing():
    """A contiguous view that starts 2 bytes past a 16-byte boundary: the persistent kernels'
    16-byte input copies would fault (and take the CUDA context with it). The binding refuses
    it before launch and the next call still runs; the op (forward and backward) passes an
    aligned copy instead."""
    kw = _inputs(T=3, B=2, D=256)
    ext = __import__("elman.core.extension", fromlist=["load"]).load()
    T, B, D = kw["x"].shape
    odd = torch.randn(T * B * D + 1, device="cuda", dtype=torch.bfloat16)[1:].view(T, B, D)
    assert odd.is_contiguous() and odd.data_ptr() % 16 != 0
    out = torch.empty(T, B, D, device="cuda", dtype=torch.bfloat16)
    h_all = torch.empty(T + 1, B, D, device="cuda", dtype=torch.bfloat16)
    args = (kw["w_h"], kw["b"], kw["h0"], out, h_all, dense.GATE_SILU, True)
    with pytest.raises(RuntimeError, match="wx must start at a 16-byte aligned address"):
        ext.dense_forward(odd, kw["z"], *args)
    with pytest.raises(RuntimeError, match="z must start at a 16-byte aligned address"):
        ext.dense_forward(kw["x"], odd, *args)
    ext.dense_forward(kw["x"], kw["z"], *args)
    dv, dz, dh0 = torch.empty_like(out), torch.empty_like(out), torch.empty_like(kw["h0"])
    with pytest.raises(RuntimeError, match="d_out must start at a 16-byte aligned address"):
        ext.dense_backward(kw["w_h"], h_all, kw["z"], odd, kw["h0"], dv, dz, dh0, dense.GATE_SILU, True)
    ext.dense_backward(kw["w_h"], h_all, kw["z"], torch.randn_like(out), kw["h0"], dv, dz, dh0,
                       dense.GATE_SILU, True)
    torch.cuda.synchronize()
    assert not dv.isnan().any() and not dh0.isnan().any()
    # the same view on the per-step path is fine (its kernels make no 16-byte accesses)
    ext.dense_forward(odd, kw["z"], kw["w_h"], kw["b"], kw["h0"], out, h_all, dense.GATE_SILU, False)
    torch.cuda.synchronize()
    # the op itself takes such a view on the persistent path (it passes an aligned copy)
    a = dense.gated_cell_cuda(kw["x"], kw["z"], kw["w_x"], kw["w_h"], kw["b"], kw["h0"],
                              path="persistent")[0]
    b = dense.gated_cell_cuda(kw["x"], odd.copy_(kw["z"]), kw["w_x"], kw["w_h"], kw["b"], kw["h0"],
                              path="persistent")[0]
    assert torch.equal(a, b)
    x = kw["x"].clone().requires_grad_()
    out, _ = dense.gated_cell_cuda(x, kw["z"], kw["w_x"], kw["w_h"], kw["b"], kw["h0"],
                                   path="persistent")
    out.backward(odd)  # a misaligned upstream gradient reaches the persistent backward
    assert dense.last_path["backward"] == "persistent" and not x.grad.isnan().any()


def test_deterministic():
    kw = _inputs(T=9, B=5, D=512)
    a = dense.gated_cell_cuda(**kw, path="persistent")[0]
    b = dense.gated_cell_cuda(**kw, path="persistent")[0]
    assert torch.equal(a, b)
