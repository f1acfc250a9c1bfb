"""LadderLM: the byte-level language model every variant and baseline is trained in
(VARIANTS.md section 4, project decision 8). Chapter: book/chapters/training_protocol.ipynb.

    h = Emb[tokens]                                  Emb ~ N(0, 0.02), V = 256 bytes
    residual = None
    for each layer l:
        residual = h (first layer) or h + residual   kept in fp32
        a = RMSNorm_l(residual)                      eps 1e-5, weight only, output in h's dtype
        h, _ = Layer_l(a)                            any registered level, by name
    logits = RMSNorm_final(h + residual) @ Emb^T     tied head, no bias
    loss = mean cross-entropy of the next byte

Layout: when every layer computes time-major (`RecurrentLayer.time_major`: the dense,
diagonal and two-GEMM families), the embedding, residual stream, norms and logits are
time-major [T, B, .] tensors and each layer gets a [B, T, d] view of its input, which it
reads without a copy, and returns a view of its time-major output: no transpose copies
between the layers, forward or backward. Otherwise everything is batch-major. The layout
changes no value; `forward` returns [B, T, V] either way (a view in the time-major case) and
`next_byte_loss` flattens the logits in their storage order, so the mean cross-entropy sums
its terms in another order (fp32 rounding).

The add + RMSNorm is one step with three implementations, chosen by `norm`: `"elman"`
(the default on the CUDA backend) is this package's Triton forward and backward
(`addnorm.add_rms_norm`: one pass each, the backward reading and writing only what its math
needs); `"fused"` is mamba-ssm's Triton kernel `rms_norm_fn(..., prenorm=True,
residual_in_fp32=True)`, kept to compare against; `"torch"` is the same math in PyTorch
(`F.rms_norm` on the fp32 sum, with autocast off), used on CPU. All add in fp32, normalise in
fp32 with eps 1e-5 and return the normalised tensor in the dtype of the layer output that came
in. The one numerical difference: the Triton kernels sum the squares with Triton's tree
reduction over a power-of-two block, PyTorch uses its own reduction order, so they agree to
fp32 rounding (about 1e-7 relative), which after the cast to bf16 can flip the last bit of
some elements. `compare_norms` measures it.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import registry
from .addnorm import add_rms_norm

VOCAB = 256
EPS = 1e-5
NORMS = ("auto", "elman", "fused", "torch")
LAYOUTS = ("auto", "batch", "time")


def _fused_rms_norm():
    from ..core.mamba import load
    load()
    from mamba_ssm.ops.triton.layer_norm import rms_norm_fn
    return rms_norm_fn


def add_rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                       eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) in x's dtype, x + residual in fp32), the PyTorch path."""
    with torch.autocast(x.device.type, enabled=False):
        r = x.float() if residual is None else x.float() + residual
        y = F.rms_norm(r, (r.shape[-1],), weight.float(), eps)
    return y.to(x.dtype), r


class AddNorm(nn.Module):
    """Residual add + RMSNorm (weight only, initialised to ones)."""

    def __init__(self, dim: int, impl: str = "torch", eps: float = EPS):
        super().__init__()
        if impl not in NORMS[1:]:
            raise ValueError(f"norm implementation must be one of {NORMS[1:]}, got {impl!r}")
        self.weight = nn.Parameter(torch.ones(dim))
        self.impl, self.eps = impl, eps
        self._fused = _fused_rms_norm() if impl == "fused" else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.impl == "elman":
            return add_rms_norm(x, self.weight, residual, self.eps)
        if self._fused is None:
            return add_rms_norm_torch(x, self.weight, residual, self.eps)
        if not x.is_cuda:
            raise RuntimeError("the fused RMSNorm (mamba-ssm's Triton kernel) needs CUDA tensors; "
                               "use norm='torch' on CPU")
        return self._fused(x, self.weight, None, residual=residual, prenorm=True,
                           residual_in_fp32=True, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, impl={self.impl}, eps={self.eps}"


def _checkpointed(layer: nn.Module, a: torch.Tensor) -> torch.Tensor:
    """layer(a)[0] under activation checkpointing. Buffers that the forward updates (the
    spectral norm's power-iteration vector) are put back to their values before the
    forward while the backward recomputes it, so the recomputation repeats it exactly."""
    buffers = list(layer.buffers())
    before = [b.detach().clone() for b in buffers]

    @contextlib.contextmanager
    def recompute():
        after = [b.detach().clone() for b in buffers]
        with torch.no_grad():
            for b, v in zip(buffers, before):
                b.copy_(v)
        try:
            yield
        finally:
            with torch.no_grad():
                for b, v in zip(buffers, after):
                    b.copy_(v)

    return checkpoint(lambda u: layer(u)[0], a, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), recompute()))


def next_byte_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in fp32 of logits [B, T, V] for windows [B, T+1]. Logits
    that are a view of time-major storage are flattened time-major (no copy), with the
    targets in the same order."""
    targets = batch[:, 1:]
    if not logits.is_contiguous() and logits.transpose(0, 1).is_contiguous():
        logits, targets = logits.transpose(0, 1), targets.t()
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def default_backend() -> str:
    return "cuda" if torch.cuda.is_available() else "reference"


class LadderLM(nn.Module):
    """Byte-level LM around any registered level: `LadderLM("E1", dim=256, depth=2)`.

    `backend` ("cuda" | "reference") goes to every layer, default "cuda" when CUDA is
    available. `norm` is "elman", "fused", "torch" or "auto" (elman with the CUDA backend,
    torch otherwise). `layout` is "time", "batch" or "auto" (time-major when
    every layer computes time-major; the attribute `time_major` holds the choice). Other
    keyword options go to the level's layer class unchanged.
    """

    def __init__(self, level: str, dim: int, depth: int, expansion: float = 1.0,
                 vocab_size: int = VOCAB, backend: str | None = None, norm: str = "auto",
                 gradient_checkpointing: bool = False, layout: str = "auto", **options):
        super().__init__()
        if dim < 1 or depth < 1:
            raise ValueError(f"dim and depth must be positive, got dim={dim}, depth={depth}")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.entry = registry.get(level)
        self.level, self.dim, self.depth, self.expansion = self.entry.name, dim, depth, expansion
        self.backend = backend or default_backend()
        self.norm = norm if norm != "auto" else ("elman" if self.backend == "cuda" else "torch")
        self.options = dict(options)
        self.gradient_checkpointing = gradient_checkpointing
        self.embedding = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.layers = nn.ModuleList()
        for i in range(depth):
            layer = self.entry.layer(dim, expansion=expansion, backend=self.backend, **options)
            if hasattr(layer, "set_layer_idx"):
                layer.set_layer_idx(i)
            self.layers.append(layer)
        self.norms = nn.ModuleList(AddNorm(dim, self.norm) for _ in range(depth))
        self.final_norm = AddNorm(dim, self.norm)
        self.time_major = layout == "time" or (
            layout == "auto" and all(getattr(layer, "time_major", False) for layer in self.layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] for byte tokens [B, T]."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
        tm = self.time_major
        h, residual = self.embedding(tokens.t() if tm else tokens), None
        for layer, norm in zip(self.layers, self.norms):
            a, residual = norm(h, residual)
            a = a.transpose(0, 1) if tm else a  # the layer sees [B, T, d]
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                h = _checkpointed(layer, a)
            else:
                h = layer(a)[0]
            h = h.transpose(0, 1) if tm else h
        y, _ = self.final_norm(h, residual)
        logits = F.linear(y, self.embedding.weight)
        return logits.transpose(0, 1) if tm else logits

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) of windows [B, T+1]."""
        return next_byte_loss(self(batch[:, :-1]), batch)

    def extra_repr(self) -> str:
        return (f"level={self.level}, dim={self.dim}, depth={self.depth}, "
                f"expansion={self.expansion}, backend={self.backend}, norm={self.norm}, "
                f"layout={'time' if self.time_major else 'batch'}")


def n_params(model: nn.Module) -> int:
    """Parameters of a model, the tied embedding counted once."""
    return sum(p.numel() for p in model.parameters())


def compare_norms(dim: int = 1280, rows: int = 4096, dtype: torch.dtype = torch.bfloat16,
                  device: str = "cuda", seed: int = 0, impl: str = "elman") -> dict[str, float]:
    """A Triton add + RMSNorm (`impl` "elman" or "fused") against PyTorch's on random inputs:
    the largest absolute differences of the output, of the fp32 residual and of the input
    gradients, and the fraction of output elements that differ at all."""
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(rows, dim, device=device, generator=g).to(dtype).requires_grad_()
    res = torch.randn(rows, dim, device=device, generator=g).requires_grad_()
    w = (1 + 0.1 * torch.randn(dim, device=device, generator=g)).requires_grad_()
    dy = torch.randn(rows, dim, device=device, generator=g).to(dtype)
    if impl == "fused":
        fused = _fused_rms_norm()
        first = lambda: fused(x, w, None, residual=res, prenorm=True, residual_in_fp32=True, eps=EPS)
    elif impl == "elman":
        first = lambda: add_rms_norm(x, w, res)
    else:
        raise ValueError(f"impl must be 'elman' or 'fused', got {impl!r}")
    out = {}
    results = []
    for fn in (first, lambda: add_rms_norm_torch(x, w, res)):
        y, r = fn()
        grads = torch.autograd.grad((y.float() * dy.float()).sum() + r.sum(), (x, res, w))
        results.append((y, r, *grads))
    names = ("out", "residual", "grad_x", "grad_residual", "grad_weight")
    for name, a, b in zip(names, *results):
        out[f"max_abs_{name}"] = (a.float() - b.float()).abs().max().item()
    out["frac_out_differ"] = (results[0][0] != results[1][0]).float().mean().item()
    return out
