"""fla-gdn: Gated DeltaNet from flash-linear-attention 0.6.0. Chapter: book/chapters/baselines.ipynb.

Per head (nh heads, key width K = dim / nh, value width V = expansion * K):

    q_t, k_t, v_t = silu(conv4(W_q y_t)), silu(conv4(W_k y_t)), silu(conv4(W_v y_t))
    q_t, k_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t / sqrt(|k_t|^2 + 1e-6)
    g_t = -exp(A_log) softplus(W_a y_t + dt_bias),   beta_t = sigmoid(W_b y_t)
    S_t = e^{g_t} S_{t-1} + beta_t k_t (v_t - e^{g_t} S_{t-1}^T k_t)^T          S in R^{K x V}
    o_t = S_t^T q_t / sqrt(K)
    out_t = W_o [ RMSNorm(o_t) * w * silu(W_g y_t) ]                     (per head, eps 1e-5)

The reference is FLA's own `naive_recurrent_gated_delta_rule` (a loop over t, fp32)
inside the same layer math; the fast path is FLA's chunked Triton kernels, with one
change on the machines where FLA refuses to run:

The Hopper / Triton problem. FLA 0.6.0's `fla.ops.common.chunk_o.chunk_bwd_dqkwg` raises
"Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated
chunk_bwd_dqkwg (see #640)" (fla-org/flash-linear-attention issue 640: the kernel's
`tl.dot(tl.trans(b_ds), b_q)` on a value in wgmma register layout is miscompiled; wrong
dbeta and dg). The fixes FLA offers are Triton >= 3.7.1 (the GPU host has 3.6, the version
its torch is pinned to) or its TileLang backend (tilelang, a 50 MB wheel, with
apache-tvm-ffi and z3-solver, carried to a host that cannot download, and kernels built
with nvcc at run time). Here that one step, given the chunk states `h`, `dh`, computes,
per chunk of BT = 64 steps (G = the chunk-local cumulative gate in log2 units),

    dq = (do h^T) 2^G * scale + tril(do v^T * 2^(G_i - G_j)) * scale  k
    dk = (v dh^T) 2^(G_last - G) + (tril(...) * scale)^T q,     dw = -(dv h^T)
    dg = rowsum(dq * q) - rowsum(dk * k), plus 2^G_last <h, dh> + <dk_inter, k> on the
         chunk's last row

in plain PyTorch (fp32 batched matmuls). It is registered through FLA's own backend
dispatch for `chunk_bwd_dqkwg` and used where FLA's guard would refuse (mode "auto"),
always ("torch"), never ("triton"), or never with FLA's guard lifted
("triton-unguarded", a diagnostic that shows the miscompiled kernel's errors).
`ELMAN_GDN_DQKWG` sets the mode; `dqkwg(mode)` sets it for a block. The rest of the
forward and backward is FLA's Triton code. scripts/verify_gdn.py checks the whole path,
forward and every gradient, against FLA's naive reference on the GPU.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from ..core.entry import DTYPES, Entry, ParityCase, Shape, run_case, shapes
from ..core.mamba import import_quietly
from .common import (TRITON_TOLERANCE, autocast_dtype, check_backend, check_sequence, check_tensors,
                     inner_width, no_state, require_cuda)

FLA_VERSION = "0.6.0"
DQKWG_MODES = ("auto", "torch", "triton", "triton-unguarded")
_state = {"mode": os.environ.get("ELMAN_GDN_DQKWG", "auto"), "fla": None, "guard": None}
calls = {"torch": 0}  # how often the PyTorch chunk_bwd_dqkwg ran (the verification checks it)


def heads(dim: int, n_heads: int | None = None) -> int:
    """nh = n_heads if given, else max(1, dim // 128) lowered to a divisor of dim."""
    if n_heads is not None:
        if n_heads < 1 or dim % n_heads:
            raise ValueError(f"fla-gdn: n_heads={n_heads} must be a positive divisor of dim={dim}")
        return n_heads
    nh = max(1, dim // 128)
    while dim % nh:
        nh -= 1
    return nh


# ---- flash-linear-attention and the chunk_bwd_dqkwg step -------------------------------
def fla():
    """Import flash-linear-attention (once) and register the PyTorch chunk_bwd_dqkwg."""
    if _state["fla"] is None:
        try:
            lib = import_quietly("fla")
            import_quietly("fla.layers")
            importlib.import_module("fla.ops.gated_delta_rule")
        except ImportError as exc:
            raise ImportError("flash-linear-attention is not installed: see "
                              "scripts/baseline-requirements.txt or scripts/build_baseline_wheels.sh") from exc
        if lib.__version__ != FLA_VERSION:
            raise ImportError(f"fla-gdn was verified with flash-linear-attention {FLA_VERSION}; "
                              f"found {lib.__version__}: install {FLA_VERSION} or re-verify")
        _register_backend()
        _state["fla"] = lib
        _state["guard"] = importlib.import_module("fla.ops.common.chunk_o").TRITON_ABOVE_3_7_1
        set_dqkwg(_state["mode"])
    return _state["fla"]


def fla_refuses() -> bool:
    """True where FLA 0.6.0 refuses its gated Triton chunk_bwd_dqkwg (Hopper, Triton in
    [3.4.0, 3.7.1)): the same condition its guard tests."""
    fla()
    co = importlib.import_module("fla.ops.common.chunk_o")
    return bool(co.IS_NVIDIA_HOPPER and co.TRITON_ABOVE_3_4_0 and not _state["guard"])


def set_dqkwg(mode: str) -> None:
    """Choose who computes chunk_bwd_dqkwg: "auto" | "torch" | "triton" | "triton-unguarded"."""
    if mode not in DQKWG_MODES:
        raise ValueError(f"chunk_bwd_dqkwg mode must be one of {DQKWG_MODES}, got {mode!r}")
    _state["mode"] = mode
    fla()  # loads FLA and registers the backend (once)
    co = importlib.import_module("fla.ops.common.chunk_o")
    co.TRITON_ABOVE_3_7_1 = _state["guard"] or mode == "triton-unguarded"


@contextlib.contextmanager
def dqkwg(mode: str):
    """`with dqkwg("torch"): ...` runs the block (forward and backward) in that mode."""
    prev = _state["mode"]
    set_dqkwg(mode)
    try:
        yield
    finally:
        set_dqkwg(prev)


def dqkwg_path() -> str:
    """What computes chunk_bwd_dqkwg now: "torch", "triton" or "triton-unguarded"."""
    mode = _state["mode"]
    if mode == "auto":
        return "torch" if fla_refuses() else "triton"
    return mode


def impl() -> str:
    """The path that runs, for records: e.g. "fla-0.6.0:chunk+dqkwg-torch"."""
    return f"fla-{FLA_VERSION}:chunk+dqkwg-{dqkwg_path()}"


def _check_dispatch() -> None:
    if dqkwg_path() == "torch" and importlib.import_module("fla.backends")._DISPATCH_DISABLED:
        raise RuntimeError("FLA_DISABLE_BACKEND_DISPATCH=1 bypasses the backend that replaces "
                           "chunk_bwd_dqkwg; unset it (or choose ELMAN_GDN_DQKWG=triton off Hopper)")


def _register_backend() -> None:
    from fla.backends import BaseBackend, register as fla_register

    @fla_register("common")
    class ElmanTorchDqkwg(BaseBackend):
        """elman: chunk_bwd_dqkwg in PyTorch where FLA's Triton kernel is wrong or refused."""

        backend_type = "elman_torch_dqkwg"
        priority = 1

        def chunk_bwd_dqkwg_verifier(self, *args, **kwargs):
            path = dqkwg_path()
            return path == "torch", f"elman chunk_bwd_dqkwg mode selects {path}"

        def chunk_bwd_dqkwg(self, *args, **kwargs):
            calls["torch"] += 1
            return chunk_bwd_dqkwg(*args, **kwargs)


def chunk_bwd_dqkwg(q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None,
                    state_v_first=False, cu_seqlens=None, chunk_size=64, chunk_indices=None):
    """FLA's gated `chunk_bwd_dqkwg` contract in PyTorch: (dq, dk, dw, dg).

    q, k [B, T, H, K]; v (the WY-corrected values), do, dv [B, T, HV, V]; h, dh the chunk
    states [B, NT, HV, K, V] ([.., V, K] if state_v_first); g the chunk-local cumulative
    gate in log2 units [B, T, HV]; w [B, T, HV, K]."""
    if g is None or g_gamma is not None or cu_seqlens is not None:
        raise NotImplementedError("elman's chunk_bwd_dqkwg covers the gated fixed-length case "
                                  "GatedDeltaNet uses (g given, no g_gamma, no cu_seqlens)")
    B, T, H, K = k.shape
    HV = v.shape[2]
    BT = chunk_size
    NT = -(-T // BT)
    pad = NT * BT - T
    scale = K ** -0.5 if scale is None else scale
    f32 = torch.float32

    def chunks(x):  # [B, T, n, c] -> [B, NT, BT, n, c], fp32, zero rows past T
        return F.pad(x.to(f32), (0, 0, 0, 0, 0, pad)).view(B, NT, BT, x.shape[2], x.shape[3])

    qc, kc = (chunks(x).repeat_interleave(HV // H, dim=3) for x in (q, k))
    vc, doc = chunks(v), chunks(do)
    hc, dhc = (x.to(f32).view(B, NT, HV, *x.shape[-2:]) for x in (h, dh))
    if state_v_first:
        hc, dhc = hc.transpose(-1, -2), dhc.transpose(-1, -2)          # -> [B, NT, HV, K, V]
    gp = g.to(f32)
    if pad:
        gp = torch.cat([gp, gp[:, -1:].expand(B, pad, HV)], dim=1)    # repeat the last gate
    gc = gp.view(B, NT, BT, HV)
    g_last = gc[:, :, -1]                                              # [B, NT, HV]

    dq = torch.einsum("bnihv,bnhkv->bnihk", doc, hc) * (torch.exp2(gc) * scale)[..., None]
    dk = torch.einsum("bnihv,bnhkv->bnihk", vc, dhc) * torch.exp2(g_last[:, :, None] - gc)[..., None]
    dg_last = (hc * dhc).sum((-2, -1)) * torch.exp2(g_last) + (dk * kc).sum((2, 4))

    idx = torch.arange(NT * BT, device=q.device).view(NT, BT)
    valid = idx < T
    mask = torch.tril(torch.ones(BT, BT, dtype=torch.bool, device=q.device)) \
        & valid[:, :, None] & valid[:, None, :]                       # [NT, BT(i), BT(j)]
    gh = gc.permute(0, 1, 3, 2)                                        # [B, NT, HV, BT]
    decay = torch.where(mask[None, :, None], gh[..., :, None] - gh[..., None, :], -math.inf)
    ds = torch.einsum("bnihv,bnjhv->bnhij", doc, vc) * torch.exp2(decay) * scale
    dq = dq + torch.einsum("bnhij,bnjhk->bnihk", ds, kc)
    dk = dk + torch.einsum("bnhij,bnihk->bnjhk", ds, qc)
    dg = (dq * qc).sum(-1) - (dk * kc).sum(-1)                         # [B, NT, BT, HV]
    last = (T - 1 - torch.arange(NT, device=q.device) * BT).clamp(max=BT - 1)
    dg[:, torch.arange(NT, device=q.device), last] += dg_last

    def unchunk(x):
        return x.reshape(B, NT * BT, *x.shape[3:])[:, :T]

    dq, dk = unchunk(dq), unchunk(dk)
    if HV != H:
        dq = dq.view(B, T, H, HV // H, K).sum(3)
        dk = dk.view(B, T, H, HV // H, K).sum(3)
    dw = None
    if w is not None:
        dw = unchunk(-torch.einsum("bnihv,bnhkv->bnihk", chunks(dv), hc)).to(w.dtype).contiguous()
    # FLA adds to these in place and hands them to kernels that assume contiguous rows
    return (dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dw,
            unchunk(dg).contiguous())


# ---- the reference ---------------------------------------------------------------------
def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)


def gate(a, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias): the log of the per-step decay."""
    return -A_log.exp() * F.softplus(a + dt_bias)


def reference(q, k, v, a, b, A_log, dt_bias, h0=None):
    """The recurrence on raw projections (q, k [B, T, H, K], v [B, T, H, V], gate and beta
    logits a, b [B, T, H], h0 [B, H, V, K]) through FLA's naive reference (fp32):
    returns (o [B, T, H, V], S_T [B, H, V, K])."""
    naive = importlib.import_module("fla.ops.gated_delta_rule").naive_recurrent_gated_delta_rule
    o, s = naive(l2norm(q), l2norm(k), v, torch.sigmoid(b), gate(a, A_log, dt_bias),
                 scale=q.shape[-1] ** -0.5,
                 initial_state=None if h0 is None else h0.transpose(-1, -2),
                 output_final_state=True)
    return o, s.transpose(-1, -2)


def chunked(q, k, v, a, b, A_log, dt_bias, h0=None):
    """The fast path on the same inputs: FLA's chunk kernels, called as GatedDeltaNet calls
    them (norms, sigmoid and gate inside the kernels, state [B, H, V, K]). The inputs are
    checked first: the kernels do not check them."""
    check_tensors("fla-gdn", {"q": "b t h k", "k": "b t h k", "v": "b t h v", "a": "b t h",
                              "b": "b t h", "A_log": "h", "dt_bias": "h", "h0": "b h v k"},
                  dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, h0=h0),
                  same_dtype=("q", "k", "v", "a", "b"))
    chunk = fla().ops.gated_delta_rule.chunk_gated_delta_rule
    _check_dispatch()
    return chunk(q, k, v, g=a, beta=b, initial_state=None if h0 is None else h0.float(),
                 output_final_state=True, use_qk_l2norm_in_kernel=True,
                 use_beta_sigmoid_in_kernel=True, state_v_first=True, use_gate_in_kernel=True,
                 A_log=A_log.float(), dt_bias=dt_bias.float())


def _conv(module: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """FLA's ShortConvolution: depthwise causal conv over time of [B, T, C], then silu."""
    T, W = x.shape[1], module.weight.shape[-1]
    bias = None if module.bias is None else module.bias.to(x.dtype)
    u = F.conv1d(x.transpose(1, 2), module.weight.to(x.dtype), bias, padding=W - 1,
                 groups=x.shape[-1])[..., :T]
    return F.silu(u).transpose(1, 2)


def reference_forward(block: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """The layer's math from `block`'s parameters, with FLA's naive recurrence."""
    dt = autocast_dtype(y)
    B, T, _ = y.shape
    H, K, V = block.num_heads, block.head_k_dim, block.head_v_dim
    y = y.to(dt)

    def proj(lin):
        return y @ lin.weight.to(dt).t()

    q = _conv(block.q_conv1d, proj(block.q_proj)).view(B, T, H, K)
    k = _conv(block.k_conv1d, proj(block.k_proj)).view(B, T, H, K)
    v = _conv(block.v_conv1d, proj(block.v_proj)).view(B, T, H, V)
    o, _ = reference(q, k, v, proj(block.a_proj).float(), proj(block.b_proj).float(),
                     block.A_log.float(), block.dt_bias.float())
    norm = block.o_norm
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + norm.eps) * norm.weight.float()
    o = (o * F.silu(proj(block.g_proj).float().view(B, T, H, V))).to(dt)
    return o.reshape(B, T, H * V) @ block.o_proj.weight.to(dt).t()


# ---- the layer -------------------------------------------------------------------------
class GatedDeltaNet(nn.Module):
    """fla-gdn layer: `forward(y [B, T, d]) -> (out [B, T, d], None)`; holds
    `fla.layers.GatedDeltaNet` as `block`. `expansion` is FLA's `expand_v` (the value
    width per head is expansion * dim / nh); `n_heads` overrides nh."""

    def __init__(self, dim: int, expansion: float = 2.0, backend: str = "cuda",
                 n_heads: int | None = None, layer_idx: int | None = None):
        super().__init__()
        check_backend(backend)
        inner_width(dim, expansion)
        nh = heads(dim, n_heads)
        K = dim // nh
        if not float(K * expansion).is_integer():
            raise ValueError(f"fla-gdn: expansion={expansion} times the head width {K} must be an integer")
        self.backend, self.n_heads = backend, nh
        self.block = fla().layers.GatedDeltaNet(
            hidden_size=dim, expand_v=expansion, head_dim=K, num_heads=nh, use_gate=True,
            use_short_conv=True, conv_size=4, mode="chunk", layer_idx=layer_idx)

    def set_layer_idx(self, i: int) -> None:
        self.block.layer_idx = i

    @property
    def impl(self) -> str:
        """The path `backend="cuda"` runs now, for records (see `impl()`)."""
        return impl()

    def forward(self, y: torch.Tensor, state=None):
        no_state(state, "fla-gdn")
        check_sequence("fla-gdn", y, self.block.hidden_size)
        if self.backend == "reference":
            return reference_forward(self.block, y), None
        require_cuda(y, "fla-gdn", "flash-linear-attention's Triton kernels")
        _check_dispatch()
        out, _, _ = self.block(y, use_cache=False)
        return out, None


def layer_params(dim: int, expansion: float = 2.0) -> int:
    """VARIANTS.md section 3: 2dK + dV (q, k, v) + 2d nh (a, b) + 2 nh + 4(2K + V) (convs)
    + dV (g) + V/nh (norm) + Vd (o), with K = dim, V = expansion * dim."""
    nh = heads(dim)
    K, Vd = dim, int(dim * expansion)
    return 2 * dim * K + dim * Vd + 2 * dim * nh + 2 * nh + 4 * (2 * K + Vd) + dim * Vd + Vd // nh + Vd * dim


def parity(shape: Shape, dtype, device, generator, expansion: float = 2.0,
           n_heads: int | None = None) -> list[ParityCase]:
    """FLA's chunk path as the layer calls it against FLA's naive recurrence, every gradient
    (q, k, v, the gate and beta logits, A_log, dt_bias, the initial state)."""
    T, B, D = shape.T, shape.B, shape.D
    fla()
    nh = heads(D, n_heads)
    K = D // nh
    V = int(K * expansion)
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    dt = torch.exp(torch.rand(nh, **kw) * math.log(100.0) + math.log(1e-3))
    inputs = {
        "q": torch.randn(B, T, nh, K, **kw), "k": torch.randn(B, T, nh, K, **kw),
        "v": torch.randn(B, T, nh, V, **kw),
        "a": torch.randn(B, T, nh, **kw), "b": torch.randn(B, T, nh, **kw),
        "A_log": torch.log(1 + 15 * torch.rand(nh, **kw)),
        "dt_bias": dt + torch.log(-torch.expm1(-dt)),
        "h0": 0.5 * torch.randn(B, nh, V, K, **kw),
    }
    inputs = {n: t.requires_grad_() for n, t in inputs.items()}
    return [ParityCase(inputs, chunked, reference, ("out", "h_T"), impl())]


# (T, B, D, expansion): the training configuration (expansion 2: value width 2 K = 256)
# at each benchmark width, and the benchmarks' own (expansion 1: V = K = 128, other tiles)
VERIFY_SHAPES = ((512, 4, 512, 2.0), (512, 8, 1024, 2.0), (512, 4, 2048, 2.0), (512, 16, 1024, 1.0))
VERIFY_DTYPES = ("float32", "bfloat16")
# scripts/verify_gdn.py's modes: the layer's first (it decides the exit status and is
# recorded), then FLA's own kernel with its guard lifted, to show what the guard prevents
VERIFY_MODES = ("auto", "triton-unguarded")


def verify(shapes=VERIFY_SHAPES, dtypes=VERIFY_DTYPES, modes=("auto",), seed: int = 0,
           device: str = "cuda") -> list[dict]:
    """The fla-gdn parity comparison (chunk path against FLA's naive recurrence, forward and
    every gradient) for each chunk_bwd_dqkwg mode, dtype and (T, B, D, expansion): one row each. A
    mode FLA refuses gets a row with `refused`; a "torch" row passes only if the PyTorch
    chunk_bwd_dqkwg really ran."""
    generator = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for mode in modes:
        with dqkwg(mode):
            for dt in dtypes:
                tol = ENTRIES[0].tolerance[dt]
                for T, B, D, e in shapes:
                    row = {"mode": mode, "path": dqkwg_path(), "impl": impl(), "dtype": dt,
                           "T": T, "B": B, "D": D, "expansion": e, "heads": heads(D), "seed": seed}
                    before = calls["torch"]
                    try:
                        case, = parity(Shape(T, B, D), DTYPES[dt], device, generator, expansion=e)
                        errors = run_case(case, DTYPES[dt], generator)
                    except RuntimeError as exc:
                        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                        key = "refused" if "incorrect results" in text else "error"
                        row.update({key: text, "passed": False})
                    else:
                        fwd = max(v for k, v in errors.items() if k.startswith("fwd:"))
                        bwd = max(v for k, v in errors.items() if k.startswith("grad:"))
                        ran = calls["torch"] - before
                        row.update(errors=errors, max_fwd=fwd, max_bwd=bwd, tol_fwd=tol.fwd,
                                   tol_bwd=tol.bwd, torch_dqkwg_calls=ran,
                                   passed=fwd <= tol.fwd and bwd <= tol.bwd
                                   and (row["path"] != "torch" or ran > 0))
                    rows.append(row)
                    torch.cuda.empty_cache()
    return rows


ENTRIES = (Entry(
    name="fla-gdn", kind="baseline", aliases=("gdn", "gated-deltanet"), layer=GatedDeltaNet,
    title="Gated DeltaNet (flash-linear-attention 0.6.0, chunked Triton kernels)",
    chapter="book/chapters/baselines.ipynb",
    layer_params=layer_params, parity=parity,
    # head width 128 as nh = dim // 128 always gives (scripts/verify_gdn.py checks T = 512 at
    # D = 512, 1024, 2048): B = T = 1; T = 100 (a chunk of 64 and 36 steps); T = 512 with B = 1
    test_shapes=shapes((1, 1, 512), (100, 3, 512), (512, 1, 512)),
    tolerance=TRITON_TOLERANCE,
    notes="expansion = FLA's expand_v (layer default 2); nh = n_heads or max(1, dim//128) "
          "lowered to a divisor of dim; chunk_bwd_dqkwg in PyTorch where FLA refuses its "
          "Triton kernel (Hopper, Triton < 3.7.1); see the module docstring",
),)
