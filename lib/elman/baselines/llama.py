"""llama: a pre-norm transformer block. Chapter: book/chapters/baselines.ipynb.

Width follows the expansion: with D = int(d * expansion), H = max(1, D // 64) heads of 64
(attention width A = 64 H) and an FFN of F = 256 * ceil(int(8 D / 3) / 256). With the
LM wrapper's normalised input a_t (LadderLM applies the first RMSNorm and the residual),
the layer returns only the branch outputs of a Llama block:

    q, k, v = RoPE(W_q a), RoPE(W_k a), W_v a                 (per head, theta 10000, pairs)
    u = W_o softmax(q k^T / 8 + causal mask) v                (SDPA; 8 = sqrt(64))
    out = u + W_2 (silu(W_1 n) * W_3 n),   n = RMSNorm(a + u)  (eps 1e-6, in fp32)

so that LadderLM's residual stream receives x + u + FFN(...), as in a Llama block, with one
difference: the FFN's norm sees a + u (a is the normalised x) instead of x + u. The seed
code placed a whole block with its own residuals and norms inside the wrapper (a double
residual and norm, VARIANTS.md section 9 item 7). No biases; all projections xavier.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..core import validate
from ..core.entry import Entry, ParityCase, Shape, Tolerance, shapes
from .common import autocast_dtype, check_backend, check_sequence, check_tensors, inner_width, no_state

HEAD_DIM = 64
THETA = 10000.0


def widths(dim: int, expansion: float = 1.0) -> tuple[int, int]:
    """(heads, FFN hidden width) for this model width and expansion."""
    D = int(dim * expansion)
    return max(1, D // HEAD_DIM), 256 * math.ceil(int(8 * D / 3) / 256)


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x_{2i}, x_{2i+1}) of x [B, H, T, hd] by t * theta^(-2i/hd)."""
    T, hd = x.shape[-2], x.shape[-1]
    ct = torch.promote_types(x.dtype, torch.float32)                  # rotate in >= fp32
    inv = THETA ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv   # [T, hd/2]
    cos, sin = ang.cos().to(ct), ang.sin().to(ct)
    x1, x2 = x[..., 0::2].to(ct), x[..., 1::2].to(ct)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).to(x.dtype)


def attention_reference(q, k, v):
    """Causal attention written out: softmax(q k^T / sqrt(hd) + mask) v on [B, H, T, hd]."""
    T = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1) @ v


def attention_sdpa(q, k, v):
    """PyTorch's fused causal attention on [B, H, T, hd] (any device; inputs checked first)."""
    check_tensors("llama", {"q": "b h t e", "k": "b h t e", "v": "b h t e"}, dict(q=q, k=k, v=v),
                  same_dtype=("q", "k", "v"), cuda=False,
                  dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64))
    # Fused attention read a v that starts 2 bytes off 16-byte alignment wrongly on the H100
    # (outputs far from the reference), so such views are copied first.
    q, k, v = (validate.aligned(t) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.float()
        return (u * torch.rsqrt(u.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class Llama(nn.Module):
    """llama layer: `forward(a [B, T, d]) -> (out [B, T, d], None)`; `backend="cuda"`
    uses `F.scaled_dot_product_attention`, "reference" the explicit softmax."""

    impl = "torch:sdpa"  # what `backend="cuda"` runs, for records

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda"):
        super().__init__()
        check_backend(backend)
        inner_width(dim, expansion)
        self.backend = backend
        self.heads, ffn = widths(dim, expansion)
        A = self.heads * HEAD_DIM
        self.w_qkv = nn.Parameter(torch.empty(3, A, dim))
        self.w_o = nn.Parameter(torch.empty(dim, A))
        self.w_13 = nn.Parameter(torch.empty(2, ffn, dim))
        self.w_2 = nn.Parameter(torch.empty(dim, ffn))
        self.norm = RMSNorm(dim)
        for w in (*self.w_qkv, self.w_o, *self.w_13, self.w_2):
            nn.init.xavier_uniform_(w)

    def forward(self, a: torch.Tensor, state=None):
        no_state(state, "llama")
        check_sequence("llama", a, self.w_o.shape[0])
        dt = autocast_dtype(a)
        B, T, _ = a.shape
        a = a.to(dt)
        w_qkv = self.w_qkv.to(dt)
        q, k, v = ((a @ w.t()).view(B, T, self.heads, HEAD_DIM).transpose(1, 2) for w in w_qkv)
        attend = attention_sdpa if self.backend == "cuda" else attention_reference
        o = attend(rope(q), rope(k), v).transpose(1, 2).reshape(B, T, -1)
        u = o @ self.w_o.to(dt).t()
        n = self.norm(a + u)
        w1, w3 = self.w_13.to(dt)
        out = u + (F.silu(n @ w1.t()) * (n @ w3.t())) @ self.w_2.to(dt).t()
        return out, None


def layer_params(dim: int, expansion: float = 1.0) -> int:
    """4 d A (q, k, v, o) + 3 d F (SwiGLU) + d (the FFN's RMSNorm)."""
    H, ffn = widths(dim, expansion)
    return 4 * dim * H * HEAD_DIM + 3 * dim * ffn + dim


def parity(shape: Shape, dtype, device, generator) -> list[ParityCase]:
    """SDPA against the written-out causal softmax on RoPE'd q, k; D is the model width
    (heads = D // 64)."""
    T, B, D = shape.T, shape.B, shape.D
    H = max(1, D // HEAD_DIM)
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    inputs = {n: torch.randn(B, H, T, HEAD_DIM, **kw).requires_grad_() for n in ("q", "k", "v")}

    def fast(q, k, v):
        return (attention_sdpa(rope(q), rope(k), v),)

    def reference(q, k, v):
        return (attention_reference(rope(q), rope(k), v),)

    return [ParityCase(inputs, fast, reference, ("out",), Llama.impl)]


ENTRIES = (Entry(
    name="llama", kind="baseline", aliases=("transformer",), layer=Llama,
    title="Llama block (RoPE, causal SDPA, SwiGLU, RMSNorm)",
    chapter="book/chapters/baselines.ipynb",
    layer_params=layer_params, parity=parity,
    # B = T = 1; T = 100 (no multiple of the attention kernels' tiles); T = 512 at D = 512
    test_shapes=shapes((1, 1, 64), (100, 2, 256), (512, 4, 512)),
    tolerance={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(1e-2, 2e-2)},
    notes="expansion scales the attention width (heads = int(d e) // 64) and the FFN "
          "(F = 256 ceil(int(8 d e / 3) / 256)); returns branch outputs only",
),)
