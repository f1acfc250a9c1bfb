"""The matrix family's gated recurrence: the core of E70-E73, E73cp, E74's simple and ema rules
and E14, as plain sequential PyTorch (the definition the `gated_*` kernels implement).

Per head the state S is n x v, key-first (S[i, j], i over the n keys, j over the v values).
Per step, from q_t, k_t [n], v_t [v], a column coefficient c_t [v], an optional row modulation
m_t [n], optional column parameters e_t, f_t [v] and an optional column erase x_t [v]:

    r = S^T k                          (r_j = sum_i S[i, j] k_i: retrieval with the old state)
    (a, w) = rule(c, v, r, e, f)       (a column multiplier a [v] and a column write w [v])
    P = (m a^T - k x^T) * S + k w^T    (m = 1 without a row modulation, x = 0 without an erase)
    S = act(P)                         (tanh, or the identity for a linear state)
    o = S^T q

The rules (RULES order is the kernels' rule id):
    decay           a = c,                        w = v
    ema             a = c,                        w = (1 - c) v
    retain          alpha = sigmoid(c + e r),     a = alpha,  w = (1 - alpha) v
    value_gate      g = sigmoid(e r + f),         a = c,      w = (1 - c) g v
    value_gate_abs  g = sigmoid(-e |r| + f),      a = c,      w = (1 - c) g v
    write_gate      a = c,                        w = f v
"""
from __future__ import annotations

import torch

from .reference import STEPS

RULES = ("decay", "ema", "retain", "value_gate", "value_gate_abs", "write_gate")
NEEDS = {"decay": (), "ema": (), "retain": ("e",), "value_gate": ("e", "f"), "value_gate_abs": ("e", "f"),
         "write_gate": ("f",)}


def rule_forward(rule: str, c, v, r, e=None, f=None):
    """(a, w) of one step's columns."""
    if rule == "decay":
        return c, v
    if rule == "ema":
        return c, (1 - c) * v
    if rule == "retain":
        alpha = torch.sigmoid(c + e * r)
        return alpha, (1 - alpha) * v
    if rule == "value_gate":
        return c, (1 - c) * torch.sigmoid(e * r + f) * v
    if rule == "value_gate_abs":
        return c, (1 - c) * torch.sigmoid(-e * r.abs() + f) * v
    if rule == "write_gate":
        return c, f * v
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def rule_backward(rule: str, c, v, r, e, f, da, dw):
    """The hand-derived gradient of `rule_forward`: (dc, dv, dr, de or None, df or None)."""
    zero = torch.zeros_like(r)
    if rule == "decay":
        return da, dw, zero, None, None
    if rule == "ema":
        return da - v * dw, (1 - c) * dw, zero, None, None
    if rule == "write_gate":
        return da, f * dw, zero, None, v * dw
    if rule == "retain":
        alpha = torch.sigmoid(c + e * r)
        ds = (da - v * dw) * alpha * (1 - alpha)
        return ds, (1 - alpha) * dw, ds * e, ds * r, None
    absolute = rule == "value_gate_abs"
    g = torch.sigmoid((-e * r.abs() if absolute else e * r) + f)
    ds = (1 - c) * v * dw * g * (1 - g)
    dc = da - g * v * dw
    dv = (1 - c) * g * dw
    if absolute:
        return dc, dv, -ds * e * torch.sign(r), -ds * r.abs(), ds
    return dc, dv, ds * e, ds * r, ds


def _scale(a, m, k, x):
    """m a^T - k x^T [.., n, v] (without m: 1 a^T; without x: no erase)."""
    scale = a[..., None, :] if m is None else m[..., :, None] * a[..., None, :]
    return scale if x is None else scale - k[..., :, None] * x[..., None, :]


def _step(S, k, v, c, m, e, f, rule, step, x=None):
    r = torch.einsum("bhij,bhi->bhj", S, k)
    a, w = rule_forward(rule, c, v, r, e, f)
    P = _scale(a, m, k, x) * S + k[..., :, None] * w[..., None, :]
    return torch.tanh(P) if step == "tanh" else P


def _at(x, t):
    return None if x is None else x[t]


def recurrence(q, k, v, c, h0, rule: str, step: str = "tanh", m=None, e=None, f=None, x=None):
    """q, k [T, B, H, n], v, c [T, B, H, v], m [T, B, H, n] or None, e, f, x [T, B, H, v] or None,
    h0 [B, H, n, v] -> (o [T, B, H, v], S_T [B, H, n, v])."""
    check_rule(rule, step, e, f)
    S, outs = h0, []
    for t in range(k.shape[0]):
        S = _step(S, k[t], v[t], c[t], _at(m, t), _at(e, t), _at(f, t), rule, step, _at(x, t))
        outs.append(torch.einsum("bhij,bhi->bhj", S, q[t]))
    return torch.stack(outs), S


def check_rule(rule: str, step: str, e, f) -> None:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    given = {"e": e is not None, "f": f is not None}
    for name in ("e", "f"):
        if given[name] != (name in NEEDS[rule]):
            raise ValueError(f"rule {rule!r} takes {', '.join(NEEDS[rule]) or 'neither e nor f'}; "
                             f"{name} was {'given' if given[name] else 'missing'}")


def schedule_forward(q, k, v, c, h0, rule: str, step: str, m=None, e=None, f=None, K: int = 16, x=None):
    """The kernels' forward schedule: (o, S_T, ckpt [ceil(T / K), B, H, n, v]); checkpoint c
    holds the state before step c K."""
    S, outs, ckpt = h0, [], []
    for t in range(k.shape[0]):
        if t % K == 0:
            ckpt.append(S)
        S = _step(S, k[t], v[t], c[t], _at(m, t), _at(e, t), _at(f, t), rule, step, _at(x, t))
        outs.append(torch.einsum("bhij,bhi->bhj", S, q[t]))
    return torch.stack(outs), S, torch.stack(ckpt)


def schedule_backward(q, k, v, c, ckpt, d_o, d_ST, rule: str, step: str, m=None, e=None, f=None,
                      K: int = 16, x=None):
    """The kernels' backward: chunks in reverse, each replayed from its checkpoint, then per step
    (dS: gradient of S_t; dP = dS act'(S_t); M = m a^T - k x^T):
        dS += q do^T;  dq = S_t do
        da = sum_i dP m S_{t-1};  dw = dP^T k;  (dc, dv, dr, de, df) = rule_backward(da, dw)
        dx = -sum_i dP k S_{t-1}
        dk = dP w + S_{t-1} dr - sum_j dP x S_{t-1};  dm = sum_j dP a S_{t-1}
        dS_{t-1} = M * dP + k dr^T
    Returns (dq, dk, dv, dc, dm, de, df, dh0, dx) (None for absent inputs)."""
    T = k.shape[0]
    dq, dk, dv, dc = (torch.zeros_like(x) for x in (q, k, v, c))
    dm, de, df, dx = (None if t is None else torch.zeros_like(t) for t in (m, e, f, x))
    dS = d_ST.clone()
    for chunk in reversed(range(ckpt.shape[0])):
        start, end = chunk * K, min(T, (chunk + 1) * K)
        states = [ckpt[chunk]]
        for t in range(start, end):
            states.append(_step(states[-1], k[t], v[t], c[t], _at(m, t), _at(e, t), _at(f, t), rule, step,
                                _at(x, t)))
        for t in reversed(range(start, end)):
            S_new, S_old = states[t - start + 1], states[t - start]
            dS = dS + q[t][..., :, None] * d_o[t][..., None, :]
            dq[t] = torch.einsum("bhij,bhj->bhi", S_new, d_o[t])
            dP = dS * (1 - S_new * S_new) if step == "tanh" else dS
            r = torch.einsum("bhij,bhi->bhj", S_old, k[t])
            a, w = rule_forward(rule, c[t], v[t], r, _at(e, t), _at(f, t))
            mt = torch.ones_like(k[t]) if m is None else m[t]
            da = torch.einsum("bhij,bhi,bhij->bhj", dP, mt, S_old)
            dw = torch.einsum("bhij,bhi->bhj", dP, k[t])
            dc[t], dv[t], dr, de_t, df_t = rule_backward(rule, c[t], v[t], r, _at(e, t), _at(f, t), da, dw)
            if de is not None:
                de[t] = de_t
            if df is not None:
                df[t] = df_t
            dk[t] = torch.einsum("bhij,bhj->bhi", dP, w) + torch.einsum("bhij,bhj->bhi", S_old, dr)
            if dm is not None:
                dm[t] = torch.einsum("bhij,bhj,bhij->bhi", dP, a, S_old)
            if dx is not None:
                dx[t] = -torch.einsum("bhij,bhi,bhij->bhj", dP, k[t], S_old)
                dk[t] = dk[t] - torch.einsum("bhij,bhj,bhij->bhi", dP, x[t], S_old)
            dS = _scale(a, _at(m, t), k[t], _at(x, t)) * dP + k[t][..., :, None] * dr[..., None, :]
    return dq, dk, dv, dc, dm, de, df, dS, dx
