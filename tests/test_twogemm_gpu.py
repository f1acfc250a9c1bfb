"""The two-GEMM family on the GPU: each fused stage kernel against its PyTorch statement
(stages.py) on the same inputs, the graph and steps paths, path reporting, the errors
before launch, and E23's backward memory against the tape history (run by
scripts/gpu_pass.sh; skipped without CUDA). Parity of every level is in test_parity_gpu.py."""
from __future__ import annotations

import pytest
import torch

from elman import registry
from elman.core.entry import Shape, rel_error
from elman.families.twogemm import inputs, op, stages

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DTYPES = [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)]
LOW_RANK = ["E4", "E5", "E66", "E66r16", "E66r64", "E66r128", "E67lr"]
TAPE = ["E23", "E23n32", "E23n128"]


def _rand(*shape, dtype, g):
    return torch.randn(*shape, device="cuda", generator=g).to(dtype)


def _both(fn_name: str, make_args, outputs: tuple[str, ...]):
    """Run one stage as the kernel and as PyTorch on copies of the same inputs; return
    {output name: (kernel result, PyTorch result)}."""
    ext = op.cuda_stages()
    results = []
    for st in (ext, stages):
        args = make_args()
        getattr(st, fn_name)(*args.values())
        results.append(args)
    return {k: (results[0][k], results[1][k]) for k in outputs}


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("mode", sorted(stages.MODES))
@pytest.mark.parametrize("B,D", [(1, 32), (3, 100), (4, 512)])
def test_lowrank_stage_kernels(mode, dtype, tol, B, D):
    m = stages.MODES[mode]
    g = torch.Generator(device="cuda").manual_seed(B * D)
    base = {k: _rand(B, D, dtype=dtype, g=g) for k in ("a", "c", "q", "h_prev", "d_out", "h", "g")}
    base["b"] = _rand(D, dtype=dtype, g=g)
    base["aux"] = torch.rand(B, D, device="cuda", generator=g).to(dtype) * 0.9

    def fwd():
        t = {k: base[k].clone() for k in ("a", "c", "q", "b", "h_prev")}
        return {"mode": m, **t, "h_next": torch.full_like(t["a"], float("nan")),
                "out": torch.full_like(t["a"], float("nan")),
                "aux": torch.full_like(t["a"], float("nan")) if m else None}

    def bwd():
        t = {k: base[k].clone() for k in ("d_out", "c", "h_prev", "h", "aux", "g")}
        t["aux"] = t["aux"] if m else None
        return {"mode": m, **t, **{k: torch.full_like(base["a"], float("nan"))
                                   for k in ("d_pre", "d_c", "g_out")}}
    outs = ("h_next", "out", "aux") if m else ("h_next", "out")
    for name, (k, r) in {**_both("lowrank_forward", fwd, outs),
                         **_both("lowrank_backward", bwd, ("d_pre", "d_c", "g_out"))}.items():
        assert rel_error(k, r) <= tol or r.abs().max() == 0, name


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("B,N,D", [(1, 8, 32), (3, 8, 100), (4, 8, 512), (2, 32, 256), (2, 128, 96), (1, 256, 64)])
def test_tape_stage_kernels(dtype, tol, B, N, D):
    g = torch.Generator(device="cuda").manual_seed(B * N * D)
    row = {k: _rand(B, D, dtype=dtype, g=g) for k in ("wx", "z", "hw", "w_prev", "w", "u", "d_out", "g", "gw")}
    row["b"] = _rand(D, dtype=dtype, g=g)
    m = _rand(B, N, D, dtype=dtype, g=g)
    dm = torch.randn(B, N, D, device="cuda", generator=g)

    def nan():
        return torch.full_like(row["wx"], float("nan"))

    def read():
        return {**{k: row[k].clone() for k in ("wx", "z", "hw", "b")}, "m": m.clone(),
                "w_prev": row["w_prev"].clone(), "w_out": nan(), "out": nan()}

    def write():
        mm = m.clone()
        return {"m_in": mm, "w": row["w"].clone(), "u": row["u"].clone(), "m_out": mm}

    def write_back():
        return {"m": m.clone(), "dm": dm.clone(), **{k: row[k].clone() for k in ("w", "u", "d_out", "z", "g")},
                "gw": nan(), "du": nan(), "dz": nan()}

    def read_back():
        return {"m": m.clone(), "dm": dm.clone(), **{k: row[k].clone() for k in ("w_prev", "w", "gw")},
                "d_pre": nan(), "g_out": nan()}
    checks = {**_both("tape_read", read, ("w_out", "out")),
              **{"write:" + k: v for k, v in _both("tape_write", write, ("m_out",)).items()},
              **{"wb:" + k: v for k, v in _both("tape_write_backward", write_back, ("dm", "gw", "du", "dz")).items()},
              **{"rb:" + k: v for k, v in _both("tape_read_backward", read_back, ("dm", "d_pre", "g_out")).items()}}
    for name, (k, r) in checks.items():
        assert rel_error(k, r) <= tol, (name, rel_error(k, r))


def _case(level: str, dtype=torch.float32, T=5, B=2, D=64):
    e = registry.get(level)
    shape = e.test_shapes[0]
    shape = Shape(T, B, D, None, shape.n)
    return e, e.parity(shape, dtype, "cuda", torch.Generator(device="cuda").manual_seed(0))


@pytest.mark.parametrize("level", LOW_RANK + TAPE)
def test_paths_agree_and_path_reported(level):
    """graph and steps run the same kernels and GEMMs; the persistent kernels sum in another
    order (and the low-rank one keeps p in fp32): bf16 rounding apart. At this size every
    persistent backward fits too."""
    e, cases = _case(level, torch.bfloat16)
    impls = [c.impl for c in cases]
    assert impls[-2:] == ["cuda:graph", "cuda:steps"]
    assert "cuda:persistent" in impls
    res = {}
    for c in cases:
        a = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in c.inputs.items()}
        outs = c.fast(**a)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        assert op.last_path == {"forward": c.impl[5:], "backward": c.impl[5:]}
        res[c.impl] = [*outs, *(a[k].grad for k in a)]
    for impl, tol in (("cuda:graph", 1e-3), ("cuda:persistent", 3e-2)):
        for x, y in zip(res.get(impl, []), res["cuda:steps"]):
            assert rel_error(x, y) < tol, impl


def test_persistent_path_raises_where_not_taken():
    """Sizes whose weights do not fit a cluster's shared memory, and fp32 (bf16 only)."""
    bf = torch.bfloat16
    _, cases = _case("E23", D=1024)
    a = {k: v.detach().to(bf) for k, v in cases[0].inputs.items()}
    with pytest.raises(ValueError, match="does not take"):
        op.tape_cell(**a, path="persistent")
    with pytest.raises(ValueError, match="bf16 only"):
        op.tape_cell(**{k: v.float() for k, v in a.items()}, path="persistent")
    _, cases = _case("E4", D=2048)
    a = {k: v.detach().to(bf) for k, v in cases[0].inputs.items()}
    a["u"] = torch.randn(2048, 1024, device="cuda", dtype=bf)
    a["v"] = torch.randn(1024, 2048, device="cuda", dtype=bf)
    from elman.variants import e4
    with pytest.raises(ValueError, match="does not take"):
        e4.cell(**a, path="persistent")


def test_unsupported_slots_raise_before_launch():
    e, cases = _case("E23")
    a = {k: v.detach().float() for k, v in cases[0].inputs.items()}
    a["tape0"] = torch.zeros(2, op.MAX_SLOTS + 1, 64, device="cuda")
    with pytest.raises(ValueError, match="unsupported"):
        op.tape_cell(**a)


@pytest.mark.parametrize("level", LOW_RANK + TAPE)
def test_layer_cuda_matches_reference(level):
    e = registry.get(level)
    torch.manual_seed(0)
    ref = e.layer(64, expansion=1.0, backend="reference").cuda()
    fast = e.layer(64, expansion=1.0, backend="cuda").cuda()
    fast.load_state_dict(ref.state_dict())
    ref.eval(), fast.eval()
    y = torch.randn(2, 7, 64, device="cuda")
    flat = lambda outs: [t for o in outs for t in (o if isinstance(o, tuple) else (o,))]  # noqa: E731
    for a, b in zip(flat(fast(y)), flat(ref(y))):
        assert rel_error(a, b) < 1e-4


def test_tape_persistent_backward_falls_back_where_segments_do_not_fit():
    """E23 at N = 128, D = 512, T = 256: the forward runs persistent, a segment of 16 tapes
    does not fit a cluster's shared memory, so the backward is the graph loop."""
    e = registry.get("E23n128")
    kw = inputs.reference_inputs(e.reference, Shape(256, 2, 512, None, 128), "cuda",
                                 torch.Generator(device="cuda").manual_seed(0))
    a = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in kw.items()}
    outs = op.tape_cell(**a, path="persistent")
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert op.last_path == {"forward": "persistent", "backward": "graph"}


def test_tape_backward_memory_below_history():
    """E23's backward holds (T/K + K) tapes, not the T + 1 of the whole history."""
    T, B, N, D = 256, 4, 32, 512
    e = registry.get("E23n32")
    kw = inputs.reference_inputs(e.reference, Shape(T, B, D, None, N), "cuda",
                                 torch.Generator(device="cuda").manual_seed(0))
    a = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in kw.items()}
    history = (T + 1) * B * N * D * 2
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    outs = op.tape_cell(**a, path="steps")
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    assert peak < history, (peak, history)
