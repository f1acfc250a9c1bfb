"""Races in the persistent kernels, looked for by perturbing their timing.

The jitter build (`ops.load("dense", jitter=True)`, the module elman_dense_jitter: ELMAN_JITTER,
`jitter` in lib/csrc/common/cluster.cuh)
makes warps of both persistent designs sleep pseudo-random times at every synchronisation
point of a step: in the cluster design (D <= 1024) before and after the expect, around the
staging, after each slice's arrival, around the partial-sum barrier and the publish; in the
grid design (D = 2048) also between a counter and the copy it allows, and around the exchange
of partial sums through L2. The kernels' arithmetic order does not depend on timing, so a
race-free protocol gives every output bitwise as the normal build does. It complements
compute-sanitizer's racecheck (gpu_pass.sh's sanitize stage, from the plain CUDA program
scripts/sanitize_persistent.cu, since racecheck fails with an internal error under Python),
and runs through the op. What it can and cannot see (measured by planting races): a race
between warps, the block barrier before the multicast removed, failed it; an early read of
staged inputs (their copies started two steps before) passed, because jitter only slows
warps down and those copies always land in time. Run by scripts/gpu_pass.sh; skipped
without CUDA."""
import pytest
import torch

from elman.core import extension as ops
from elman.families.dense import inputs, op as dense

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# Every D the kernels take; one and several clusters; odd B (dead batch columns); 16 batch
# columns per cluster (B = 64, D = 1024); the grid design (D = 2048) with its mma.sync multiply
# (8 batch columns) and its wgmma multiply (32 columns, 12 of them dead; 64 columns); the wide
# cluster design (D = 1280) in one cluster and in waves of clusters; the grid design at widths
# below 2048 (CTAs with no live column block at D = 384, a partial column quarter at 1152).
EPILOGUE = "tanh_silu_gate"
SHAPES = [(24, 3, 256), (24, 20, 512), (16, 4, 768), (24, 16, 1024), (12, 64, 1024),
          (10, 5, 2048), (10, 20, 2048), (8, 64, 2048), (16, 9, 1280), (8, 64, 1280),
          (10, 5, 1152), (8, 64, 384)]


def _inputs(T, B, D):
    g = torch.Generator(device="cuda").manual_seed(T * 1000 + B * 10 + D)
    s = inputs.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g)
    s = {k: v.detach().to(torch.bfloat16) for k, v in s.items()}
    s["d_out"] = torch.randn(T, B, D, device="cuda", generator=g).to(torch.bfloat16)
    s["d_hT"] = torch.randn(B, D, device="cuda", generator=g).to(torch.bfloat16)
    return s


def _run(ext, s):
    T, B, D = s["x"].shape
    out, h_all = torch.full_like(s["x"], float("nan")), s["x"].new_full((T + 1, B, D), float("nan"))
    dv, dz, dh0 = torch.full_like(out, float("nan")), torch.full_like(out, float("nan")), s["h0"].clone()
    eid = ext.epilogues()[EPILOGUE]["id"]
    ext.forward(eid, s["x"], [s["z"]], s["w_h"], s["b"], s["h0"], out, h_all, True)
    ext.backward(eid, s["w_h"], h_all, [s["z"]], s["d_out"], s["d_hT"], dv, [dz], dh0, True)
    torch.cuda.synchronize()
    return {"out": out, "h_all": h_all, "dv": dv, "dz": dz, "dh0": dh0}


@pytest.mark.parametrize("T,B,D", SHAPES)
def test_jitter_changes_no_bit(T, B, D):
    assert dense.plan(B, D, torch.bfloat16) == "persistent"
    s = _inputs(T, B, D)
    plain, jittered = _run(ops.load("dense"), s), _run(ops.load("dense", jitter=True), s)
    for name, a in plain.items():
        assert not a.isnan().any(), f"{name}: the normal build left elements unwritten"
        b = jittered[name]
        assert torch.equal(a, b), (f"{name} differs under jitter at T={T} B={B} D={D}: "
                                   f"{(a != b).sum().item()} elements, max |diff| "
                                   f"{(a.float() - b.float()).abs().max().item():.3g}")


def test_jitter_build_perturbs():
    """The check above means something only if the jitter build really delays the steps."""
    s = _inputs(64, 4, 512)

    def elapsed_ms(ext):
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _run(ext, s)
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end))
        return best

    plain, jittered = ops.load("dense"), ops.load("dense", jitter=True)
    elapsed_ms(plain), elapsed_ms(jittered)  # warm-up
    assert jittered.__name__ == "elman_dense_jitter"
    assert elapsed_ms(jittered) > 1.5 * elapsed_ms(plain)
