"""The persistent path at every supported width on the GPU (skipped without CUDA): the
compiled plans agree with `op.persistent_size` for every epilogue of the table (D = 128 ..
2176 in steps of 128 at B from 1 to 130), and at each design's edges (cluster: D = 256 and
1024 at B = 1 and 128; grid: D = 384, 1152, 1920, 2048 at B = 1 and 64, the training widths
1280 and 1536) the persistent path agrees with the graph path forward and backward, bf16, for
E1's epilogue (tanh_silu_gate), E33's self gate (no gate input) and E63a (reads h_{t-1}), and
`last_path` says that the persistent path ran; sizes outside the set run on the graph path."""
from __future__ import annotations

import functools

import pytest
import torch

from elman.core.entry import rel_error
from elman.families.dense import delta, inputs, op

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

EDGES = [(5, 1, 256), (4, 128, 256), (5, 1, 1024), (4, 128, 1024),
         (5, 1, 384), (4, 64, 384), (5, 1, 1152), (4, 64, 1152), (5, 9, 1920), (4, 64, 1920),
         (5, 1, 2048), (4, 64, 2048), (4, 16, 1280), (4, 64, 1536)]
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
    args = {k: v.to(torch.bfloat16).requires_grad_() for k, v in kw.items()}
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


def _delta_inputs(T, B, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    G = delta.CHANNELS["a"]
    pre = torch.randn(T, B, G * D, device="cuda", generator=g, dtype=torch.float64)
    w = torch.randn(D, D, device="cuda", generator=g, dtype=torch.float64)
    w = w * (0.9 / torch.linalg.matrix_norm(w, ord=2))
    h0 = torch.rand(B, D, device="cuda", generator=g, dtype=torch.float64) - 0.5
    return (t.to(torch.bfloat16).requires_grad_() for t in (pre, w, h0))


@pytest.mark.parametrize("T,B,D", [(5, 1, 384), (4, 64, 1152), (5, 9, 1920), (4, 64, 2048),
                                   (4, 128, 1024), (4, 16, 1280)])
def test_e63a_persistent_agrees_with_graph_at_the_edges(T, B, D):
    results = {}
    for path in ("persistent", "graph"):
        pre, w_h, h0 = _delta_inputs(T, B, D, seed=D + B)
        out, h_T = delta.cell("a", pre, w_h, h0, path)
        assert delta.last_path["forward"] == path
        g = torch.Generator(device="cuda").manual_seed(7)
        (out.float() * torch.randn(out.shape, device="cuda", generator=g)).sum().add(
            h_T.float().sum()).backward()
        assert delta.last_path["backward"] == path
        results[path] = (out, h_T, pre.grad, w_h.grad, h0.grad)
    for a, b, n in zip(results["persistent"], results["graph"], ("out", "h_T", "pre", "W_h", "h0")):
        assert rel_error(a, b) < TOL, (T, B, D, n)


@pytest.mark.parametrize("B,D,want", [(4, 1280, "persistent"), (65, 1280, "graph"),
                                      (128, 1024, "persistent"), (4, 1300, "graph"),
                                      (4, 2176, "graph")])
def test_auto_path_follows_the_predicate(B, D, want):
    out = _dense_run_auto(B, D)
    assert op.last_path["forward"] == want and out.isfinite().all()


def _dense_run_auto(B, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = inputs.random_inputs(3, B, D, ("x", "w_h", "b", "h0", "z"), "cuda", g)
    kw = {k: v.to(torch.bfloat16) for k, v in kw.items()}
    out, _ = op.cell("tanh_silu_gate", kw["x"], (kw["z"],), None, kw["w_h"], kw["b"], kw["h0"])
    return out
