"""The recurrence the matrix family's kernels implement, as plain sequential PyTorch.

Per head the state S is n x v, indexed key-first: S[i, j] with i over the n keys and j over
the v values. Per step, from the step's inputs q_t, k_t [n], v_t [v], a decay and an optional
write gate beta_t (a scalar per head, or None for 1):

    r = S^T k                  (r_j = sum_i S[i, j] k_i, a v-vector)
    delta = v - r
    P = a * S + beta * k delta^T
    S = act(P)                 (act = tanh, or the identity for a linear state)
    o = S^T q                  (a v-vector)

The decay `a` is one scalar per head ([T, B, H]: E88) or one per value column ([T, B, H, v]:
E75's per-row forget gate in its value-first convention, S^T here). The projections, silu,
L2 normalisation, decay and gates around it are time-parallel PyTorch in the variants.
"""
from __future__ import annotations

import torch

STEPS = ("tanh", "linear")  # the step functors of lib/csrc/matrix/steps.cuh


def decay_of(decay: torch.Tensor, H: int, v: int) -> str:
    """'scalar' for a [T, B, H] decay, 'column' for [T, B, H, v]."""
    if decay.dim() == 3 and decay.shape[2] == H:
        return "scalar"
    if decay.dim() == 4 and tuple(decay.shape[2:]) == (H, v):
        return "column"
    raise ValueError(f"decay must be [T, B, H={H}] (one per head) or [T, B, H={H}, v={v}] "
                     f"(one per value column), got {tuple(decay.shape)}")


def recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor,
               beta: torch.Tensor | None, h0: torch.Tensor, step: str = "tanh"):
    """q, k [T, B, H, n], v [T, B, H, v], decay [T, B, H] or [T, B, H, v], beta [T, B, H] or
    None, h0 [B, H, n, v]. Returns (o [T, B, H, v], S_T [B, H, n, v])."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    T, B, H, n = k.shape
    vd = v.shape[-1]
    column = decay_of(decay, H, vd) == "column"
    S = h0
    outs = []
    for t in range(T):
        kt, qt = k[t], q[t]
        r = torch.einsum("bhij,bhi->bhj", S, kt)
        delta = v[t] - r
        a = decay[t][:, :, None, :] if column else decay[t][:, :, None, None]
        write = kt[..., :, None] * delta[..., None, :]
        if beta is not None:
            write = beta[t][:, :, None, None] * write
        P = a * S + write
        S = torch.tanh(P) if step == "tanh" else P
        outs.append(torch.einsum("bhij,bhi->bhj", S, qt))
    return torch.stack(outs), S


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / (||x||_2 + eps) over the last dimension: the one L2 normalisation of E75 and E88 (the
    kernels take q and k already normalised by it)."""
    return x / (x.norm(dim=-1, keepdim=True) + eps)
