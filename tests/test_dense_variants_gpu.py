"""The dense family's variants on the GPU (skipped without CUDA; the registry-wide parity of
every path and dtype is tests/test_parity_gpu.py): the new epilogues in the compiled table,
each variant's layer on the CUDA backend against its reference backend (every parameter's
gradient, the tied W's summed one included), E39's call without W_x and bias on every path,
and the fp32 state accuracy of the linear variants (E36, E42) over T = 512 and T = 4096
against fp64."""
from __future__ import annotations

import importlib

import pytest
import torch

from elman import registry
from elman.core.entry import Shape, rel_error
from elman.families.dense import inputs, op as dense

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NAMES = ["E33", "E36", "E37", "E38", "E39", "E42", "E56"]


def test_self_gate_epilogues_in_the_table():
    table = dense.epilogues()
    assert table["tanh_self_gate"]["gates"] == 0
    assert table["linear_self_gate"]["gates"] == 0
    assert len({v["id"] for v in table.values()}) == len(table)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("path", ["persistent", "graph", "steps"])
def test_layer_cuda_matches_reference_backend(name, path):
    torch.manual_seed(0)
    cls = registry.get(name).layer
    ref = cls(256, backend="reference").cuda()
    fast = cls(256, backend="cuda", path=path).cuda()
    fast.load_state_dict(ref.state_dict())
    ref.eval(), fast.eval()  # the power iteration's vector stays fixed: one W for both
    y = torch.randn(4, 9, 256, device="cuda")
    h0 = 0.3 * torch.randn(4, 256, device="cuda")
    g = torch.randn(4, 9, 256, device="cuda")
    out_r, h_r = ref(y, h0)
    (out_r * g).sum().add(h_r.sum()).backward()
    dtype = torch.float32 if path != "persistent" else torch.bfloat16
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out_f, h_f = fast(y, h0)
    (out_f.float() * g).sum().add(h_f.float().sum()).backward()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert rel_error(out_f, out_r) < tol and rel_error(h_f, h_r) < tol
    grads_r = dict(ref.named_parameters())
    for n, p in fast.named_parameters():
        assert rel_error(p.grad, grads_r[n].grad) < tol, f"{name} {path}: grad of {n}"


@pytest.mark.parametrize("path", ["persistent", "graph", "steps"])
def test_e39_runs_without_input_weight_and_bias(path):
    g = torch.Generator(device="cuda").manual_seed(3)
    kw = inputs.random_inputs(6, 4, 512, ("x", "w_h", "h0"), "cuda", g)
    ref_out, ref_h = registry.get("E39").reference(**kw)
    dtype = torch.bfloat16 if path == "persistent" else torch.float32
    args = {k: v.detach().to(dtype).requires_grad_() for k, v in kw.items()}
    out, h = dense.cell("tanh_self_gate", args["x"], (), None, args["w_h"], None, args["h0"], path)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert rel_error(out, ref_out) < tol and rel_error(h, ref_h) < tol
    d_out = torch.randn_like(ref_out)
    ref_grads = torch.autograd.grad((ref_out * d_out).sum(), list(kw.values()))
    grads = torch.autograd.grad((out * d_out.to(dtype)).sum(), list(args.values()))
    for n, a, b in zip(kw, grads, ref_grads):
        assert rel_error(a, b) < 2 * tol, n


@pytest.mark.parametrize("name", ["E36", "E42"])
def test_linear_state_accuracy_fp32_over_long_sequences(name):
    """fp32 state of a linear recurrence against fp64 at T = 512 and T = 4096 (graph path).
    The recurrence is a contraction (spectral norm 0.99), so rounding errors of old steps decay:
    the error must not grow with T beyond a small factor and stays near fp32's level."""
    entry = registry.get(name)
    errors = {}
    for T in (512, 4096):
        g = torch.Generator(device="cuda").manual_seed(7)
        kw = inputs.reference_inputs(entry.reference, Shape(T, 8, 256), "cuda", g)
        kw = {k: v.detach() for k, v in kw.items()}
        _, h_ref = entry.reference(**kw)
        cell = importlib.import_module(entry.layer.__module__).cell
        _, h = cell(**{k: v.float() for k, v in kw.items()}, backend="cuda", path="graph")
        errors[T] = rel_error(h, h_ref)
    print(f"{name}: fp32 final-state relative error {errors}")
    assert errors[512] < 1e-4 and errors[4096] < 1e-4
    assert errors[4096] < max(4 * errors[512], 1e-6), f"error grows with T: {errors}"


@pytest.mark.parametrize("name", ["E37", "E39", "E42", "E56"])
def test_bench_times_tied_inputless_and_concatenated_variants(name):
    """The dense cell bench is keyed by the entry's epilogue and its reference's operands: it
    times E37/E42 (tied), E39 (no W_x, no bias) and E56 (two halves of one W) in quick mode."""
    from elman.families.dense import bench
    entry = registry.get(name)
    assert bench.has_cell(entry)
    cells = bench.cell_records(entry, 4, 512, T=16, reps=2, quick=True,
                               impls=("cuda:persistent", "cuda:steps+graph", "torch:eager"))
    assert {r["impl"] for r in cells} == {"cuda:persistent", "cuda:steps+graph", "torch:eager"}
    layer = bench.recurrent_layer_records(entry, 4, 512, T=16, reps=2, quick=True)
    assert layer and all(r["metrics"]["fwdbwd_ms"]["median"] > 0 for r in layer)
