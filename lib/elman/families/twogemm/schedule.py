"""The low-rank persistent kernels' schedule restated in PyTorch (lib/csrc/twogemm/persistent.cu).

The kernel splits the state rows over a cluster of C CTAs of S rows each (rows beyond D are
zeros), and per step
  forward:  each CTA's partial V[:, I_c] h_{t-1}[I_c] rounded to the storage dtype; the C
            partials summed in rank order in fp32 and rounded (p, stored for dU); per row
            q = U[I_c, :] p; the stage (stages.py) on its rows; h_t rounded;
  backward: the stage's gradient with dL/dh_t in fp32 gives d_pre (rounded) and the direct
            term; partials of U[I_c, :]^T d_pre[I_c] rounded, summed in rank order, rounded
            (dp, stored for dV); dL/dh_{t-1} = direct + V^T dp in fp32 (never rounded).
After the kernels the op forms dU = sum_t d_pre_t^T p_t, dV = sum_t dp_t^T h_{t-1} and
db = sum d_pre as single GEMMs. `rounding` None runs everything in the inputs' dtype (fp64:
the slicing, padding, ordering and gradients must then agree with the reference to rounding
error); torch.bfloat16 rounds where the kernel stores bf16.
"""
from __future__ import annotations

import torch

from . import stages


def cluster_shape(D: int) -> tuple[int, int]:
    """(C, S) as the kernel's plan chooses them: the fewest CTAs (a power of two) of at most
    128 rows, 64 rows a CTA where that covers D."""
    C = 1
    while C * 128 < D:
        C *= 2
    return C, (64 if D <= C * 64 else 128)


def _rounder(rounding: torch.dtype | None):
    if rounding is None:
        return lambda x: x
    return lambda x: x.to(rounding).to(x.dtype)


def _slices(D: int, C: int, S: int) -> list[slice]:
    return [slice(c * S, min(D, (c + 1) * S)) for c in range(C) if c * S < D]


def _reduce(partials: list[torch.Tensor], R) -> torch.Tensor:
    total = torch.zeros_like(partials[0])
    for part in partials:  # rank order
        total = total + R(part)
    return R(total)


def lowrank_forward(mode: int, a, c, u, v, b, h0, C: int, S: int, rounding=None):
    """Returns out [T, B, D], h_all [T + 1, B, D], p_all [T, B, r], aux [T, B, D] (or None)."""
    R = _rounder(rounding)
    T, B, D = a.shape
    sl = _slices(D, C, S)
    h_all = torch.empty(T + 1, B, D, dtype=a.dtype)
    out = torch.empty(T, B, D, dtype=a.dtype)
    aux = torch.empty(T, B, D, dtype=a.dtype) if mode else None
    p_all = torch.empty(T, B, u.shape[1], dtype=a.dtype)
    h_all[0] = R(h0)
    for t in range(T):
        h = h_all[t]
        p = _reduce([h[:, s] @ v[:, s].t() for s in sl], R)
        p_all[t] = p
        q = p @ u.t()
        hn, o = torch.empty_like(h), torch.empty_like(h)
        ax = torch.empty_like(h) if mode else None
        stages.lowrank_forward(mode, a[t], c[t], q, b, h, hn, o, ax)
        h_all[t + 1], out[t] = R(hn), R(o)
        if mode:
            aux[t] = R(ax)
    return out, h_all, p_all, aux


def lowrank_backward(mode: int, c, u, v, h_all, p_all, aux, d_out, d_hT, C: int, S: int,
                     rounding=None):
    """Returns the gradients (d_a, d_c, d_U, d_V, d_b, d_h0) of the forward's (out, h_T)."""
    R = _rounder(rounding)
    T, B, D = c.shape
    sl = _slices(D, C, S)
    d_pre, d_c = torch.empty_like(c), torch.empty_like(c)
    dp_all = torch.empty_like(p_all)
    g = d_hT.clone()
    for t in range(T - 1, -1, -1):
        dp_t, dc_t, direct = (torch.empty_like(g) for _ in range(3))
        stages.lowrank_backward(mode, d_out[t], c[t], h_all[t], h_all[t + 1],
                                None if aux is None else aux[t], g, dp_t, dc_t, direct)
        d_pre[t], d_c[t] = R(dp_t), R(dc_t)
        dp = _reduce([d_pre[t][:, s] @ u[s] for s in sl], R)
        dp_all[t] = dp
        g = direct + dp @ v
    dpre2 = d_pre.reshape(T * B, D)
    du = dpre2.t() @ p_all.reshape(T * B, -1)
    dv = dp_all.reshape(T * B, -1).t() @ h_all[:T].reshape(T * B, D)
    return d_pre, d_c, du, dv, dpre2.sum(0), R(g)
