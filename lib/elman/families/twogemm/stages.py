"""The fused elementwise stages of the two-GEMM family's per-step loops, in PyTorch.

Each function computes exactly what one CUDA kernel of lib/csrc/twogemm computes (same
inputs, same outputs, fp32 arithmetic on values read in the storage dtype), so the op's
loops (`op.py`) run on the CPU with these in place of the kernels: the tests check the
loops, their checkpoint/recompute schedule and every hand-derived gradient against
autograd through the references.

Low-rank stage (modes, `pre = a_t + q_t + b` with `q = U (V h_{t-1})`):

    tanh_gate   (E4, E5)  h = tanh(pre),                                   out = h * silu(c)
    gated_tanh  (E66)     v = tanh(pre), alpha = sigmoid(c), h = alpha h_{t-1} + (1 - alpha) v,
                          out = h * silu(h)                                aux = v
    gated_alpha (E67lr)   alpha = sigmoid(pre), h = alpha h_{t-1} + (1 - alpha) c,
                          out = h * silu(h)                                aux = alpha

Tape stages (E23, per batch row, s = 1/sqrt(D), M the N x D tape):

    read   alpha = softmax(s M w_prev), w = tanh(hw + wx + M^T alpha + b), out = w * silu(z)
    write  beta = softmax(s M w),  M' = (1 - beta) M + beta u^T
"""
from __future__ import annotations

import torch

MODES = {"tanh_gate": 0, "gated_tanh": 1, "gated_alpha": 2}


def _f(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _silu_grad(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def lowrank_forward(mode: int, a, c, q, b, h_prev, h_next, out, aux) -> None:
    """One step: writes h_next, out and (modes 1, 2) aux."""
    pre = _f(a) + _f(q) + _f(b)
    hp = _f(h_prev)
    if mode == 0:
        h = torch.tanh(pre)
        o = h * torch.nn.functional.silu(_f(c))
    elif mode == 1:
        v = torch.tanh(pre)
        alpha = torch.sigmoid(_f(c))
        h = alpha * hp + (1 - alpha) * v
        aux.copy_(v)
    else:
        alpha = torch.sigmoid(pre)
        h = alpha * hp + (1 - alpha) * _f(c)
        aux.copy_(alpha)
    h_next.copy_(h)
    out.copy_(h * torch.nn.functional.silu(h) if mode else o)


def lowrank_backward(mode: int, d_out, c, h_prev, h, aux, g, d_pre, d_c, g_out) -> None:
    """One step back: g is dL/dh_t from later steps (without this step's output); writes
    d_pre (= dL/da_t = dL/dq_t), d_c and g_out (the part of dL/dh_{t-1} that bypasses U V;
    the loop adds (d_pre U) V). g_out may be g itself."""
    do, hh, hp = _f(d_out), _f(h), _f(h_prev)
    if mode == 0:
        cc = _f(c)
        dh = _f(g) + do * torch.nn.functional.silu(cc)
        dp = dh * (1 - hh * hh)
        dc = do * hh * _silu_grad(cc)
        direct = torch.zeros_like(dh)
    else:
        dh = _f(g) + do * (torch.nn.functional.silu(hh) + hh * _silu_grad(hh))  # d(h silu h)/dh
        if mode == 1:
            v, alpha = _f(aux), torch.sigmoid(_f(c))
            dp = dh * (1 - alpha) * (1 - v * v)
            dc = dh * (hp - v) * alpha * (1 - alpha)
        else:
            alpha, cc = _f(aux), _f(c)
            dp = dh * (hp - cc) * alpha * (1 - alpha)
            dc = dh * (1 - alpha)
        direct = dh * alpha
    d_pre.copy_(dp)
    d_c.copy_(dc)
    g_out.copy_(direct)


def _softmax_scores(m: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """softmax over slots of s * M w: m [B, N, D], w [B, D] (fp32) -> [B, N]."""
    s = m.shape[-1] ** -0.5
    return torch.softmax(s * torch.einsum("bnd,bd->bn", m, w), dim=-1)


def tape_read(wx, z, hw, b, m, w_prev, w_out, out) -> None:
    mm, wp = _f(m), _f(w_prev)
    alpha = _softmax_scores(mm, wp)
    r = torch.einsum("bn,bnd->bd", alpha, mm)
    w = torch.tanh(_f(hw) + _f(wx) + r + _f(b))
    w_out.copy_(w)
    out.copy_(w * torch.nn.functional.silu(_f(z)))


def tape_write(m_in, w, u, m_out) -> None:
    mm = _f(m_in)
    beta = _softmax_scores(mm, _f(w))[..., None]
    m_out.copy_((1 - beta) * mm + beta * _f(u)[:, None, :])


def tape_write_backward(m, dm, w, u, d_out, z, g, gw, du, dz) -> None:
    """Back through the write and the output: dm (fp32, [B, N, D]) holds dL/dM_t on entry
    and the write's part of dL/dM_{t-1} on exit; g is dL/dw_t from later steps. Writes
    gw = g + d_out silu(z) + s sum_n de_n M_n (the loop adds du W_wr), du, dz."""
    mm, ww, uu = _f(m), _f(w), _f(u)
    s = mm.shape[-1] ** -0.5
    beta = _softmax_scores(mm, ww)
    d_beta = torch.einsum("bnd,bnd->bn", dm, uu[:, None, :] - mm)
    de = beta * (d_beta - (beta * d_beta).sum(-1, keepdim=True))
    du.copy_(torch.einsum("bn,bnd->bd", beta, dm))
    zz, do = _f(z), _f(d_out)
    gw.copy_(_f(g) + do * torch.nn.functional.silu(zz) + s * torch.einsum("bn,bnd->bd", de, mm))
    dz.copy_(do * ww * _silu_grad(zz))
    dm.copy_((1 - beta)[..., None] * dm + s * de[..., None] * ww[:, None, :])


def tape_read_backward(m, dm, w_prev, w, gw, d_pre, g_out) -> None:
    """Back through the read and the tanh update: gw is dL/dw_t; writes d_pre (the
    pre-activation's gradient), adds the read's part into dm, and writes g_out =
    s sum_n da_n M_n (the loop adds d_pre W_h)."""
    mm, wp, ww = _f(m), _f(w_prev), _f(w)
    s = mm.shape[-1] ** -0.5
    dp = _f(gw) * (1 - ww * ww)
    alpha = _softmax_scores(mm, wp)
    d_alpha = torch.einsum("bnd,bd->bn", mm, dp)
    da = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))
    d_pre.copy_(dp)
    g_out.copy_(s * torch.einsum("bn,bnd->bd", da, mm))
    dm.add_(alpha[..., None] * dp[:, None, :] + s * da[..., None] * wp[:, None, :])
