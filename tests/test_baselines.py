"""The baselines on the CPU: registration, parameter counts, the reference layers forward
and backward, their agreement with the libraries' own modules and references, the
replacement of FLA's chunk_bwd_dqkwg against FLA's Triton kernel (Triton's interpreter),
and the clear errors where a library cannot run here."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from elman import registry
from elman.core.entry import Shape
from elman.baselines import gdn, llama, mamba2
from elman.results import baselines as report
from elman.training.lm import LadderLM, n_params

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("mamba2", "fla-gdn", "gru", "lstm", "llama")
F64 = torch.float64


def entry(name):
    return registry.get(name)


# ---- registry ------------------------------------------------------------------------------
def test_every_baseline_is_registered_once_in_order():
    assert tuple(e.name for e in registry.baselines()) == NAMES
    for e in registry.baselines():
        assert e.kind == "baseline" and e.chapter == "book/chapters/baselines.ipynb"
        assert callable(e.parity) and e.test_shapes and e.layer_params is not None
        assert set(e.dtypes) <= set(e.tolerance), f"{e.name}: a dtype without tolerance"
        for tol in e.tolerance.values():
            assert 0 < tol.fwd < 1 and 0 < tol.bwd < 1


def test_names_and_aliases_resolve():
    assert entry("Mamba2") is entry("mamba")
    assert entry("GDN") is entry("fla-gdn") is entry("gated-deltanet")
    assert entry("transformer").name == "llama"
    assert entry("cudnn-gru").name == "gru" and entry("cudnn-lstm").name == "lstm"


def test_rnn_levels_list_both_precisions_for_the_bench():
    for name in ("gru", "lstm"):
        assert entry(name).dtypes == ("float16", "bfloat16")
        assert "float32" in entry(name).tolerance  # parity also in fp32 (`--dtypes float32`)


# ---- parameter counts ------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim,expansion", [(64, 1.0), (128, 2.0), (256, 1.5), (384, 1.0)])
def test_layer_params_formula_equals_the_instantiated_layer(name, dim, expansion):
    e = entry(name)
    with torch.device("meta"):
        layer = e.layer(dim, expansion=expansion, backend="reference")
    assert sum(p.numel() for p in layer.parameters()) == e.layer_params(dim, expansion)


def test_parameter_counts_by_hand():
    d = 256
    # llama, e = 1: 4 heads of 64 (A = 256), F = 256 * ceil(682 / 256) = 768
    assert entry("llama").layer_params(d, 1.0) == 4 * d * 256 + 3 * d * 768 + d
    assert llama.widths(d, 2.0) == (8, 256 * math.ceil(1365 / 256))
    # gru, D = 256: W_in, W_out, 3 gates x (W, U) and two biases per gate
    assert entry("gru").layer_params(d, 1.0) == 2 * d * d + 3 * 2 * d * d + 3 * 2 * d
    assert entry("lstm").layer_params(d, 1.0) == 2 * d * d + 4 * 2 * d * d + 4 * 2 * d
    # mamba2, expand 2: D_i = 512, 8 heads, N = 64
    Di, N, nh = 512, 64, 8
    assert entry("mamba2").layer_params(d, 2.0) == \
        d * (2 * Di + 2 * N + nh) + 5 * (Di + 2 * N) + 3 * nh + Di + Di * d
    # fla-gdn, expand_v 2: 2 heads, key width 256, value width 512
    K, Vd, h = 256, 512, 2
    assert entry("fla-gdn").layer_params(d, 2.0) == \
        2 * d * K + d * Vd + 2 * d * h + 2 * h + 4 * (2 * K + Vd) + d * Vd + Vd // h + Vd * d


def test_ladder_lm_counts_each_baseline_as_the_wrapper_formula():
    d, L = 128, 2
    for name in NAMES:
        e = entry(name)
        with torch.device("meta"):
            m = LadderLM(name, d, L, 2.0, backend="reference", norm="torch")
        assert n_params(m) == 256 * d + L * (e.layer_params(d, 2.0) + d) + d, name


# ---- reference layers on the CPU -------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_reference_layer_forward_backward(name):
    torch.manual_seed(0)
    layer = entry(name).layer(128, expansion=2.0, backend="reference")
    if name in ("gru", "lstm"):
        torch.nn.init.normal_(layer.w_out, std=0.05)  # zero at init: give the input a gradient
    y = torch.randn(2, 21, 128, requires_grad=True)
    out, _ = layer(y)
    assert out.shape == y.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
    out.square().sum().backward()
    assert y.grad is not None and y.grad.abs().sum() > 0
    missing = [n for n, p in layer.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"{name}: no or non-finite gradient for {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_reference_layer_is_causal(name):
    torch.manual_seed(1)
    layer = entry(name).layer(128, expansion=1.0, backend="reference")
    if name in ("gru", "lstm"):
        torch.nn.init.normal_(layer.w_out, std=0.05)
    y = torch.randn(1, 12, 128)
    y2 = y.clone()
    y2[:, 7:] = torch.randn(1, 5, 128)
    with torch.no_grad():
        a, b = layer(y)[0], layer(y2)[0]
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6) and not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("name", NAMES)
def test_ladder_lm_trains_a_step_with_each_baseline(name):
    torch.manual_seed(0)
    m = LadderLM(name, dim=64, depth=2, expansion=2.0, backend="reference", norm="torch")
    x = torch.randint(0, 256, (2, 17))
    loss = m.loss(x)
    assert abs(loss.item() - math.log(256)) < 0.5
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


# ---- clear errors --------------------------------------------------------------------------
@pytest.mark.parametrize("name,library", [("mamba2", "mamba-ssm"), ("fla-gdn", "flash-linear-attention"),
                                          ("gru", "cuDNN"), ("lstm", "cuDNN")])
def test_library_paths_refuse_cpu_tensors(name, library):
    layer = entry(name).layer(128, expansion=2.0, backend="cuda")  # builds on the CPU
    with pytest.raises(RuntimeError, match=f"{library}.*needs CUDA tensors.*backend='reference'"):
        layer(torch.randn(1, 4, 128))


def test_bad_options_raise_before_work():
    with pytest.raises(ValueError, match="multiple of headdim"):
        entry("mamba2").layer(96, expansion=1.0)
    with pytest.raises(ValueError, match="n_heads=3 must be a positive divisor"):
        entry("fla-gdn").layer(128, n_heads=3)
    with pytest.raises(ValueError, match="rnn_dtype"):
        entry("gru").layer(64, rnn_dtype="float8")
    with pytest.raises(ValueError, match="backend"):
        entry("llama").layer(64, backend="triton")
    with pytest.raises(TypeError):
        entry("fla-gdn").layer(128, use_conv=False)  # no option is silently ignored
    for name in ("mamba2", "fla-gdn", "llama"):
        layer = entry(name).layer(128, backend="reference")
        with pytest.raises(ValueError, match="does not carry a state"):
            layer(torch.randn(1, 3, 128), torch.zeros(1))
    with pytest.raises(ValueError, match="chunk_bwd_dqkwg mode"):
        gdn.set_dqkwg("cuda")


# ---- fla-gdn -----------------------------------------------------------------------------
@pytest.mark.parametrize("dim,n_heads,expected", [(64, None, 1), (512, None, 4), (768, None, 6),
                                                  (1920, None, 15), (2048, None, 16), (640, None, 5),
                                                  (1152, None, 9), (1024, 8, 8), (1920, 24, 24)])
def test_gdn_head_count_is_applied(dim, n_heads, expected):
    assert gdn.heads(dim, n_heads) == expected
    with torch.device("meta"):
        layer = entry("fla-gdn").layer(dim, expansion=2.0, n_heads=n_heads)
    b = layer.block
    assert layer.n_heads == b.num_heads == b.num_v_heads == expected
    assert b.head_k_dim == dim // expected and b.head_v_dim == 2 * dim // expected
    assert b.q_proj.out_features == dim and b.a_proj.out_features == expected
    assert b.o_norm.weight.numel() == b.head_v_dim


def test_gdn_heads_fall_to_a_divisor():
    assert gdn.heads(1000) == 5          # 1000 // 128 = 7 -> 5
    assert gdn.heads(100) == 1


def test_gdn_set_layer_idx_reaches_fla():
    layer = entry("fla-gdn").layer(128)
    layer.set_layer_idx(3)
    assert layer.block.layer_idx == 3


def test_gdn_dqkwg_modes_off_hopper():
    gdn.fla()
    assert not gdn.fla_refuses()  # no Hopper GPU here
    with gdn.dqkwg("auto"):
        assert gdn.dqkwg_path() == "triton" and gdn.impl() == "fla-0.6.0:chunk+dqkwg-triton"
    with gdn.dqkwg("torch"):
        assert gdn.dqkwg_path() == "torch"
    co = __import__("fla.ops.common.chunk_o", fromlist=["x"])
    guard = co.TRITON_ABOVE_3_7_1
    with gdn.dqkwg("triton-unguarded"):
        assert co.TRITON_ABOVE_3_7_1 is True
    assert co.TRITON_ABOVE_3_7_1 == guard


def test_gdn_reference_layer_equals_fla_module_with_torch_pieces(monkeypatch):
    """FLA's own GatedDeltaNet.forward, with its three Triton calls (the short conv, the
    chunked rule, the gated norm) replaced by PyTorch equivalents, computes what the
    reference layer computes from the same parameters."""
    import fla.layers.gated_deltanet as gl
    import fla.modules.fused_norm_gate as fng

    def conv(x, weight, bias=None, activation=None, **kw):
        u = F.conv1d(x.transpose(1, 2), weight[:, None], bias, padding=weight.shape[-1] - 1,
                     groups=x.shape[-1])[..., :x.shape[1]]
        return F.silu(u).transpose(1, 2), None

    def chunk(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, **kw):
        assert kw["use_qk_l2norm_in_kernel"] and kw["use_beta_sigmoid_in_kernel"]
        assert kw["use_gate_in_kernel"] and kw["state_v_first"]
        return gdn.reference(q, k, v, g.float(), beta.float(), A_log.float(), dt_bias.float(), initial_state)

    def norm(x, g, weight, bias, activation, eps, **kw):
        assert activation in ("swish", "silu") and bias is None
        x = x.float()
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight * F.silu(g.float())

    monkeypatch.setattr(gl, "causal_conv1d", conv)
    monkeypatch.setattr(gl, "chunk_gated_delta_rule", chunk)
    monkeypatch.setattr(fng, "rms_norm_gated", norm)
    torch.manual_seed(0)
    layer = entry("fla-gdn").layer(256, expansion=2.0, backend="reference")
    with torch.no_grad():
        layer.block.o_norm.weight.uniform_(0.5, 1.5)
    y = torch.randn(2, 13, 256)
    ours, _ = layer(y)
    theirs, _, _ = layer.block(y)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_gdn_reference_is_flas_naive_recurrence_written_out():
    torch.manual_seed(0)
    B, T, H, K, V = 2, 9, 2, 8, 16
    q, k = torch.randn(B, T, H, K, dtype=F64), torch.randn(B, T, H, K, dtype=F64)
    v, a, b = torch.randn(B, T, H, V, dtype=F64), torch.randn(B, T, H, dtype=F64), torch.randn(B, T, H, dtype=F64)
    A_log, dt_bias, h0 = torch.rand(H, dtype=F64), torch.randn(H, dtype=F64), torch.randn(B, H, V, K, dtype=F64)
    o, s = gdn.reference(q, k, v, a, b, A_log, dt_bias, h0)
    S = h0.transpose(-1, -2).clone()                                   # [B, H, K, V]
    qn, kn = F.normalize(q, dim=-1, eps=0) , F.normalize(k, dim=-1, eps=0)
    for t in range(T):
        alpha = torch.exp(-A_log.exp() * F.softplus(a[:, t] + dt_bias))[..., None, None]
        beta = torch.sigmoid(b[:, t])[..., None]
        kt = kn[:, t]
        err = v[:, t] - torch.einsum("bhkv,bhk->bhv", alpha * S, kt)
        S = alpha * S + torch.einsum("bhk,bhv->bhkv", kt, beta * err)
        torch.testing.assert_close(o[:, t].double(), torch.einsum("bhkv,bhk->bhv", S, qn[:, t]) / math.sqrt(K),
                                   rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(s.double(), S.transpose(-1, -2), rtol=2e-4, atol=2e-5)


def test_gdn_dqkwg_is_reached_through_flas_dispatch():
    """FLA's dispatched chunk_bwd_dqkwg (the function its backward calls) runs elman's
    backend in mode "torch"."""
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg as dispatched

    torch.manual_seed(0)
    B, T, H, K, V = 1, 70, 2, 16, 32
    kw = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V),
              do=torch.randn(B, T, H, V), h=torch.randn(B, 2, H, V, K), dh=torch.randn(B, 2, H, V, K),
              w=torch.randn(B, T, H, K), g=torch.cumsum(-torch.rand(B, T, H), 1), dv=torch.randn(B, T, H, V),
              scale=0.25, state_v_first=True, chunk_size=64)
    before = gdn.calls["torch"]
    with gdn.dqkwg("torch"):
        got = dispatched(**kw)
    assert gdn.calls["torch"] == before + 1
    for a, b in zip(got, gdn.chunk_bwd_dqkwg(**kw)):
        assert torch.equal(a, b)


_INTERPRET = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.autotuner as at
    at.Autotuner._bench = lambda self, *a, config=None, **kw: [1.0, 1.0, 1.0]  # no GPU to time on
    import torch
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg as triton_dqkwg
    from elman.baselines.gdn import chunk_bwd_dqkwg
    torch.manual_seed(0)
    worst = 0.0
    for B, T, H, HV, K, V, svf in [(2, 100, 2, 2, 32, 48, True), (1, 64, 1, 1, 16, 32, False),
                                   (1, 10, 1, 2, 16, 16, True), (2, 130, 1, 1, 32, 16, False)]:
        NT = -(-T // 64)
        q, k, w = (torch.randn(B, T, H if n < 2 else HV, K) for n in range(3))
        v, do, dv = (torch.randn(B, T, HV, V) for _ in range(3))
        g = torch.cumsum(-torch.rand(B, T, HV), 1)
        hshape = (B, NT, HV, V, K) if svf else (B, NT, HV, K, V)
        h, dh = torch.randn(hshape), torch.randn(hshape)
        kw = dict(q=q, k=k, v=v, do=do, h=h, dh=dh, w=w, g=g, dv=dv, scale=0.3, state_v_first=svf, chunk_size=64)
        for a, b in zip(chunk_bwd_dqkwg(**kw), triton_dqkwg(**kw)):
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
            assert a.is_contiguous()
            worst = max(worst, ((a - b).norm() / b.norm()).item())
    print("WORST", worst)
""")


def test_gdn_dqkwg_matches_flas_triton_kernel_in_the_interpreter():
    """Triton's interpreter runs FLA's kernel (its semantics, without the Hopper
    miscompilation) on the CPU: the PyTorch replacement returns the same dq, dk, dw, dg,
    for T below, at and above the chunk, both state layouts and grouped value heads."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRET], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    worst = [l for l in proc.stdout.splitlines() if l.startswith("WORST")]
    assert proc.returncode == 0 and worst, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert float(worst[0].split()[1]) < 1e-5


# ---- mamba2 ---------------------------------------------------------------------------------
def test_ssd_reference_equals_mamba_ssm_references():
    from mamba_ssm.modules.ssd_minimal import ssd_minimal_discrete
    from mamba_ssm.ops.triton.ssd_combined import ssd_chunk_scan_combined_ref

    torch.manual_seed(0)
    b, l, h, p, n = 2, 96, 4, 8, 16
    x, dt = torch.randn(b, l, h, p, dtype=F64), torch.randn(b, l, h, dtype=F64)
    A, D, dt_bias = -torch.rand(h, dtype=F64) - 0.5, torch.randn(h, dtype=F64), torch.randn(h, dtype=F64)
    B, C = torch.randn(b, l, 1, n, dtype=F64), torch.randn(b, l, 1, n, dtype=F64)
    y, S = mamba2.ssd_reference(x, dt, A, B, C, D, dt_bias)
    theirs = ssd_chunk_scan_combined_ref(x, dt, A, B, C, 32, D=D, dt_bias=dt_bias, dt_softplus=True)
    torch.testing.assert_close(y, theirs.to(F64), rtol=1e-5, atol=1e-5)
    delta = F.softplus(dt + dt_bias)
    y0, S0 = ssd_minimal_discrete(x * delta[..., None], A * delta, B.expand(b, l, h, n).contiguous(),
                                  C.expand(b, l, h, n).contiguous(), 32)
    torch.testing.assert_close(y - D[:, None] * x, y0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S0, rtol=1e-10, atol=1e-10)


def test_ssd_reference_initial_state_continues_a_split_sequence():
    torch.manual_seed(0)
    b, l, h, p, n = 1, 20, 2, 4, 8
    x, dt = torch.randn(b, l, h, p, dtype=F64), torch.randn(b, l, h, dtype=F64)
    A, B, C = -torch.rand(h, dtype=F64), torch.randn(b, l, 1, n, dtype=F64), torch.randn(b, l, 1, n, dtype=F64)
    y, S = mamba2.ssd_reference(x, dt, A, B, C)
    y1, S1 = mamba2.ssd_reference(x[:, :8], dt[:, :8], A, B[:, :8], C[:, :8])
    y2, S2 = mamba2.ssd_reference(x[:, 8:], dt[:, 8:], A, B[:, 8:], C[:, 8:], initial_states=S1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    torch.testing.assert_close(S2, S)


def test_mamba2_reference_layer_equals_mamba_module_with_torch_pieces(monkeypatch):
    """mamba_ssm.Mamba2.forward (use_mem_eff_path=False), with its Triton scan and gated
    norm replaced by mamba-ssm's own PyTorch references, equals the reference layer."""
    import mamba_ssm.modules.mamba2 as mm
    import mamba_ssm.ops.triton.layernorm_gated as lg
    from mamba_ssm.ops.triton.ssd_combined import ssd_chunk_scan_combined_ref

    def scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False, **kw):
        assert z is None and dt_softplus and chunk_size == 256
        # the library's reference takes whole chunks only: one chunk of the sequence's length
        return ssd_chunk_scan_combined_ref(x, dt, A, B, C, x.shape[1], D=D, dt_bias=dt_bias, dt_softplus=True)

    monkeypatch.setattr(mm, "mamba_chunk_scan_combined", scan)
    monkeypatch.setattr(lg, "rmsnorm_fn", lambda x, weight, bias, z=None, eps=1e-6, group_size=None,
                        norm_before_gate=True: lg.rms_norm_ref(x, weight, bias, z=z, eps=eps, group_size=group_size,
                                                               norm_before_gate=norm_before_gate))
    torch.manual_seed(0)
    layer = entry("mamba2").layer(128, expansion=1.5, backend="reference")
    assert layer.block.d_inner == 192 and layer.block.nheads == 3
    with torch.no_grad():
        layer.block.norm.weight.uniform_(0.5, 1.5)
        layer.block.D.uniform_(-1, 1)
    y = torch.randn(2, 40, 128)
    ours, _ = layer(y)
    theirs = layer.block(y)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_mamba_shim_answers_the_compiled_mamba1_import():
    from elman.core import mamba

    lib = mamba.load()
    assert lib.__version__ == "2.3.2.post1" and lib.Mamba2 is not None
    scan = sys.modules["selective_scan_cuda"]
    if getattr(scan, "__file__", None) is None:  # the stand-in
        with pytest.raises(RuntimeError, match="selective_scan_cuda"):
            scan.fwd()


# ---- gru / lstm ------------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_rnn_reference_equals_torchs_rnn(cell):
    """The written-out cells (cuDNN's equations) against torch.nn.GRU / LSTM run through the
    same explicit-weight call the CUDA path uses (here on PyTorch's CPU kernels)."""
    torch.manual_seed(0)
    parity = entry(cell).parity(Shape(6, 3, 16), F64, "cpu", torch.Generator().manual_seed(0))[0]
    ours = parity.reference(**parity.inputs)
    theirs = parity.fast(**parity.inputs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_rnn_init_and_state(cell):
    torch.manual_seed(0)
    layer = entry(cell).layer(64, expansion=2.0, backend="reference")
    D = 128
    assert layer.w_out.abs().sum() == 0 and layer.w_in.std().item() == pytest.approx(0.02, rel=0.1)
    for w in (layer.rnn.weight_ih_l0, layer.rnn.weight_hh_l0):
        for block in w.view(-1, D, D):
            torch.testing.assert_close(block @ block.t(), torch.eye(D), atol=1e-5, rtol=0)
    assert layer.rnn.bias_ih_l0.abs().sum() == 0 and layer.rnn.bias_hh_l0.abs().sum() == 0
    torch.nn.init.normal_(layer.w_out, std=0.05)
    y = torch.randn(2, 10, 64)
    full, state = layer(y)
    first, s1 = layer(y[:, :4])
    second, s2 = layer(y[:, 4:], s1)
    torch.testing.assert_close(torch.cat([first, second], 1), full)
    if cell == "gru":
        assert state.shape == (2, D)
        torch.testing.assert_close(s2, state)
    else:
        assert len(state) == 2 and state[1].shape == (2, D)
        torch.testing.assert_close(s2[1], state[1])


def test_rnn_dtype_accepts_names_and_dtypes():
    assert entry("gru").layer(64, rnn_dtype="float16").rnn_dtype == torch.float16
    assert entry("lstm").layer(64, rnn_dtype=torch.bfloat16).rnn_dtype == torch.bfloat16
    assert entry("gru").layer(64).rnn_dtype is None


# ---- llama ----------------------------------------------------------------------------------
def test_rope_rotates_pairs_by_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64, dtype=F64), torch.randn(1, 1, 1, 64, dtype=F64)
    T = 40
    rq, rk = llama.rope(q.expand(1, 1, T, 64)), llama.rope(k.expand(1, 1, T, 64))
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1).expand(1, 1, T))
    dots = rq[0, 0] @ rk[0, 0].t()                                     # [T, T]
    for shift in (0, 3, 17):
        diag = torch.diagonal(dots, offset=-shift)                     # i - j = shift
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), rtol=1e-5, atol=1e-5)
    assert torch.equal(rq[..., 0, :], q[..., 0, :])                   # position 0 is not rotated


def test_llama_sdpa_equals_the_written_out_attention():
    torch.manual_seed(0)
    case = entry("llama").parity(Shape(33, 2, 128), F64, "cpu", torch.Generator().manual_seed(0))[0]
    a, = case.fast(**case.inputs)
    b, = case.reference(**case.inputs)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    layer_a = llama.Llama(128, backend="cuda")       # SDPA (also runs on the CPU)
    layer_b = llama.Llama(128, backend="reference")
    layer_b.load_state_dict(layer_a.state_dict())
    y = torch.randn(2, 19, 128)
    torch.testing.assert_close(layer_a(y)[0], layer_b(y)[0], rtol=1e-4, atol=1e-5)


def test_llama_width_follows_expansion():
    assert llama.widths(512, 1.0) == (8, 1536)
    assert llama.widths(512, 2.0) == (16, 2816)
    layer = llama.Llama(512, expansion=2.0, backend="reference")
    assert layer.w_qkv.shape == (3, 1024, 512) and layer.w_2.shape == (512, 2816)
    assert llama.widths(32, 1.0)[0] == 1


def test_llama_returns_branch_outputs_only():
    """out = u + FFN(RMSNorm(a + u)): with the FFN's output weight zeroed the layer returns
    the attention branch alone, not a + u."""
    torch.manual_seed(0)
    layer = llama.Llama(64, backend="reference")
    with torch.no_grad():
        layer.w_2.zero_()
    a = torch.randn(1, 5, 64)
    out, _ = layer(a)
    q, k, v = ((a @ w.t()).view(1, 5, 1, 64).transpose(1, 2) for w in layer.w_qkv)
    u = llama.attention_reference(llama.rope(q), llama.rope(k), v).transpose(1, 2).reshape(1, 5, 64) @ layer.w_o.t()
    torch.testing.assert_close(out, u)


# ---- elman bench over the baselines, on the CPU ----------------------------------------------
def test_bench_times_every_baseline_beside_e1_at_the_same_shapes(monkeypatch, tmp_path):
    """`elman bench --levels E1 mamba2 fla-gdn gru lstm llama --no-cell` with the GPU work
    replaced: every level is timed at the same (B, T, D) as E1, gru and lstm in fp16 and in
    bf16 separately, the others in bf16, each (level, dtype) after its parity gate."""
    from elman.harness import bench
    from elman import cli

    timed, gated = [], []

    def layer_record(entry, B, D, T, reps, dtype, quick):
        timed.append((entry.name, dtype, B, T, D))
        return {"variant": entry.name, "impl": "fake", "params": {"measure": "layer", "B": B, "T": T, "D": D,
                                                                  "dtype": dtype},
                "metrics": {"fwd_ms": {"median": 1.0}, "fwdbwd_ms": {"median": 2.0}, "tokens_per_s": 3.0}}

    def ensure_parity(e, dtype="bfloat16"):
        gated.append((e.name, dtype))
        return {"impl": True}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "warm_up", lambda: None)
    monkeypatch.setattr(bench, "ensure_parity", ensure_parity)
    monkeypatch.setattr(bench, "layer_record", layer_record)
    monkeypatch.setattr(bench.records, "write", lambda recs, folder=None: tmp_path / "records.jsonl")
    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path))
    assert cli.main(["bench", "--levels", "E1", *NAMES, "--no-cell"]) == 0
    shapes = {(B, bench.T_DEFAULT, D) for B in bench.SHAPES_B for D in bench.SHAPES_D}
    by_level: dict = {}
    for name, dtype, *shape in timed:
        by_level.setdefault((name, dtype), set()).add(tuple(shape))
    expected = {("E1", "bfloat16"), ("mamba2", "bfloat16"), ("fla-gdn", "bfloat16"), ("llama", "bfloat16"),
                ("gru", "float16"), ("gru", "bfloat16"), ("lstm", "float16"), ("lstm", "bfloat16")}
    assert set(by_level) == expected and all(s == shapes for s in by_level.values())
    assert len(timed) == len(expected) * len(shapes)       # each once
    assert expected <= set(gated)


def test_library_layers_say_which_path_runs():
    """What `elman bench` records as impl: fla-gdn names who computes chunk_bwd_dqkwg."""
    layer = entry("fla-gdn").layer(128)
    with gdn.dqkwg("torch"):
        assert layer.impl == gdn.impl() == "fla-0.6.0:chunk+dqkwg-torch"
    for name in ("mamba2", "llama", "gru", "lstm"):  # the layer's impl is its parity case's
        e = entry(name)
        assert e.layer(128).impl == e.parity(Shape(4, 1, 64), F64, "cpu", torch.Generator())[0].impl
    assert entry("mamba2").layer(128).impl == mamba2.IMPL and entry("lstm").layer(128).impl == "cudnn:lstm"


# ---- the verification and the chapter's tables, on the CPU ----------------------------------
def test_gdn_verify_rows_pass_fail_and_refusal(monkeypatch):
    """verify() with the chunk path swapped for the reference (no GPU here): rows pass;
    a path that raises FLA's refusal is reported as refused and fails."""
    monkeypatch.setattr(gdn, "chunked", gdn.reference)
    rows = gdn.verify(shapes=((9, 2, 128, 2.0),), dtypes=("float32",), device="cpu")
    assert len(rows) == 1 and rows[0]["passed"] and rows[0]["path"] == "triton"
    assert rows[0]["max_fwd"] < 1e-6 and {"grad:q", "grad:a", "grad:b", "grad:A_log", "grad:h0"} <= set(rows[0]["errors"])
    with gdn.dqkwg("torch"):
        rows = gdn.verify(shapes=((9, 2, 128, 2.0),), dtypes=("float32",), device="cpu", modes=("torch",))
    assert not rows[0]["passed"] and rows[0]["torch_dqkwg_calls"] == 0  # the replacement never ran

    def refuse(*a, **k):
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for ...")

    monkeypatch.setattr(gdn, "chunked", refuse)
    rows = gdn.verify(shapes=((9, 2, 128, 2.0),), dtypes=("float32",), device="cpu")
    assert not rows[0]["passed"] and rows[0]["refused"].startswith("Triton >= 3.4.0")
    assert "refused: Triton" in report.verify_table(rows)


def _bench_record(level, impl, dtype, B, D, tps, run):
    return {"kind": "bench", "variant": level, "impl": impl, "run": run, "env": {"gpu": "NVIDIA H100 80GB HBM3"},
            "params": {"measure": "layer", "B": B, "T": 512, "D": D, "dtype": dtype, "layer_params": 1},
            "metrics": {"fwd_ms": {"median": 1.0}, "fwdbwd_ms": {"median": 3.0}, "tokens_per_s": tps,
                        "peak_mem_mb": 10.0}}


def test_layer_benchmarks_come_from_one_run_with_ratios_to_e1():
    recs = [_bench_record("E1", "cuda:persistent", "bfloat16", 16, 512, 100.0, "run-b"),
            _bench_record("mamba2", "mamba2:bfloat16", "bfloat16", 16, 512, 50.0, "run-b"),
            _bench_record("gru", "gru:float16", "float16", 16, 512, 25.0, "run-b"),
            _bench_record("llama", "llama:bfloat16", "bfloat16", 16, 512, 400.0, "run-a")]
    rows = report.with_ratio_to_e1(report.layer_benchmarks(recs))
    assert {r["run"] for r in rows} == {"run-b"}
    assert [r["level"] for r in rows] == ["E1", "mamba2", "gru"]
    assert [r["vs_E1"] for r in rows] == [1.0, 0.5, 0.25]
    fig = report.plot_layers(rows)
    assert fig.axes and fig.axes[0].get_lines()
    assert "| level |" in report.markdown(rows, ["level", "dtype", "tokens_per_s"])
    html = report.Table(rows, ["level", "vs_E1"])._repr_html_()
    assert html.startswith("<table>") and html.count("<tr>") == 4 and "<td>0.25</td>" in html


def test_parity_summary_rows():
    rec = {"kind": "parity", "variant": "gru", "impl": "cudnn:gru", "run": "r",
           "params": {"dtype": "float16", "T": 7, "B": 3, "D": 100},
           "metrics": {"max_fwd": 1e-3, "max_bwd": 2e-3, "tol_fwd": 5e-3, "tol_bwd": 1e-2, "passed": True}}
    other = {**rec, "variant": "E1"}
    rows = report.parity_summary(report.parity_rows([rec, other]))
    assert [r["level"] for r in rows] == ["gru"] and rows[0]["result"] == "pass"


def test_library_versions():
    v = report.versions()
    assert v["mamba-ssm"] == "2.3.2.post1" and v["flash-linear-attention"] == "0.6.0"


def test_verify_gdn_script_records_the_checked_mode(tmp_path, monkeypatch):
    """scripts/verify_gdn.py with the GPU work replaced by given rows: the first mode's rows
    become parity records of fla-gdn, every row goes to verify_gdn.json, and a failing row
    of the first mode fails the script."""
    import importlib.util
    import json

    from elman.core import records

    spec = importlib.util.spec_from_file_location("verify_gdn", ROOT / "scripts" / "verify_gdn.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    row = {"mode": "auto", "path": "torch", "impl": "fla-0.6.0:chunk+dqkwg-torch", "dtype": "bfloat16",
           "T": 512, "B": 4, "D": 512, "expansion": 2.0, "heads": 4, "seed": 0, "errors": {"fwd:out": 1e-3, "grad:q": 2e-3},
           "max_fwd": 1e-3, "max_bwd": 2e-3, "tol_fwd": 2e-2, "tol_bwd": 5e-2, "torch_dqkwg_calls": 3, "passed": True}
    bad = {**row, "mode": "triton-unguarded", "path": "triton-unguarded", "max_bwd": 0.7, "passed": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "FAKE GPU")
    monkeypatch.setattr(records, "env", lambda: {"gpu": "FAKE GPU", "commit": "x", "dirty": False})
    monkeypatch.setattr(gdn, "fla_refuses", lambda: True)
    monkeypatch.setattr(gdn, "verify", lambda **kw: [row, bad])
    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path))
    assert script.main([]) == 0
    recs = records.read([tmp_path])
    assert [(r["kind"], r["variant"], r["impl"], r["params"]["check"]) for r in recs] == \
        [("parity", "fla-gdn", row["impl"], "verify_gdn")]
    saved = json.loads((tmp_path / report.VERIFY_FILE).read_text())
    assert [r["mode"] for r in saved["rows"]] == ["auto", "triton-unguarded"]
    assert report.verify_rows([tmp_path])[0]["gpu"] == "FAKE GPU"
    monkeypatch.setattr(gdn, "verify", lambda **kw: [{**row, "passed": False}])
    assert script.main(["--no-record"]) == 1


# ---- the chapter from a run's records --------------------------------------------------------
GPU = "NVIDIA H100 80GB HBM3"
TOKENS = {"E1": 100.0, "mamba2": 50.0, "fla-gdn": 40.0, "gru": 10.0, "lstm": 8.0, "llama": 200.0}


def _verify_row(mode, dtype, D, e=2.0):
    path = "torch" if mode == "auto" else mode
    passed = mode == "auto"
    return {"mode": mode, "path": path, "impl": f"fla-0.6.0:chunk+dqkwg-{path}", "dtype": dtype, "T": 512,
            "B": 4, "D": D, "expansion": e, "heads": D // 128, "seed": 0,
            "errors": {"fwd:out": 1e-3, "grad:q": 2e-3, "grad:b": 1e-3 if passed else 0.6},
            "max_fwd": 1e-3, "max_bwd": 2e-3 if passed else 0.6, "tol_fwd": 2e-2, "tol_bwd": 5e-2,
            "torch_dqkwg_calls": 3 if passed else 0, "passed": passed}


def _fake_run(folder: Path) -> None:
    """A run folder as `scripts/gpu_pass.sh ... baselines` leaves it: verify_gdn.json, parity
    records of the baselines, layer records of E1 and every baseline (gru and lstm in fp16
    and in bf16) at the same shapes."""
    import json

    from elman.core import records

    env = {"gpu": GPU, "commit": "abc", "dirty": False}
    rows = [_verify_row(m, dt, D) for m in ("auto", "triton-unguarded") for dt in ("float32", "bfloat16")
            for D in (512, 1024)]
    folder.mkdir(parents=True)
    (folder / report.VERIFY_FILE).write_text(json.dumps({"env": env, "rows": rows}))
    recs = [{"kind": "parity", "variant": "fla-gdn", "impl": r["impl"], "env": env,
             "params": {"T": 512, "B": 4, "D": r["D"], "dtype": r["dtype"], "seed": 0, "check": "verify_gdn"},
             "metrics": {k: r[k] for k in ("errors", "max_fwd", "max_bwd", "tol_fwd", "tol_bwd", "passed")}}
            for r in rows if r["mode"] == "auto"]
    for e in registry.baselines():
        impl = gdn.impl() if e.name == "fla-gdn" else f"{e.name}:lib"
        recs += [{"kind": "parity", "variant": e.name, "impl": impl, "env": env,
                  "params": {"T": T, "B": B, "D": D, "dtype": dt, "seed": 0},
                  "metrics": {"errors": {}, "max_fwd": 1e-3, "max_bwd": 1e-3, "tol_fwd": 1e-2, "tol_bwd": 1e-2,
                              "passed": True}} for dt in e.dtypes for T, B, D in ((s.T, s.B, s.D) for s in e.test_shapes)]
    for level, tps in TOKENS.items():
        for dt in (("float16", "bfloat16") if level in ("gru", "lstm") else ("bfloat16",)):
            impl = "cuda:persistent" if level == "E1" else \
                "fla-0.6.0:chunk+dqkwg-torch" if level == "fla-gdn" else f"{level}:{dt}"
            recs += [{**_bench_record(level, impl, dt, B, D, tps * (2 if dt == "float16" else 1), None),
                      "env": env} for B in (4, 16) for D in (512, 1024)]
    records.write([{k: v for k, v in r.items() if k != "run"} for r in recs], folder)


def test_beside_e1_and_what_ran_for_fla_gdn_from_records(tmp_path):
    from elman.core import records

    _fake_run(tmp_path / "run")
    recs = records.read([tmp_path / "run"])
    bench = report.with_ratio_to_e1(report.layer_benchmarks(recs))
    table = report.beside_e1(bench)
    assert [(r["B"], r["D"]) for r in table] == [(4, 512), (16, 512), (4, 1024), (16, 1024)]
    assert table[0] == {"B": 4, "T": 512, "D": 512, "E1 tokens/s": 100.0, "mamba2 / E1": 0.5, "fla-gdn / E1": 0.4,
                        "gru fp16 / E1": 0.2, "gru bf16 / E1": 0.1, "lstm fp16 / E1": 0.16, "lstm bf16 / E1": 0.08,
                        "llama / E1": 2.0}
    ran = {(r["check"], r["mode"]): r for r in report.fla_gdn_runs(recs, report.verify_rows([tmp_path / "run"]))}
    assert set(ran) == {("scripts/verify_gdn.py", "auto"), ("scripts/verify_gdn.py", "triton-unguarded"),
                        ("elman parity", ""), ("elman bench", "")}
    auto, unguarded = ran["scripts/verify_gdn.py", "auto"], ran["scripts/verify_gdn.py", "triton-unguarded"]
    assert (auto["cases"], auto["passed"], auto["PyTorch dqkwg calls"]) == (4, 4, 12)
    assert auto["chunk_bwd_dqkwg"].startswith("PyTorch") and unguarded["passed"] == 0
    assert ran["elman bench", ""]["cases"] == 4 and ran["elman bench", ""]["passed"] is None
    assert ran["elman parity", ""]["cases"] == 6 and ran["elman parity", ""]["passed"] == 6
    # E1 alone (a run without baselines) is no comparison
    assert report.layer_benchmarks([r for r in recs if r["variant"] == "E1"]) == []


def test_chapter_shows_a_runs_baselines_beside_e1(tmp_path, monkeypatch):
    """The Baselines chapter as it reads a pinned run (a pins file naming the run; here on the CPU,
    quick, with the GPU run's records written by hand): the table of every baseline beside
    E1, the verify_gdn table and what ran for fla-gdn, all from that run."""
    import nbformat
    import papermill

    _fake_run(tmp_path / "run")
    pins = tmp_path / "runs.yml"
    pins.write_text(f"chapters:\n  baselines: [{tmp_path / 'run'}]\n")
    chapter = ROOT / "book" / "chapters" / "baselines.ipynb"
    out = tmp_path / "out.ipynb"
    monkeypatch.setenv("ELMAN_PINS", str(pins))  # the kernel papermill starts inherits it
    papermill.execute_notebook(str(chapter), str(out), kernel_name="python3", cwd=str(chapter.parent),
                               parameters={"quick": True, "device": "cpu"},
                               progress_bar=False, execution_timeout=600)
    outputs = [o for c in nbformat.read(out, as_version=4).cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs)
    text = "\n".join(o.get("text", "") for o in outputs)
    for column in ("E1 tokens/s", "mamba2 / E1", "fla-gdn / E1", "gru fp16 / E1", "gru bf16 / E1",
                   "lstm fp16 / E1", "lstm bf16 / E1", "llama / E1"):
        assert f"<th>{column}</th>" in html, column
    assert f"run run on {GPU}" in text and "no GPU run" not in text
    assert "<td>triton-unguarded</td>" in html and "<td>FAIL</td>" in html    # the verify table
    assert "PyTorch (elman.baselines.gdn.chunk_bwd_dqkwg)" in html             # what ran for fla-gdn
    assert "<td>fla-0.6.0:chunk+dqkwg-torch</td>" in html
