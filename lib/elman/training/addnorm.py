"""Residual add + RMSNorm in Triton, forward and backward: `LadderLM(norm="elman")`.

    r = x + residual                      in fp32; residual is fp32, x bf16, fp16 or fp32
    y = r * rstd * w,  rstd = 1 / sqrt(mean(r^2) + eps)     cast to x's dtype

returns (y, r), the same values as `lm.add_rms_norm_torch` (the definition) to fp32 rounding.
With xhat = r * rstd, g = dy * w and c = mean(xhat * g) over a row, the backward is

    d  = (g - xhat * c) * rstd + dr       dr: the gradient reaching r (absent for a final norm)
    dx = d in x's dtype,  dresidual = d in fp32,  dw = sum over rows of dy * xhat

Forward: one program per row; it reads x and the residual and writes y, r and rstd (fp32,
one per row, saved with r for the backward). Backward: one pass over the rows, split into
contiguous blocks, several programs per SM; each program keeps w and its fp32 partial of dw
in registers, reads dy, r, rstd and dr and writes dx and dresidual once per row, and stores
its partial dw as one row of a [programs, N] fp32 buffer that a `sum` reduces. Per row of N
elements with bf16 x, the forward moves 2N + 4N in and 2N + 4N out bytes, the backward
2N + 4N + 4N in (dy, r, dr) and 2N + 4N out (dx, dresidual): only what the math must read
and write, besides 4 bytes of rstd a row and the dw partials (for 32768 rows of 1280 on the
132 SMs of an H100, 396 partial rows: 4 MB written and read against 671 MB). A row is one block
of BLOCK_N = next power of two >= N columns, masked, 8 columns per thread (16 above 4096).

The kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported), which the tests use.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

# Backward programs per SM: as many as make about WARPS_PER_SM warps, so that the loads of some
# rows are in flight while others are reduced, and all programs are resident at once (24 warps
# of 32 threads fit the 64K registers of an SM at up to 85 registers a thread; the bf16 kernel
# compiled for sm_90 takes 56 to 80 for N <= 2048).
WARPS_PER_SM = 24
MAX_N = 8192  # widest row: one block of registers a row (126 registers a thread at 8192)
INTERPRETER_PROGRAMS = 4  # backward programs under the interpreter (no SMs to count)


@triton.jit
def _add_rms_norm_fwd(X, RES, Y, R, RSTD, W, N, eps,
                      HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offs = row * N + cols
    r = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r += tl.load(RES + offs, mask=mask, other=0.0)
    rstd = tl.math.rsqrt(tl.sum(r * r, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(R + offs, r, mask=mask)
    tl.store(Y + offs, (r * rstd * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _add_rms_norm_bwd(DY, DR, R, RSTD, W, DX, DRES, DW, M, N, rows_per_program,
                      HAS_DR: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    start = pid * rows_per_program
    for row in range(start, tl.minimum(start + rows_per_program, M)):
        offs = tl.cast(row, tl.int64) * N + cols
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = tl.load(R + offs, mask=mask, other=0.0) * rstd
        g = dy * w
        c = tl.sum(xhat * g, axis=0) / N
        d = (g - xhat * c) * rstd
        if HAS_DR:
            d += tl.load(DR + offs, mask=mask, other=0.0)
        tl.store(DX + offs, d.to(DX.dtype.element_ty), mask=mask)
        if HAS_RESIDUAL:
            tl.store(DRES + offs, d, mask=mask)
        dw += dy * xhat
    tl.store(DW + pid.to(tl.int64) * N + cols, dw, mask=mask)


def _launch_config(n: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) for rows of n elements: 8 columns per thread, 1 to 16 warps."""
    block = triton.next_power_of_2(n)
    return block, min(16, max(1, block // 256))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _backward_programs(device: torch.device, warps: int) -> int:
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index) * max(1, WARPS_PER_SM // warps)


class _AddRMSNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        shape, n = x.shape, x.shape[-1]
        x2 = x.contiguous().view(-1, n)
        res2 = None if residual is None else residual.contiguous().view(-1, n)
        m = x2.shape[0]
        y = torch.empty_like(x2)
        r = torch.empty(m, n, dtype=torch.float32, device=x.device)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        block, warps = _launch_config(n)
        if m:
            _add_rms_norm_fwd[(m,)](x2, x2 if res2 is None else res2, y, r, rstd, weight.contiguous(), n, eps,
                                    HAS_RESIDUAL=res2 is not None, BLOCK_N=block, num_warps=warps)
        ctx.save_for_backward(r, rstd, weight)
        ctx.shape, ctx.x_dtype, ctx.has_residual = shape, x.dtype, residual is not None
        ctx.set_materialize_grads(False)
        return y.view(shape), r.view(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dr):
        r, rstd, weight = ctx.saved_tensors
        m, n = r.shape
        dy = torch.zeros(m, n, dtype=ctx.x_dtype, device=r.device) if dy is None else dy.contiguous().view(m, n)
        dr = None if dr is None else dr.contiguous().view(m, n)
        dx = torch.empty(m, n, dtype=ctx.x_dtype, device=r.device)
        dres = torch.empty_like(r) if ctx.has_residual else None
        block, warps = _launch_config(n)
        rows = triton.cdiv(m, _backward_programs(r.device, warps)) if m else 1
        programs = triton.cdiv(m, rows)
        partial = torch.empty(programs, n, dtype=torch.float32, device=r.device)
        if m:
            _add_rms_norm_bwd[(programs,)](dy, dy if dr is None else dr, r, rstd, weight.contiguous(), dx,
                                           dx if dres is None else dres, partial, m, n, rows,
                                           HAS_DR=dr is not None, HAS_RESIDUAL=dres is not None,
                                           BLOCK_N=block, num_warps=warps)
        dw = partial.sum(0).to(weight.dtype)
        return dx.view(ctx.shape), dw, None if dres is None else dres.view(ctx.shape), None


def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
                 eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) in x's dtype, x + residual in fp32) by the Triton kernels.
    x: [..., N]; weight: [N]; residual: fp32, x's shape, or None."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or x.dim() == 0:
        raise ValueError(f"x must be fp32, bf16 or fp16 with a last dimension, got {x.dtype} {tuple(x.shape)}")
    if not 1 <= x.shape[-1] <= MAX_N:
        raise ValueError(f"the elman add + RMSNorm takes rows of 1 to {MAX_N} elements, got "
                         f"{x.shape[-1]}; use norm='fused' or norm='torch'")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight must have shape {tuple(x.shape[-1:])}, got {tuple(weight.shape)}")
    if residual is not None and (residual.dtype != torch.float32 or residual.shape != x.shape):
        raise ValueError(f"residual must be fp32 of shape {tuple(x.shape)}, "
                         f"got {residual.dtype} {tuple(residual.shape)}")
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("the elman add + RMSNorm (Triton) needs CUDA tensors; use norm='torch' on CPU")
    tensors = (x, weight) + ((residual,) if residual is not None else ())
    if any(t.device != x.device for t in tensors):
        raise ValueError(f"x, weight and residual must be on one device, got {[str(t.device) for t in tensors]}")
    return _AddRMSNorm.apply(x, weight, residual, eps)
