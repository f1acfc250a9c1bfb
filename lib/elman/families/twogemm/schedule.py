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


def cluster_shape(D: int, r: int = 1) -> tuple[int, int]:
    """(C, S) as the kernel's plan chooses them: the fewest CTAs (a power of two; for r above
    256, whose receive buffers are larger, exactly ceil(D / 128)) of at most 128 rows, 64 rows a
    CTA where that covers D."""
    if r > 256:
        C = -(-D // 128)
    else:
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


# ---- E23's persistent forward (lib/csrc/twogemm/tape_persistent.cu) --------------------------
TAPE_ROWS = 32  # state rows per CTA
TAPE_MAX_DIM = 512
TAPE_MAX_SLOTS = 32


def tape_cluster(D: int) -> int:
    """C as the kernel's plan chooses it: the fewest CTAs of 32 rows (4, 8 or 16) covering D."""
    C = 4
    while C * TAPE_ROWS < D:
        C *= 2
    return C


def tape_forward(x, z, w_x, w_h, w_wr, b, h0, tape0, K: int, rounding=None):
    """E23's forward as the persistent kernel runs it. Per step, with s = 1 / sqrt(D):
    alpha from the carried read scores R = M_{t-1} w_{t-1}; w_t and the output; the write
    scores W = M_{t-1} w_t summed from per-CTA partials (32-row slices, fp32, rank order);
    W_h w_t (next step) and u = W_wr w_t rounded; the tape update rounded; then the next read
    scores R = (1 - beta) W + beta (u . w_t) (u . w_t also summed from per-CTA partials): the
    tape is never multiplied by w a second time. Returns (out, w_all [T + 1, B, D], tape_T,
    ckpt [ceil(T / K), B, N, D], u_all [T, B, D], alpha_all, beta_all [T, B, N]): the last
    three are what the persistent backward reads."""
    R = _rounder(rounding)
    T, B, D = x.shape
    C = tape_cluster(D)
    sl = _slices(D, C, TAPE_ROWS)
    s = D ** -0.5
    wx = R(x @ w_x.t())
    tape = R(tape0)
    w = R(h0)
    ckpt, us, alphas, betas = [], [], [], []
    w_all, outs = [w], []
    rs = torch.einsum("bnd,bd->bn", tape, w)
    hw = R(w @ w_h.t())
    for t in range(T):
        if t % K == 0:
            ckpt.append(tape)
        alpha = torch.softmax(s * rs, dim=-1)
        pre = hw + wx[t] + torch.einsum("bn,bnd->bd", alpha, tape) + b
        w_new = torch.tanh(pre)
        outs.append(R(w_new * torch.nn.functional.silu(z[t])))
        w = R(w_new)
        w_all.append(w)
        ws = sum(torch.einsum("bnd,bd->bn", tape[..., i], w[:, i]) for i in sl)
        beta = torch.softmax(s * ws, dim=-1)
        hw, u = R(w @ w_h.t()), R(w @ w_wr.t())
        tape = R((1 - beta)[..., None] * tape + beta[..., None] * u[:, None, :])
        uw = sum((u[:, i] * w[:, i]).sum(-1) for i in sl)
        rs = (1 - beta) * ws + beta * uw[:, None]
        us.append(u)
        alphas.append(alpha)
        betas.append(beta)
    return (torch.stack(outs), torch.stack(w_all), tape, torch.stack(ckpt), torch.stack(us),
            torch.stack(alphas), torch.stack(betas))


def tape_backward_steps(z, w_h, w_wr, w_all, u_all, alpha_all, beta_all, ckpt, d_out, d_hT,
                        d_tapeT, K: int, rounding=None):
    """E23's backward kernel as it runs (tape_persistent_backward.cu): segments of K steps
    last to first, each segment's tapes recomputed from its checkpoint with the stored u and
    beta (no scores); per step the write's gradient (du, the dbeta partials per CTA in rank
    order), W_wr^T du, d_pre (rounded), the read's gradient (the dalpha partials), W_h^T d_pre;
    dL/dw and dL/dM in fp32, never rounded. Returns what the kernel writes: (d_pre, d_u, d_z
    [T, B, D], dh0 [B, D], d_tape0 [B, N, D])."""
    R = _rounder(rounding)
    T, B, D = z.shape
    sl = _slices(D, tape_cluster(D), TAPE_ROWS)
    s = D ** -0.5
    d_pre, d_u, d_z = (torch.empty_like(z) for _ in range(3))
    g, dM = d_hT.clone(), d_tapeT.clone()
    for start in range((T - 1) // K * K, -1, -K):
        end = min(T, start + K)
        tapes = [ckpt[start // K]]
        for t in range(start, end - 1):
            beta, u = beta_all[t], u_all[t]
            tapes.append(R((1 - beta)[..., None] * tapes[-1] + beta[..., None] * u[:, None, :]))
        for t in range(end - 1, start - 1, -1):
            M, u, w, wp = tapes[t - start], u_all[t], w_all[t + 1], w_all[t]
            alpha, beta = alpha_all[t], beta_all[t]
            du = R(torch.einsum("bn,bnd->bd", beta, dM))
            dbeta = sum(torch.einsum("bnd,bnd->bn", dM[..., i], u[:, None, i] - M[..., i])
                        for i in sl)
            dsw = s * beta * (dbeta - (beta * dbeta).sum(-1, keepdim=True))
            gw = g + d_out[t] * torch.nn.functional.silu(z[t]) + \
                torch.einsum("bn,bnd->bd", dsw, M) + du @ w_wr
            d_u[t] = du
            sg = torch.sigmoid(z[t])
            d_z[t] = R(d_out[t] * w * sg * (1 + z[t] * (1 - sg)))
            dM = (1 - beta)[..., None] * dM + dsw[..., None] * w[:, None, :]
            dp = R(gw * (1 - w * w))
            d_pre[t] = dp
            dalpha = sum(torch.einsum("bd,bnd->bn", dp[:, i], M[..., i]) for i in sl)
            dra = s * alpha * (dalpha - (alpha * dalpha).sum(-1, keepdim=True))
            g = dp @ w_h + torch.einsum("bn,bnd->bd", dra, M)
            dM = dM + alpha[..., None] * dp[:, None, :] + dra[..., None] * wp[:, None, :]
    return d_pre, d_u, d_z, R(g), dM


def tape_backward(x, z, w_x, w_h, w_wr, w_all, u_all, alpha_all, beta_all, ckpt, d_out, d_hT,
                  d_tapeT, K: int, rounding=None):
    """The gradients of (x, z, W_x, W_h, W_wr, b, h0, tape0): the kernel's steps
    (tape_backward_steps), then the op's GEMMs over the stored d_pre and d_u."""
    T, B, D = x.shape
    d_pre, d_u, d_z, dh0, d_tape0 = tape_backward_steps(z, w_h, w_wr, w_all, u_all, alpha_all,
                                                        beta_all, ckpt, d_out, d_hT, d_tapeT,
                                                        K, rounding)
    dp2 = d_pre.reshape(T * B, D)
    dx = (dp2 @ w_x).view(T, B, D)
    dw_x = dp2.t() @ x.reshape(T * B, D)
    dw_h = dp2.t() @ w_all[:T].reshape(T * B, D)
    dw_wr = d_u.reshape(T * B, D).t() @ w_all[1:].reshape(T * B, D)
    return dx, d_z, dw_x, dw_h, dw_wr, dp2.sum(0), dh0, d_tape0


# ---- the low-rank forward's step order (persistent.cu) ---------------------------------------
def lowrank_forward_events(T: int, lead: int) -> list[tuple[str, int]]:
    """One CTA's forward as the kernel orders it, for the input ring (`lead` steps ahead in
    lead + 1 slots, one cp.async group a step) and the outputs: ("issue", s) stages step s's
    inputs (an empty group where s >= T), ("wait", k) waits until at most k groups are pending,
    ("barrier", -1) is a block barrier, ("read", t) reads step t's staged inputs, ("state", t)
    writes h_t, ("store", t) stores step t's outputs. While step t's partials travel it stores
    step t - 1's outputs and reads step t's inputs; it waits for step t + 1's inputs before the
    closing barrier."""
    ev: list[tuple[str, int]] = [("issue", s) for s in range(lead)]
    ev += [("wait", lead - 1), ("barrier", -1)]
    for t in range(T):
        ev += [("issue", t + lead)] + ([("store", t - 1)] if t else [])
        ev += [("read", t), ("barrier", -1), ("state", t), ("wait", lead - 1), ("barrier", -1)]
    return ev + ([("store", T - 1)] if T else [])


def check_lowrank_forward_events(ev: list[tuple[str, int]], T: int, lead: int) -> None:
    """Raises AssertionError unless: every read of step t follows the completion of step t's
    copies (each thread waits for its own) and a block barrier after it (the other threads');
    a slot is refilled only after a block barrier that follows the last read of its previous
    step; each step's state precedes its outputs, stored exactly once."""
    issued: list[int] = []
    done: set[int] = set()       # groups complete in this thread
    visible: set[int] = set()    # groups complete in every thread
    read_at: dict[int, int] = {}  # step -> barriers seen at its read
    barriers, states, stores = 0, set(), []
    for kind, s in ev:
        if kind == "issue":
            prev = s - (lead + 1)
            if 0 <= prev < T:
                assert prev in read_at and read_at[prev] < barriers, f"slot of step {prev} refilled"
            issued.append(s)
        elif kind == "wait":
            done.update(issued[:len(issued) - s])
        elif kind == "barrier":
            barriers += 1
            visible |= done
        elif kind == "read":
            assert s in visible, f"step {s} read before its copies were visible"
            read_at[s] = barriers
        elif kind == "state":
            states.add(s)
        elif kind == "store":
            assert s in states, f"step {s} stored before its state"
            stores.append(s)
    assert sorted(stores) == list(range(T)), "every step's outputs stored exactly once"
    assert set(read_at) == set(range(T)), "every step's inputs read"
