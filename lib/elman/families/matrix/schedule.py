"""The kernels' schedule in plain PyTorch: the checkpointed forward and the backward that walks
the chunks in reverse, recomputing each chunk's states from its checkpoint, with the hand-derived
gradient of every step. It mirrors lib/csrc/matrix/recurrence.cuh and warp.cuh step for step (vectorised over
batch and heads), so the CPU tests check the kernels' schedule and backward math against
autograd of `reference.recurrence` before a GPU sees them.

Checkpoint c holds the state before step c*K (checkpoint 0 = h0); there are ceil(T / K). The
backward walks each chunk in sub-chunks of `slots` steps from its end (the states the warp and
tiled kernels keep in shared memory): for sub-chunk [s0, s1) it recomputes from the chunk's
checkpoint up to step s1, keeping S_{t-1} for t >= s0, then walks back from S_{s1}.
Backward of one step, given dS (the gradient of S_t from later steps and the final state) and
do_t:
    dS += q do^T;  dq = S_t do
    dP = dS * act'(S_t)                      (1 - S_t^2 for tanh, 1 for linear)
    d decay = sum dP * S_{t-1}               (over i, j; over i only for a column decay)
    delta = v - S_{t-1}^T k
    d beta = sum_ij dP[i, j] k_i delta_j
    d delta = beta * dP^T k;  dv = d delta
    dk = beta * dP delta - S_{t-1} d delta
    dS_{t-1} = decay * dP - k d delta^T
"""
from __future__ import annotations

import math

import torch

from .reference import decay_of


def checkpoints(T: int, K: int) -> int:
    return math.ceil(T / K)


def _step(S, k, v, a, beta, step):
    r = torch.einsum("bhij,bhi->bhj", S, k)
    delta = v - r
    write = k[..., :, None] * delta[..., None, :]
    if beta is not None:
        write = beta[:, :, None, None] * write
    P = a * S + write
    return (torch.tanh(P) if step == "tanh" else P), delta


def _decay(decay, t, column):
    return decay[t][:, :, None, :] if column else decay[t][:, :, None, None]


def forward(q, k, v, decay, beta, h0, step: str = "tanh", K: int = 16):
    """(o [T, B, H, v], S_T [B, H, n, v], ckpt [ceil(T/K), B, H, n, v])."""
    T, B, H, n = k.shape
    column = decay_of(decay, H, v.shape[-1]) == "column"
    S, outs, ckpt = h0, [], []
    for t in range(T):
        if t % K == 0:
            ckpt.append(S)
        S, _ = _step(S, k[t], v[t], _decay(decay, t, column), None if beta is None else beta[t], step)
        outs.append(torch.einsum("bhij,bhi->bhj", S, q[t]))
    return torch.stack(outs), S, torch.stack(ckpt)


def backward(q, k, v, decay, beta, ckpt, d_o, d_ST, step: str = "tanh", K: int = 16, slots: int = 0):
    """(dq, dk, dv, d_decay, d_beta or None, dh0) from the checkpoints alone; slots = 0 keeps
    the whole chunk."""
    T, B, H, n = k.shape
    column = decay_of(decay, H, v.shape[-1]) == "column"
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dd = torch.zeros_like(decay)
    db = None if beta is None else torch.zeros_like(beta)
    dS = d_ST.clone()
    slots = K if slots <= 0 else min(slots, K)
    for c in reversed(range(checkpoints(T, K))):
        start, end = c * K, min(T, (c + 1) * K)
        for s1 in range(end, start, -slots):
            s0 = max(start, s1 - slots)
            S = ckpt[c]
            for t in range(start, s0):                       # the sub-chunk's head, not kept
                S, _ = _step(S, k[t], v[t], _decay(decay, t, column), None if beta is None else beta[t], step)
            states = [S]                                     # S_{s0-1+s} for s = 0..s1-s0
            for t in range(s0, s1):
                S, _ = _step(states[-1], k[t], v[t], _decay(decay, t, column),
                             None if beta is None else beta[t], step)
                states.append(S)
            dS = _walk_back(states, s0, s1, q, k, v, decay, beta, d_o, dS, step, column, dq, dk, dv, dd, db)
    return dq, dk, dv, dd, db, dS


def backward_order(T: int, K: int, slots: int = 0) -> list[tuple[int, str]]:
    """The steps whose inputs `backward` reads, in its order: per chunk (the last first) and per
    sub-chunk [s0, s1) (the last first), ("recompute", t) for t = start .. s1 - 1, then ("walk", t)
    for t = s1 - 1 .. s0. The warp kernels' input ring (warp.cuh, BackwardOrder) fetches these
    rows ahead in this order."""
    slots = K if slots <= 0 else min(slots, K)
    out = []
    for c in reversed(range(checkpoints(T, K))):
        start, end = c * K, min(T, (c + 1) * K)
        for s1 in range(end, start, -slots):
            s0 = max(start, s1 - slots)
            out += [("recompute", t) for t in range(start, s1)] + [("walk", t) for t in reversed(range(s0, s1))]
    return out


def _walk_back(states, start, end, q, k, v, decay, beta, d_o, dS, step, column, dq, dk, dv, dd, db):
    """Backpropagate steps end-1 .. start (states[s] = S_{start-1+s}); returns dS before start."""
    for t in reversed(range(start, end)):
        S_new, S_old = states[t - start + 1], states[t - start]
        kt, qt, do = k[t], q[t], d_o[t]
        b = 1.0 if beta is None else beta[t][:, :, None]
        dS = dS + qt[..., :, None] * do[..., None, :]
        dq[t] = torch.einsum("bhij,bhj->bhi", S_new, do)
        dP = dS * (1 - S_new * S_new) if step == "tanh" else dS
        dd[t] = (dP * S_old).sum(2) if column else (dP * S_old).sum((2, 3))
        delta = v[t] - torch.einsum("bhij,bhi->bhj", S_old, kt)
        if beta is not None:
            db[t] = torch.einsum("bhij,bhi,bhj->bh", dP, kt, delta)
        ddelta = b * torch.einsum("bhij,bhi->bhj", dP, kt)
        dv[t] = ddelta
        dk[t] = b * torch.einsum("bhij,bhj->bhi", dP, delta) - torch.einsum("bhij,bhj->bhi", S_old, ddelta)
        dS = _decay(decay, t, column) * dP - kt[..., :, None] * ddelta[..., None, :]
    return dS
