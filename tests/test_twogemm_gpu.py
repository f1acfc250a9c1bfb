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
    assert ("cuda:persistent" in impls) == (level != "E23n128")  # N = 128: not on chip
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


def test_tape_persistent_backward_falls_back_where_d_is_not_a_multiple_of_8():
    """E23 at D = 100: the forward runs persistent, the backward copies 16-byte rows and does
    not take the size, so it is the graph loop (over the persistent forward's checkpoints)."""
    e = registry.get("E23")
    kw = inputs.reference_inputs(e.reference, Shape(9, 3, 100, None, 8), "cuda",
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


# ---- the low-rank persistent kernels at the edges of their design ---------------------------
# (T, B, D, r): one CTA with padded rows and rank (D = 48, r = 5); two CTAs (D = 200, r = 17,
# rank tile 2); eight CTAs with two clusters, the second partly filled (B = 9, D = 520: the
# last CTA holds 8 live rows); the benchmark shape; rank tile 16 at 64 and at 128 rows a CTA
# (the most registers); 16 CTAs (D = 2048); r = 16 (one rank tile); odd T and T = 1. Rank
# tiles 16-19 in shared memory (r above 256): E66's 100M layer (D = 1280, r = 320, 10 CTAs),
# two clusters of 10 whose last CTA holds 8 live rows (D = 1160), one 64-row CTA (D = 48,
# r = 300 > D) and two CTAs with a padded rank (D = 200, r = 257).
PERSISTENT_EDGES = [(1, 1, 48, 5), (7, 3, 200, 17), (33, 9, 520, 64), (17, 4, 512, 128),
                    (5, 2, 1024, 256), (4, 3, 768, 256), (3, 2, 2048, 128), (9, 16, 512, 16),
                    (6, 2, 1280, 320), (4, 9, 1160, 320), (3, 1, 48, 300), (5, 3, 200, 257)]


def _lowrank_inputs(T, B, D, r, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", generator=g, dtype=torch.float64)
    u = torch.randn(D, r, **kw) / r ** 0.5
    v = torch.randn(r, D, **kw) / D ** 0.5
    s = (0.95 / torch.linalg.matrix_norm(u @ v, ord=2)).sqrt()
    return dict(a=torch.randn(T, B, D, **kw), c=torch.randn(T, B, D, **kw), u=u * s, v=v * s,
                b=0.1 * torch.randn(D, **kw), h0=torch.rand(B, D, **kw) - 0.5)


@pytest.mark.parametrize("mode", sorted(stages.MODES))
@pytest.mark.parametrize("T,B,D,r", PERSISTENT_EDGES)
def test_lowrank_persistent_parity(mode, T, B, D, r):
    """Every output and gradient of the persistent kernels against fp64 autograd through the
    per-step loops, and the path reported."""
    x = _lowrank_inputs(T, B, D, r, seed=T + B + D + r)
    g = torch.Generator(device="cuda").manual_seed(5)
    d_out = torch.randn(T, B, D, device="cuda", generator=g, dtype=torch.float64)
    d_hT = torch.randn(B, D, device="cuda", generator=g, dtype=torch.float64)
    names = ("a", "c", "u", "v", "b", "h0")
    ref_leaves = {k: x[k].clone().requires_grad_() for k in names}
    ref = op.lowrank_emulated(mode, **ref_leaves)
    ref_grads = torch.autograd.grad(ref, [ref_leaves[k] for k in names], (d_out, d_hT))
    leaves = {k: x[k].to(torch.bfloat16).requires_grad_() for k in names}
    outs = op.lowrank_cell(mode, **leaves, path="persistent")
    grads = torch.autograd.grad(outs, [leaves[k] for k in names],
                                (d_out.to(torch.bfloat16), d_hT.to(torch.bfloat16)))
    assert op.last_path == {"forward": "persistent", "backward": "persistent"}
    for name, a, b in zip(("out", "h_T", *names), (*outs, *grads), (*ref, *ref_grads)):
        assert rel_error(a, b) < 2e-2, (name, rel_error(a, b))


def test_lowrank_persistent_agrees_with_schedule():
    """The kernel against its CPU restatement with the same bf16 roundings (schedule.py):
    the only differences are the fp32 summation orders inside the tensor-core products."""
    from elman.families.twogemm import schedule
    T, B, D, r, mode = 9, 5, 520, 64, 1
    x = _lowrank_inputs(T, B, D, r, seed=11)
    xb = {k: t.to(torch.bfloat16) for k, t in x.items()}
    C, S = schedule.cluster_shape(D, r)
    out, h_all, p_all, aux = schedule.lowrank_forward(
        mode, *(xb[k].float().cpu() for k in ("a", "c", "u", "v", "b", "h0")), C, S, torch.bfloat16)
    got, hT = op.lowrank_cell("gated_tanh", **xb, path="persistent")
    assert rel_error(got, out) < 5e-3 and rel_error(hT, h_all[-1]) < 5e-3


@pytest.mark.parametrize("B,D,r,why", [(2, 100, 16, "multiple of 8"), (2, 512, 330, "r above 320"),
                                       (2, 2048, 320, "cannot hold one cluster"),
                                       (2, 4096, 16, "above 2048")])
def test_lowrank_persistent_refuses_outside_design(B, D, r, why):
    x = {k: t.to(torch.bfloat16) for k, t in _lowrank_inputs(2, B, D, r).items()}
    with pytest.raises(ValueError, match=why):
        op.lowrank_cell("tanh_gate", **x, path="persistent")
    op.lowrank_cell("tanh_gate", **x, path="auto")
    assert op.last_path["forward"] == "graph"


def test_auto_takes_lowrank_persistent_not_tape():
    """auto: the persistent kernels where they run (op.AUTO_PERSISTENT): low-rank and E23
    (D <= 512, N <= 32); E23 at N = 128 or D = 1024 and fp32 take the graph path."""
    assert op.plan("auto", 4, 512, torch.bfloat16, rank=128) == "persistent"
    assert op.plan("auto", 64, 1024, torch.bfloat16, rank=256) == "persistent"
    assert op.plan("auto", 32, 1280, torch.bfloat16, rank=320) == "persistent"  # E66 at 100M
    assert op.plan("auto", 4, 512, torch.float32, rank=128) == "graph"
    assert op.plan("auto", 4, 512, torch.bfloat16, slots=8) == "persistent"
    assert op.plan("auto", 64, 256, torch.bfloat16, slots=32) == "persistent"
    assert op.plan("auto", 4, 512, torch.bfloat16, slots=128) == "graph"
    assert op.plan("auto", 4, 1024, torch.bfloat16, slots=8) == "graph"
    assert op.plan("auto", 4, 512, torch.float32, slots=8) == "graph"


# ---- E23's persistent kernels at the edges of their design -----------------------------------
# (T, B, N, D): a 4-CTA cluster with one live CTA (D = 32, T = 1, B = 1); 4 CTAs with D = 100
# (rows padded in the last CTA; the backward is the graph loop: D not a multiple of 8); 8 CTAs
# (D = 256), 16 (D = 512: the target shape, B = 4); N = 32 (a slot per lane); two clusters,
# the second partly filled (B = 9); B = 64 (eight clusters); D = 200 (rows padded, backward
# persistent); odd T, T = 1, and T long enough for many segments (70 steps, K = 9).
TAPE_EDGES = [(1, 1, 8, 32), (7, 3, 8, 100), (17, 4, 32, 256), (33, 4, 8, 512), (9, 9, 32, 512),
              (5, 64, 8, 512), (65, 4, 8, 200), (1, 2, 32, 512), (70, 2, 8, 64)]


def _tape_inputs(T, B, N, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", generator=g, dtype=torch.float64)
    return dict(x=torch.randn(T, B, D, **kw), z=torch.randn(T, B, D, **kw),
                w_x=torch.randn(D, D, **kw) / D ** 0.5,
                w_h=0.9 * torch.linalg.qr(torch.randn(D, D, **kw))[0],
                w_wr=torch.randn(D, D, **kw) / D ** 0.5, b=0.1 * torch.randn(D, **kw),
                h0=torch.rand(B, D, **kw) - 0.5, tape0=0.5 * torch.randn(B, N, D, **kw))


@pytest.mark.parametrize("T,B,N,D", TAPE_EDGES)
def test_tape_persistent_parity(T, B, N, D):
    """Every output (the tape in the final state included) and every gradient of the
    persistent forward and backward against fp64 autograd through the reference."""
    from elman.variants import e23
    x = {k: t.to(torch.bfloat16).double()  # the reference on the kernel's bf16 inputs
         for k, t in _tape_inputs(T, B, N, D, seed=T + B + N + D).items()}
    g = torch.Generator(device="cuda").manual_seed(5)
    cot = (torch.randn(T, B, D, device="cuda", generator=g, dtype=torch.float64),
           torch.randn(B, D, device="cuda", generator=g, dtype=torch.float64),
           torch.randn(B, N, D, device="cuda", generator=g, dtype=torch.float64))
    names = tuple(x)
    ref_leaves = {k: x[k].clone().requires_grad_() for k in names}
    ref = e23.reference(ref_leaves["x"], ref_leaves["z"], ref_leaves["w_x"], ref_leaves["w_h"],
                        ref_leaves["w_wr"], ref_leaves["b"], ref_leaves["h0"], ref_leaves["tape0"], N)
    ref_grads = torch.autograd.grad(ref, [ref_leaves[k] for k in names], cot)
    leaves = {k: x[k].to(torch.bfloat16).requires_grad_() for k in names}
    outs = op.tape_cell(**leaves, path="persistent")
    grads = torch.autograd.grad(outs, [leaves[k] for k in names],
                                tuple(c.to(torch.bfloat16) for c in cot))
    backward = "persistent" if D % 8 == 0 else "graph"
    assert op.last_path == {"forward": "persistent", "backward": backward}
    for name, a, b in zip(("out", "w_T", "tape_T", *names), (*outs, *grads), (*ref, *ref_grads)):
        assert rel_error(a, b) < 3e-2, (name, rel_error(a, b))


def test_tape_persistent_agrees_with_schedule():
    """The kernels against their CPU restatement with the same bf16 roundings (schedule.py):
    only fp32 summation orders differ."""
    from elman.families.twogemm import schedule
    T, B, N, D = 21, 5, 8, 512
    x = {k: t.to(torch.bfloat16) for k, t in _tape_inputs(T, B, N, D, seed=3).items()}
    K = op.tape_persistent_backward_interval(T, B, D, N, torch.bfloat16)
    assert K == op.checkpoint_interval(T)
    cpu = {k: t.float().cpu() for k, t in x.items()}
    out, w_all, tape_T, ckpt, u_all, alpha_all, beta_all = schedule.tape_forward(
        **cpu, K=K, rounding=torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    cot = (torch.randn(T, B, D, generator=g).bfloat16().float(),
           torch.randn(B, D, generator=g).bfloat16().float(),
           torch.randn(B, N, D, generator=g).bfloat16().float())
    grads = schedule.tape_backward(cpu["x"], cpu["z"], cpu["w_x"], cpu["w_h"], cpu["w_wr"], w_all,
                                   u_all, alpha_all, beta_all, ckpt, *cot, K, torch.bfloat16)
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    got = op.tape_cell(**leaves, path="persistent")
    got_grads = torch.autograd.grad(got, list(leaves.values()),
                                    (cot[0].cuda().bfloat16(), cot[1].cuda().bfloat16(), cot[2].cuda()))
    for name, a, b in zip(("out", "w_T", "tape_T", *leaves), (*got, *got_grads),
                          (out, w_all[-1], tape_T, *grads)):
        assert rel_error(a.float().cpu(), b) < 1e-2, (name, rel_error(a.float().cpu(), b))


@pytest.mark.parametrize("B,N,D,why", [(2, 128, 256, "N above 32"), (2, 8, 1024, "D above 512")])
def test_tape_persistent_refuses_outside_design(B, N, D, why):
    x = {k: t.to(torch.bfloat16) for k, t in _tape_inputs(2, B, N, D).items()}
    with pytest.raises(ValueError, match=why):
        op.tape_cell(**x, path="persistent")
    op.tape_cell(**x, path="auto")
    assert op.last_path["forward"] == "graph"


def test_tape_persistent_interval_fits_n32():
    """At N = 32 a segment of ceil(sqrt(T)) tapes does not fit shared memory: K shrinks, the
    checkpoints follow it, and the backward stays persistent."""
    T, B, N, D = 256, 4, 32, 512
    K = op.tape_persistent_backward_interval(T, B, D, N, torch.bfloat16)
    assert 1 <= K < op.checkpoint_interval(T)
    x = {k: t.to(torch.bfloat16).requires_grad_() for k, t in _tape_inputs(T, B, N, D).items()}
    outs = op.tape_cell(**x, path="auto")
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert op.last_path == {"forward": "persistent", "backward": "persistent"}
    assert all(torch.isfinite(t.grad).all() for t in x.values())


def _lowrank_forward_raw(mode: int, x: dict, traced: bool):
    """The persistent forward through the extension on bf16 inputs x: its outputs (poisoned
    with NaN before the launch) and the trace (or None)."""
    ext = op._ext()
    T, B, D = x["a"].shape
    r = x["u"].shape[1]
    nan = dict(dtype=torch.bfloat16, device="cuda")
    out = torch.full((T, B, D), float("nan"), **nan)
    h_all = torch.full((T + 1, B, D), float("nan"), **nan)
    p_all = torch.full((T, B, r), float("nan"), **nan)
    aux = torch.full((T, B, D), float("nan"), **nan) if mode else None
    trace = (torch.zeros(T * ext.lowrank_trace_phases + 4, dtype=torch.int64, device="cuda")
             if traced else None)
    ext.lowrank_persistent_forward(mode, *(x[k] for k in ("a", "c", "u", "v", "b", "h0")), out,
                                   h_all, p_all, aux, trace)
    torch.cuda.synchronize()
    return [t for t in (out, h_all, p_all, aux) if t is not None], trace


@pytest.mark.parametrize("mode", sorted(stages.MODES))
@pytest.mark.parametrize("T,B,D,r", PERSISTENT_EDGES)
def test_lowrank_persistent_traced_same_bits(mode, T, B, D, r):
    """The traced forward (its own instantiation) writes the same bits as the untraced one,
    and the untraced one the same bits on a second run: out, h_all, p_all and aux
    (NaN-poisoned before, so an unwritten element differs)."""
    x = {k: t.to(torch.bfloat16).contiguous()
         for k, t in _lowrank_inputs(T, B, D, r, seed=T + B + D + r).items()}
    m = stages.MODES[mode]
    ref, _ = _lowrank_forward_raw(m, x, False)
    for traced in (False, True):
        got, _ = _lowrank_forward_raw(m, x, traced)
        for name, a, b in zip(("out", "h_all", "p_all", "aux"), got, ref):
            assert torch.equal(a, b), (traced, name)


def test_lowrank_persistent_trace_is_ordered():
    """The traced forward's clocks: the phases of a step in order, steps in order, and the
    kernel's start and end stamps around them."""
    T, B, D, r = 16, 4, 512, 128
    x = {k: t.to(torch.bfloat16).contiguous() for k, t in _lowrank_inputs(T, B, D, r).items()}
    P = op._ext().lowrank_trace_phases
    _, trace = _lowrank_forward_raw(0, x, True)
    steps = trace[:T * P].view(T, P).cpu()
    assert (steps.diff(dim=1) >= 0).all() and (steps[1:, 0] >= steps[:-1, -1]).all()
    start, start_ns, end, end_ns = trace[T * P:].tolist()
    assert start <= steps[0, 0] and end >= steps[-1, -1] and end_ns > start_ns


def test_lowrank_persistent_trace_checked():
    """A trace buffer of the wrong size raises before the launch."""
    x = {k: t.to(torch.bfloat16).contiguous() for k, t in _lowrank_inputs(5, 3, 256, 64).items()}
    ext = op._ext()
    bad = torch.zeros(3, dtype=torch.int64, device="cuda")
    out = torch.empty(5, 3, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="trace"):
        ext.lowrank_persistent_forward(0, *(x[k] for k in ("a", "c", "u", "v", "b", "h0")), out,
                                       torch.empty(6, 3, 256, dtype=torch.bfloat16, device="cuda"),
                                       torch.empty(5, 3, 64, dtype=torch.bfloat16, device="cuda"),
                                       None, bad)
