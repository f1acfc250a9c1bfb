"""The persistent path at every supported width on the GPU (skipped without CUDA): the
compiled plans agree with `op.persistent_size` for every epilogue of the table (D = 128 ..
2176 in steps of 128 at B from 1 to 130), and at each design's edges (cluster: D = 256 and
1024 at B = 1 and 128; wide: D = 1280 at B = 1, 8, 9 (a second cluster), and where the forward
takes 12 columns a cluster, B = 57, 64, 65, 120, 128, 130 (clusters in waves beyond 84); grid:
D = 384, 1152, 1920, 2048 at B = 1 and 64, the training width 1536 at B = 1, 8, 9, 64) the
persistent path agrees with the graph path forward and backward, bf16, for E1's epilogue
(tanh_silu_gate), E33's self gate (no gate input), E63a (reads h_{t-1}) and, at D = 1280, E63b
(two gates, reads h_{t-1}), and `last_path` says that the persistent path ran; at D = 1280
the wide forward's plan takes 12 columns exactly where that needs fewer waves, and forced to
either width (op.WIDE_COLUMNS_ENV) it agrees with the graph path; sizes outside the set run on
the graph path."""
from __future__ import annotations

import functools

import pytest
import torch

from elman.core.entry import rel_error
from elman.families.dense import delta, inputs, op

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

EDGES = [(5, 1, 256), (4, 128, 256), (5, 1, 1024), (4, 128, 1024),
         (5, 1, 384), (4, 64, 384), (5, 1, 1152), (4, 20, 1152), (4, 64, 1152), (5, 9, 1920),
         (4, 64, 1920),
         (5, 1, 2048), (4, 64, 2048),
         (5, 1, 1280), (4, 8, 1280), (5, 9, 1280), (4, 64, 1280), (3, 130, 1280),
         (3, 57, 1280), (3, 65, 1280), (3, 120, 1280), (3, 128, 1280),
         (5, 1, 1536), (4, 8, 1536), (5, 9, 1536), (4, 64, 1536)]
WIDE = [(5, 1, 1280), (4, 8, 1280), (5, 9, 1280), (4, 64, 1280)]
WIDE12 = [(3, 57, 1280), (3, 65, 1280), (3, 120, 1280), (3, 128, 1280)]  # the forward at 12
TOL = 3e-2


@pytest.mark.parametrize("epilogue", sorted(op.epilogues()) if torch.cuda.is_available() else [])
def test_compiled_plans_agree_with_the_predicate(epilogue):
    ext, eid = op._ext(), op.epilogue_id(epilogue)
    for D in range(128, 2304, 128):
        for B in (1, 8, 17, 64, 65, 128, 130):
            want, why = op.persistent_size(B, D)
            ok, reason = ext.persistent_supported(B, D, True, eid)
            assert bool(ok) == want, (epilogue, B, D, why, reason)
            if want:
                for backward in (False, True):
                    plan = ext.persistent_plan(B, D, backward, eid)
                    assert plan["design"] == op.persistent_design(D), (epilogue, B, D, plan)


@functools.lru_cache(maxsize=4)
def _dense_inputs(T: int, B: int, D: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(T * 1000 + B + D)
    return inputs.random_inputs(T, B, D, ("x", "w_x", "w_h", "b", "h0", "z"), "cuda", g)


def _dense_run(epilogue: str, path: str, T: int, B: int, D: int):
    kw = _dense_inputs(T, B, D)
    g = torch.Generator(device="cuda").manual_seed(1)
    gates = (kw["z"],) if op.epilogues()[epilogue]["gates"] == 1 else ()
    args = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in kw.items()}
    out, h_T = op.cell(epilogue, args["x"], tuple(args["z"] for _ in gates), args["w_x"],
                       args["w_h"], args["b"], args["h0"], path)
    assert op.last_path["forward"] == path
    d_out = torch.randn(out.shape, device="cuda", generator=g)
    (out.float() * d_out).sum().add(h_T.float().sum()).backward()
    assert op.last_path["backward"] == path
    grads = {k: args[k].grad for k in ("x", "w_x", "w_h", "b", "h0")}
    if gates:
        grads["z"] = args["z"].grad
    return {"out": out, "h_T": h_T, **grads}


@pytest.mark.parametrize("epilogue", ["tanh_silu_gate", "tanh_self_gate"])
@pytest.mark.parametrize("T,B,D", EDGES)
def test_persistent_agrees_with_graph_at_the_edges(epilogue, T, B, D):
    fast = _dense_run(epilogue, "persistent", T, B, D)
    ref = _dense_run(epilogue, "graph", T, B, D)
    for name in ref:
        assert rel_error(fast[name], ref[name]) < TOL, (epilogue, T, B, D, name)


def _delta_inputs(T, B, D, seed, variant="a"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    G = delta.CHANNELS[variant]
    pre = torch.randn(T, B, G * D, device="cuda", generator=g, dtype=torch.float64)
    w = torch.randn(D, D, device="cuda", generator=g, dtype=torch.float64)
    w = w * (0.9 / torch.linalg.matrix_norm(w, ord=2))
    h0 = torch.rand(B, D, device="cuda", generator=g, dtype=torch.float64) - 0.5
    return (t.to(torch.bfloat16).requires_grad_() for t in (pre, w, h0))


@pytest.mark.parametrize("variant,T,B,D", [
    *(("a", *s) for s in [(5, 1, 384), (4, 64, 1152), (5, 9, 1920), (4, 64, 2048), (4, 128, 1024),
                          *WIDE, *WIDE12, (5, 1, 1536), (5, 9, 1536), (4, 64, 1536)]),
    *(("b", *s) for s in WIDE + WIDE12)])
def test_e63_persistent_agrees_with_graph_at_the_edges(variant, T, B, D):
    results = {}
    for path in ("persistent", "graph"):
        pre, w_h, h0 = _delta_inputs(T, B, D, seed=D + B, variant=variant)
        out, h_T = delta.cell(variant, pre, w_h, h0, path)
        assert delta.last_path["forward"] == path
        g = torch.Generator(device="cuda").manual_seed(7)
        (out.float() * torch.randn(out.shape, device="cuda", generator=g)).sum().add(
            h_T.float().sum()).backward()
        assert delta.last_path["backward"] == path
        results[path] = (out, h_T, pre.grad, w_h.grad, h0.grad)
    for a, b, n in zip(results["persistent"], results["graph"], ("out", "h_T", "pre", "W_h", "h0")):
        assert rel_error(a, b) < TOL, (variant, T, B, D, n)


@pytest.mark.parametrize("B,D,want", [(4, 1280, "persistent"), (130, 1280, "persistent"),
                                      (65, 1152, "graph"),
                                      (128, 1024, "persistent"), (4, 1300, "graph"),
                                      (4, 2176, "graph")])
def test_auto_path_follows_the_predicate(B, D, want):
    out = _dense_run_auto(B, D)
    assert op.last_path["forward"] == want and out.isfinite().all()


def _waves(B: int, bc: int, active: int) -> int:
    return -(-(-(-B // bc)) // active)


def test_wide_plan_at_1280(monkeypatch):
    """The backward in clusters of 8 columns; the forward of 12 where that takes fewer waves
    than 8 (the GPU's own cluster counts), else 8; ELMAN_WIDE_COLUMNS forces either."""
    ext = op._ext()
    for epilogue in sorted(op.epilogues()):
        eid = op.epilogue_id(epilogue)
        active = {}
        for bc in (8, 12):
            monkeypatch.setenv(op.WIDE_COLUMNS_ENV, str(bc))
            for B in (1, 9, 64, 130):
                plan = ext.persistent_plan(B, 1280, False, eid)
                assert plan["ok"] and (plan["bc"], plan["clusters"]) == (bc, -(-B // bc)), plan
                active[bc] = plan["max_active_clusters"]
                back = ext.persistent_plan(B, 1280, True, eid)
                assert (back["bc"], back["clusters"]) == (8, -(-B // 8)), back
        assert active[8] >= 1 and active[12] >= 1, (epilogue, active)
        monkeypatch.delenv(op.WIDE_COLUMNS_ENV)
        for B in (1, 8, 9, 56, 57, 64, 84, 85, 112, 113, 120, 128, 130):
            bc = 12 if _waves(B, 12, active[12]) < _waves(B, 8, active[8]) else 8
            for backward in (False, True):
                plan = ext.persistent_plan(B, 1280, backward, eid)
                assert plan["ok"] and plan["design"] == "wide", (epilogue, B, plan)
                want = (16, 8 if backward else bc, -(-B // (8 if backward else bc)))
                assert (plan["cluster"], plan["bc"], plan["clusters"]) == want, (epilogue, B, plan)
                assert plan["max_active_clusters"] >= 1, plan


@pytest.mark.parametrize("bc", [8, 12])
@pytest.mark.parametrize("B,T", [(57, 3), (64, 3), (64, 11), (130, 9)])
def test_wide_forced_columns_agree_with_graph(monkeypatch, bc, B, T):
    """Either width against the graph path; T = 9 and 11 refill every slot of the input ring
    (three slots at 12 columns, four at 8) several times."""
    monkeypatch.setenv(op.WIDE_COLUMNS_ENV, str(bc))
    assert op._ext().persistent_plan(B, 1280, False, op.epilogue_id("tanh_silu_gate"))["bc"] == bc
    fast = _dense_run("tanh_silu_gate", "persistent", T, B, 1280)
    ref = _dense_run("tanh_silu_gate", "graph", T, B, 1280)
    for name in ref:
        assert rel_error(fast[name], ref[name]) < TOL, (bc, B, T, name)


def _dense_run_auto(B, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = inputs.random_inputs(3, B, D, ("x", "w_h", "b", "h0", "z"), "cuda", g)
    kw = {k: v.to(torch.bfloat16) for k, v in kw.items()}
    out, _ = op.cell("tanh_silu_gate", kw["x"], (kw["z"],), None, kw["w_h"], kw["b"], kw["h0"])
    return out


# ---- races in the wide design: the jitter build (ELMAN_JITTER) changes no bit -------------
def _raw_run(ext, s):
    """E1's persistent forward and backward through the extension on NaN-filled outputs."""
    T, B, D = s["x"].shape
    nan = float("nan")
    out, h_all = torch.full_like(s["x"], nan), s["x"].new_full((T + 1, B, D), nan)
    dv, dz, dh0 = torch.full_like(out, nan), torch.full_like(out, nan), torch.full_like(s["h0"], nan)
    eid = ext.epilogues()["tanh_silu_gate"]["id"]
    ext.forward(eid, s["x"], [s["z"]], s["w_h"], s["b"], s["h0"], out, h_all, True)
    ext.backward(eid, s["w_h"], h_all, [s["z"]], s["d_out"], s["d_hT"], dv, [dz], dh0, True)
    torch.cuda.synchronize()
    return {"out": out, "h_all": h_all, "dv": dv, "dz": dz, "dh0": dh0}


@pytest.mark.parametrize("T,B,D", [(16, 9, 1280), (8, 64, 1280), (6, 130, 1280)])
def test_wide_jitter_changes_no_bit(T, B, D):  # B = 64, 130: the forward at 12 columns
    from elman.core import extension
    g = torch.Generator(device="cuda").manual_seed(T + B)
    s = inputs.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g)
    s = {k: v.detach().to(torch.bfloat16) for k, v in s.items()}
    s["d_out"] = torch.randn(T, B, D, device="cuda", generator=g).to(torch.bfloat16)
    s["d_hT"] = torch.randn(B, D, device="cuda", generator=g).to(torch.bfloat16)
    plain = _raw_run(extension.load("dense"), s)
    again = _raw_run(extension.load("dense"), s)
    jittered = _raw_run(extension.load("dense", jitter=True), s)
    for name, a in plain.items():
        assert not a.isnan().any(), f"{name}: elements left unwritten at B={B}"
        assert torch.equal(a, again[name]), f"{name}: two runs differ at B={B}"
        assert torch.equal(a, jittered[name]), f"{name} differs under jitter at T={T} B={B}"
