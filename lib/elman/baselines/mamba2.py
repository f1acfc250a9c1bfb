"""mamba2: mamba-ssm's Mamba2 block on its Triton SSD path. Chapter: book/chapters/baselines.ipynb.

With inner width D_i = expand * d, nh = D_i / P heads of P = headdim channels, state
size N = d_state and one group (B, C shared by all heads):

    [z, xBC, dt] = W_in y_t;   [x, B, C] = silu(conv4(xBC))        (depthwise, causal, bias)
    Delta_t = softplus(dt_t + dt_bias),  A = -exp(A_log)            (one scalar per head)
    S_t = exp(Delta_t A) S_{t-1} + Delta_t x_t B_t^T                  S in R^{P x N} per head
    u_t = S_t C_t + D x_t
    out_t = W_out [ RMSNorm(u_t * silu(z_t)) * w ]                   (eps 1e-5, over D_i)

The library runs the scan as the chunked SSD algorithm (chunk 256) in Triton. Its fused
path (`use_mem_eff_path=True`: conv, scan, norm and output projection in one function)
calls the causal-conv1d CUDA package, which is not installed here (and not on the GPU
host); the layer therefore runs `use_mem_eff_path=False`, which is Triton only: the
depthwise conv is `nn.Conv1d` (cuDNN), the scan `mamba_chunk_scan_combined` (Triton),
the gated norm `RMSNormGated` (Triton), the projections cuBLAS.

`expansion` is Mamba2's `expand` (layer default 2, as in the library and the seed runs):
D_i = int(dim * expansion), which must be a multiple of headdim.
The reference (`ssd_reference`) is a plain sequential loop of the recurrence above.
"""
from __future__ import annotations

from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from ..core.mamba import load as load_mamba
from ..core.entry import Entry, ParityCase, Shape, shapes
from .common import (TRITON_TOLERANCE, autocast_dtype, check_backend, check_sequence, check_tensors,
                     inner_width, no_state, require_cuda)

CHUNK = 256
IMPL = "mamba-ssm-2.3.2:ssd-triton"  # what `backend="cuda"` runs, for records


def inner(dim: int, expansion: float, headdim: int = 64) -> int:
    """D_i = int(dim * expansion), which must be a multiple of headdim."""
    Di = int(dim * expansion)
    if Di < headdim or Di % headdim:
        raise ValueError(f"mamba2: dim * expansion = {Di} must be a positive multiple of "
                         f"headdim = {headdim}")
    return Di


def ssd_reference(x, dt, A, B, C, D=None, dt_bias=None, initial_states=None):
    """The SSD recurrence step by step: x [b, l, h, p], dt [b, l, h] (softplus applied
    after adding dt_bias), A [h], B, C [b, l, g, n], D [h]; returns (y [b, l, h, p],
    S_T [b, h, p, n])."""
    b, l, h, p = x.shape
    rep = h // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, dim=2), C.repeat_interleave(rep, dim=2)
    delta = F.softplus(dt if dt_bias is None else dt + dt_bias)
    S = x.new_zeros(b, h, p, B.shape[-1]) if initial_states is None else initial_states
    ys = []
    for t in range(l):
        decay = torch.exp(delta[:, t] * A)[..., None, None]
        S = decay * S + (delta[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        y = torch.einsum("bhpn,bhn->bhp", S, Ch[:, t])
        ys.append(y if D is None else y + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1), S


def chunked(x, dt, A, B, C, D, dt_bias, initial_states):
    """mamba-ssm's Triton SSD scan on the same inputs (A, D, dt_bias in fp32 as the layer
    holds them). The inputs are checked first: the kernels do not check them."""
    check_tensors("mamba2", {"x": "b l h p", "dt": "b l h", "A": "h", "B": "b l g n",
                             "C": "b l g n", "D": "h", "dt_bias": "h", "initial_states": "b h p n"},
                  dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, initial_states=initial_states),
                  same_dtype=("x", "dt", "B", "C", "initial_states"))
    load_mamba()
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined(x, dt, A.float(), B, C, CHUNK, D=D.float(),
                                     dt_bias=dt_bias.float(), initial_states=initial_states,
                                     dt_softplus=True, return_final_states=True)


def reference_forward(block: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """The block's math from its parameters, with the sequential scan (compute dtype
    follows autocast; the scan and the norm run in at least fp32)."""
    dt = autocast_dtype(y)
    ct = torch.promote_types(dt, torch.float32)
    bsz, T, _ = y.shape
    Di, N, H, P = block.d_ssm, block.d_state, block.nheads, block.headdim
    zxbcdt = y.to(dt) @ block.in_proj.weight.to(dt).t()
    z, xBC, dtr = torch.split(zxbcdt, [Di, Di + 2 * N, H], dim=-1)
    conv = block.conv1d
    xBC = F.conv1d(xBC.transpose(1, 2), conv.weight.to(dt), conv.bias.to(dt),
                   padding=conv.kernel_size[0] - 1, groups=xBC.shape[-1])[..., :T]
    x, Bm, Cm = torch.split(F.silu(xBC).transpose(1, 2), [Di, N, N], dim=-1)
    u, _ = ssd_reference(x.reshape(bsz, T, H, P).to(ct), dtr.to(ct), -torch.exp(block.A_log.to(ct)),
                         Bm.reshape(bsz, T, 1, N).to(ct), Cm.reshape(bsz, T, 1, N).to(ct),
                         block.D.to(ct), block.dt_bias.to(ct))
    g = u.reshape(bsz, T, Di) * F.silu(z.to(ct))
    g = g * torch.rsqrt(g.square().mean(-1, keepdim=True) + block.norm.eps) * block.norm.weight.to(ct)
    return g.to(dt) @ block.out_proj.weight.to(dt).t()


class Mamba2Layer(nn.Module):
    """mamba2 layer: `forward(y [B, T, d]) -> (out [B, T, d], None)`; holds
    `mamba_ssm.Mamba2` as `block` (d_state 64, headdim 64, d_conv 4, chunk 256)."""

    def __init__(self, dim: int, expansion: float = 2.0, backend: str = "cuda",
                 d_state: int = 64, headdim: int = 64, layer_idx: int | None = None):
        super().__init__()
        check_backend(backend)
        inner_width(dim, expansion)
        # Mamba2 sets d_inner = expand * d_model; the exact fraction D_i / dim keeps it an
        # integer for any expansion (an int when the expansion is whole).
        ratio = Fraction(inner(dim, expansion, headdim), dim)
        expand = int(ratio) if ratio.denominator == 1 else ratio
        self.backend = backend
        self.block = load_mamba().Mamba2(d_model=dim, d_state=d_state, d_conv=4, expand=expand,
                                         headdim=headdim, chunk_size=CHUNK,
                                         use_mem_eff_path=False, layer_idx=layer_idx)

    impl = IMPL

    def set_layer_idx(self, i: int) -> None:
        self.block.layer_idx = i

    def forward(self, y: torch.Tensor, state=None):
        no_state(state, "mamba2")
        check_sequence("mamba2", y, self.block.d_model)
        if self.backend == "reference":
            return reference_forward(self.block, y), None
        require_cuda(y, "mamba2", "mamba-ssm's Triton kernels")
        return self.block(y), None


def layer_params(dim: int, expansion: float = 2.0) -> int:
    """VARIANTS.md section 3 with N = 64, P = 64: d(2D_i + 2N + nh) + 5(D_i + 2N) + 3nh
    + D_i + D_i d."""
    Di = inner(dim, expansion)
    N, nh = 64, Di // 64
    return dim * (2 * Di + 2 * N + nh) + 5 * (Di + 2 * N) + 3 * nh + Di + Di * dim


def parity(shape: Shape, dtype, device, generator, expansion: float = 2.0,
           d_state: int = 64, headdim: int = 64) -> list[ParityCase]:
    """The Triton chunked scan against the sequential recurrence, every gradient (x, dt, A,
    B, C, D, dt_bias, the initial state) and the final state."""
    T, B, D = shape.T, shape.B, shape.D
    H = inner(D, expansion, headdim) // headdim
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    delta = torch.exp(torch.rand(H, **kw) * 4.6 - 6.9)                # dt in [1e-3, 1e-1]
    inputs = {
        "x": torch.randn(B, T, H, headdim, **kw),
        "dt": torch.randn(B, T, H, **kw),
        "A": -(1 + 15 * torch.rand(H, **kw)),
        "B": torch.randn(B, T, 1, d_state, **kw),
        "C": torch.randn(B, T, 1, d_state, **kw),
        "D": torch.randn(H, **kw),
        "dt_bias": delta + torch.log(-torch.expm1(-delta)),
        "initial_states": 0.5 * torch.randn(B, H, headdim, d_state, **kw),
    }
    inputs = {n: t.requires_grad_() for n, t in inputs.items()}
    return [ParityCase(inputs, chunked, ssd_reference, ("out", "h_T"), IMPL)]


ENTRIES = (Entry(
    name="mamba2", kind="baseline", aliases=("mamba",), layer=Mamba2Layer,
    title="Mamba2 (mamba-ssm 2.3.2.post1, Triton SSD chunked scan)",
    chapter="book/chapters/baselines.ipynb",
    layer_params=layer_params, parity=parity,
    # B = T = 1; T = 300 (a chunk of 256 and 44 steps) with 3 heads; T = 512 at D = 512
    test_shapes=shapes((1, 1, 64), (300, 3, 96), (512, 4, 512)),
    tolerance=TRITON_TOLERANCE,
    notes="expansion = Mamba2's expand (layer default 2; dim * expansion a multiple of 64); "
          "d_state 64, headdim 64; "
          "use_mem_eff_path=False (the fused path needs causal-conv1d)",
),)
