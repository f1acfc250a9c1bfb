"""E74, the delta-rule ablations over E73: a full n x n or a diagonal n-vector state, six update
rules, four projection sets, tanh or linear state, output or input gate. Chapter:
book/chapters/e74_delta_ablations.ipynb.

Template P front end (x = silu(W_in y)); k_hat = k / (||k|| + 1e-6); value-first state S [n, n]
(row i over values, column j over keys); f = tanh (nonlin 'tanh') or the identity ('linear'):

    delta           S = f(S + (v - S kz) k_hat^T)      kz = k_hat, or z * k_hat with proj 'full'
    simple          S = f(sigmoid(a) S + v k_hat^T)                 (a: one learned scalar)
    ema             S = f(alpha S + (1 - alpha) v k_hat^T)          alpha = sigmoid(W_a x + b_a)
    residual        S = f(S + rho * tanh((v - S k_hat) k_hat^T))    (rho per value row)
    ntm             S = f(S * (1 - e k_hat^T) + (w * v) k_hat^T)    e, w = sigmoid(W_e,w x + b_e,w)
    retrieved_gate  d = v - S k_hat,  g = sigmoid(W_g x + b_g + mean(d^2)),  S = f(S + (d * g) k_hat^T)

Diagonal state s [n]: delta s = f(s (1 - k_hat^2) + v k_hat); simple s = f(sigmoid(a) s + v k_hat)
(a per dimension); ema s = f(alpha s + (1 - alpha) v k_hat); o = s * q.

Output o = S q (q raw), c = o * silu(o) (gate 'output') or o * silu(W_zg x + b_zg) (gate 'input');
out = W_out c. Projections: tied_kvq (k = v = q = W x), tied_kq (q = k, the raw k), no_z (k, v, q),
full (k, v, q and z = W_z x + b_z, used only in the delta retrieval).

Kernels: full-state delta without z runs on the matrix family's delta-rule op (decay 1, no write
gate); simple, ema and ntm on the gated op (rules 'decay', 'ema', 'write_gate' with the erase); the
diagonal state (delta, simple, ema) on the diagonal op. Residual, retrieved_gate and the delta rule
with proj 'full' have no kernel: backend 'cuda' raises a ValueError naming the option, backend
'reference' runs them.
"""
from __future__ import annotations

import inspect
import re

import torch
import torch.nn.functional as F
from torch import nn

from ..core.entry import Entry, shapes
from ..families.matrix import diagonal_op, gated_op, op as matrix
from ..families.matrix.inputs import TOLERANCE
from ..families.matrix.single import (SingleStateLayer, check_cell_backend, entry, head, normalized,
                                      per_head, unhead, with_inputs, xavier)

STATES = ("full", "diagonal")
UPDATES = ("delta", "simple", "ema", "residual", "ntm", "retrieved_gate")
DIAGONAL_UPDATES = ("delta", "simple", "ema")
PROJECTIONS = ("tied_kvq", "tied_kq", "no_z", "full")
NONLINS = ("tanh", "linear")
GATES = ("output", "input")

# the per-step and per-head inputs of each rule's reference (besides q, k, v, h0)
_EXTRA = {"delta": {}, "simple": {"retain": "scalar"}, "ema": {"alpha": "open"},
          "residual": {"rho": "param"}, "ntm": {"erase": "open_n", "write": "open"},
          "retrieved_gate": {"gate_x": "pre"}}


def has_kernel(state: str, update: str, proj: str) -> bool:
    return state == "diagonal" or update in ("simple", "ema", "ntm") or (update == "delta" and proj != "full")


def _f(P, nonlin):
    return torch.tanh(P) if nonlin == "tanh" else P


def _outer(a, b):
    return a[..., :, None] * b[..., None, :]


def _full_step(S, k, v, t, update, nonlin, z=None, retain=None, alpha=None, rho=None, erase=None,
               write=None, gate_x=None):
    r = torch.einsum("bhij,bhj->bhi", S, k if z is None else z[t] * k)
    if update == "delta":
        return _f(S + _outer(v - r, k), nonlin)
    if update == "simple":
        return _f(retain[:, None, None] * S + _outer(v, k), nonlin)
    if update == "ema":
        return _f(alpha[t][..., :, None] * S + _outer((1 - alpha[t]) * v, k), nonlin)
    if update == "residual":
        return _f(S + rho[..., :, None] * torch.tanh(_outer(v - r, k)), nonlin)
    if update == "ntm":
        return _f(S * (1 - _outer(erase[t], k)) + _outer(write[t] * v, k), nonlin)
    d = v - r
    g = torch.sigmoid(gate_x[t] + (d * d).mean(-1, keepdim=True))
    return _f(S + _outer(d * g, k), nonlin)


def _diag_step(s, k, v, t, update, nonlin, retain=None, alpha=None):
    if update == "delta":
        return _f(s * (1 - k * k) + v * k, nonlin)
    if update == "simple":
        return _f(retain * s + v * k, nonlin)
    return _f(alpha[t] * s + (1 - alpha[t]) * v * k, nonlin)


def check_options(state, update, proj, nonlin, gate) -> None:
    for name, value, allowed in (("state", state, STATES), ("update", update, UPDATES),
                                 ("proj", proj, PROJECTIONS), ("nonlin", nonlin, NONLINS),
                                 ("gate", gate, GATES)):
        if value not in allowed:
            raise ValueError(f"E74 {name} must be one of {allowed}, got {value!r}")
    if state == "diagonal" and update not in DIAGONAL_UPDATES:
        raise ValueError(f"E74 update {update!r} is defined for the full state only; the diagonal "
                         f"state takes {DIAGONAL_UPDATES}")


def make_reference(state: str = "full", update: str = "delta", proj: str = "no_z", nonlin: str = "tanh"):
    """The core of one combination: (q, k_hat, v, [rule inputs], h0) -> (o, S_T). q, k_hat, v
    [T, B, H, n]; h0 [B, H, n, n] (full, value-first) or [B, H, n] (diagonal); 'retain' is sigmoid(a)
    ([H] full, [H, n] diagonal); 'alpha', 'erase', 'write' are the sigmoid gates [T, B, H, n];
    'rho' [H, n]; 'gate_x' = W_g x + b_g [T, B, H, n]; 'z' = W_z x + b_z [T, B, H, n] (proj 'full',
    delta)."""
    check_options(state, update, proj, nonlin, "output")
    spec = {"q": "key", "k": "unit", "v": "value", **_EXTRA[update]}
    if state == "diagonal":
        spec = {**spec, "retain": "param"} if update == "simple" else spec
        spec["h0"] = "diag_state"
    else:
        if update == "delta" and proj == "full":
            spec["z"] = "mod"
        spec["h0"] = "state"
    names = tuple(n for n in spec if n not in ("q", "k", "v", "h0"))

    @with_inputs(spec)
    def core(**a):
        S, q, k, v = a["h0"], a["q"], a["k"], a["v"]
        rule = {n: a[n] for n in names}
        outs = []
        for t in range(k.shape[0]):
            if state == "diagonal":
                S = _diag_step(S, k[t], v[t], t, update, nonlin, **rule)
                outs.append(S * q[t])
            else:
                S = _full_step(S, k[t], v[t], t, update, nonlin, **rule)
                outs.append(torch.einsum("bhij,bhj->bhi", S, q[t]))
        return torch.stack(outs), S

    core.__signature__ = _signature(tuple(spec))
    core.__name__ = f"reference_{state}_{update}_{proj}_{nonlin}"
    core.__doc__ = make_reference.__doc__
    return core


def _signature(names):
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


reference = make_reference()


def cell(inputs: dict, state: str, update: str, proj: str, nonlin: str, backend: str = "cuda",
         checkpoint: int = gated_op.CHECKPOINT):
    """The core of one combination on `backend`; `inputs` as `make_reference(...)` takes them."""
    check_cell_backend(backend)
    if backend == "reference":
        return make_reference(state, update, proj, nonlin)(**inputs)
    if not has_kernel(state, update, proj):
        what = f"update={update!r}" if update != "delta" else f"proj={proj!r} (z in the delta retrieval)"
        raise ValueError(f"E74 has no CUDA kernel for {what}; use backend='reference'")
    if state == "diagonal":
        v = inputs["v"]
        c = (inputs["alpha"] if update == "ema" else per_head("retain", inputs["retain"], v, columns=True)
             if update == "simple" else torch.ones_like(v, dtype=inputs["h0"].dtype))
        return diagonal_op.recurrence(inputs["q"], inputs["k"], v, c, inputs["h0"], update, nonlin,
                                      engine=backend)
    q, k, v, h0 = inputs["q"], inputs["k"], inputs["v"], inputs["h0"].transpose(-1, -2)
    if update == "delta":
        if backend == "schedule":
            raise ValueError("the delta-rule op's schedule is tested in test_matrix.py; use backend 'cuda' or 'reference'")
        ones = torch.ones(k.shape[:3], dtype=h0.dtype, device=k.device)
        o, S = matrix.recurrence(q, k, v, ones, None, h0, nonlin, checkpoint)
    elif update == "simple":
        c = per_head("retain", inputs["retain"], v, columns=False)
        o, S = gated_op.recurrence(q, k, v, c, h0, "decay", nonlin, K=checkpoint, engine=backend)
    elif update == "ema":
        o, S = gated_op.recurrence(q, k, v, inputs["alpha"], h0, "ema", nonlin, K=checkpoint, engine=backend)
    else:  # ntm: S * (1 - e k^T) + (w v) k^T is, on S^T, the erase x = e and the write gate f = w
        o, S = gated_op.recurrence(q, k, v, torch.ones_like(v, dtype=h0.dtype), h0, "write_gate", nonlin,
                                   f=inputs["write"], x=inputs["erase"], K=checkpoint, engine=backend)
    return o, S.transpose(-1, -2)


class E74(SingleStateLayer):
    """One E74 combination (`state`, `update`, `proj`, `nonlin`, `gate`)."""

    name = "E74"

    def build(self, D: int, state: str = "full", update: str = "delta", proj: str = "no_z",
              nonlin: str = "tanh", gate: str = "output") -> None:
        check_options(state, update, proj, nonlin, gate)
        n = self.n
        self.state, self.update, self.proj, self.nonlin, self.gate = state, update, proj, nonlin, gate
        count = {"tied_kvq": 1, "tied_kq": 2, "no_z": 3, "full": 4}[proj]
        self.w_proj = nn.ParameterList([xavier(n, D) for _ in range(count)])
        self.b_z = nn.Parameter(torch.ones(n)) if proj == "full" else None
        if update == "simple":
            self.a = nn.Parameter(torch.zeros(()) if state == "full" else torch.full((n,), -0.1))
        gates = {"ema": ("alpha",), "ntm": ("erase", "write"), "retrieved_gate": ("gate",)}.get(update, ())
        self.w_gates = nn.ParameterList([xavier(n, D) for _ in gates])
        self.b_gates = nn.ParameterList([nn.Parameter(torch.full((n,), 2.0 if update == "ema" else 0.0))
                                         for _ in gates])
        if update == "residual":
            self.rho = nn.Parameter(torch.full((n,), 0.1))
        if gate == "input":
            self.w_zg, self.b_zg = xavier(n, D), nn.Parameter(torch.zeros(n))

    def state_shape(self, B: int) -> tuple[int, ...]:
        return (B, self.n) if self.state == "diagonal" else (B, self.n, self.n)

    def cell(self, x, S0):
        acc = S0.dtype
        proj = [self.project(x, w) for w in self.w_proj]
        if self.proj == "tied_kvq":
            k = v = q = proj[0]
        elif self.proj == "tied_kq":
            k, v = proj
            q = k
        else:
            k, v, q = proj[:3]
        k_hat = normalized(k.to(acc)).to(k.dtype)
        a = {"q": head(q), "k": head(k_hat), "v": head(v), "h0": S0.unsqueeze(1)}
        xa = x.to(acc)
        gates = [xa @ w.to(acc).t() + b.to(acc) for w, b in zip(self.w_gates, self.b_gates)]
        if self.update == "simple":
            a["retain"] = torch.sigmoid(self.a.to(acc)).reshape(1, *self.a.shape)
        elif self.update == "ema":
            a["alpha"] = head(torch.sigmoid(gates[0]))
        elif self.update == "ntm":
            a["erase"], a["write"] = (head(torch.sigmoid(g)) for g in gates)
        elif self.update == "retrieved_gate":
            a["gate_x"] = head(gates[0])
        elif self.update == "residual":
            a["rho"] = self.rho.to(acc)[None]
        if self.update == "delta" and self.proj == "full" and self.state == "full":
            a["z"] = head(xa @ self.w_proj[3].to(acc).t() + self.b_z.to(acc))
        o, S = cell(a, self.state, self.update, self.proj, self.nonlin, self.backend)
        o = unhead(o).to(x.dtype)
        g = o if self.gate == "output" else (xa @ self.w_zg.to(acc).t() + self.b_zg.to(acc)).to(x.dtype)
        return o * F.silu(g), S.squeeze(1)


def params(dim: int, expansion: float = 1.0, n_state: int = 32, state: str = "full",
           update: str = "delta", proj: str = "no_z", gate: str = "output", **_) -> int:
    """dD + nD per projection (+ n for b_z with proj 'full') + the rule's parameters (simple: 1
    full, n diagonal; ema, retrieved_gate: nD + n; ntm: 2nD + 2n; residual: n) + (nD + n for the
    input gate) + nd."""
    D, n = int(dim * expansion), n_state
    count = {"tied_kvq": 1, "tied_kq": 2, "no_z": 3, "full": 4}[proj]
    rule = {"delta": 0, "simple": 1 if state == "full" else n, "ema": n * D + n, "residual": n,
            "ntm": 2 * n * D + 2 * n, "retrieved_gate": n * D + n}[update]
    return (dim * D + count * n * D + (n if proj == "full" else 0) + rule
            + (n * D + n if gate == "input" else 0) + n * dim)


def _core_cell(state, update, proj, nonlin):
    return lambda **a: cell(a, state, update, proj, nonlin)


def _layer(opts: dict, expansion_default: float = 1.0):
    def layer(dim: int, expansion: float = expansion_default, **kw) -> E74:
        return E74(dim, expansion, **{**opts, **kw})
    return layer


# a sample of the axes with kernels, checked as layer cases of every E74 entry with a kernel
GRID = (
    dict(update="delta", proj="no_z", nonlin="tanh"), dict(update="delta", proj="tied_kq", nonlin="linear"),
    dict(update="delta", proj="tied_kvq", nonlin="tanh", gate="input"),
    dict(update="simple", proj="no_z", nonlin="tanh"), dict(update="simple", proj="tied_kq", nonlin="linear"),
    dict(update="ema", proj="no_z", nonlin="linear"), dict(update="ema", proj="full", nonlin="tanh", gate="input"),
    dict(state="diagonal", update="delta", proj="no_z", nonlin="tanh"),
    dict(update="ntm", proj="tied_kq", nonlin="tanh"),
    dict(state="diagonal", update="simple", proj="tied_kq", nonlin="linear", gate="input"),
)


def _grid_cases(shape):
    return [("-".join(f"{v}" for v in g.values()), _layer({"n_state": shape.n or 32, **g})) for g in GRID]


def _entry(name: str, opts: dict, aliases: tuple[str, ...] = (), grid: bool = False,
           expansion: float = 1.0) -> Entry:
    o = {"state": "full", "update": "delta", "proj": "no_z", "nonlin": "tanh", "gate": "output",
         "n_state": 32, **opts}
    n = o["n_state"]
    kernel = has_kernel(o["state"], o["update"], o["proj"])
    layer = _layer(o, expansion)
    fields = dict(
        name=name, aliases=aliases, layer=layer,
        reference=make_reference(o["state"], o["update"], o["proj"], o["nonlin"]),
        test_shapes=shapes((17, 2, 64, 1, n, n), (1, 1, 32, 1, n, n), (40, 1, 48, 2, 16, 16)),
        title=f"E74: {o['state']} state, {o['update']} update, {o['proj']} projections, "
              f"{o['nonlin']}, {o['gate']} gate",
        chapter="book/chapters/e74_delta_ablations.ipynb",
        layer_params=lambda dim, expansion=expansion: params(dim, expansion, **o))
    if not kernel:
        return Entry(family="matrix", kind="variant", tolerance=TOLERANCE, parity=None,
                     cuda_op=None, notes="reference only: no CUDA kernel for this combination", **fields)
    cases = _grid_cases if grid else (lambda shape: [("", _layer({**o, "n_state": shape.n or n}))])
    op = ("elman_matrix.diagonal_forward/diagonal_backward" if o["state"] == "diagonal"
          else "elman_matrix.forward/backward" if o["update"] == "delta"
          else "elman_matrix.gated_forward/gated_backward")
    return entry(cell=_core_cell(o["state"], o["update"], o["proj"], o["nonlin"]), layer_cases=cases,
                 cuda_op=op, **fields)


# the 74v2 levels take n from the trainer's n_state, whose default is 64
V2 = {name: dict(n_state=64, **opts) for name, opts in {
    "74v2": {}, "74v2-delta": {}, "74v2-residual": dict(update="residual"),
    "74v2-ntm": dict(update="ntm"), "74v2-retrieved_gate": dict(update="retrieved_gate"),
    "74v2-ema": dict(update="ema"), "74v2-delta-input": dict(gate="input"),
    "74v2-ema-input": dict(update="ema", gate="input")}.items()}
_PATTERN = re.compile(r"e74-(full|diag)-(tied_kvq|tied_kq|no_z|full)-n(\d+)"
                      r"(?:-(delta|simple|ema|residual|ntm|retrieved_gate))?(?:-(tanh|linear))?"
                      r"(?:-(output|input))?(-exp2)?", re.IGNORECASE)


def level_options(level: str) -> tuple[dict, float]:
    """(options, default expansion) of an 'E74v2*' or 'E74-{full|diag}-{proj}-n{N}[-update][-nonlin]
    [-gate][-exp2]' name."""
    key = level.lower().removeprefix("e")
    for name, opts in V2.items():
        if key == name:
            return dict(opts), 1.0
    m = _PATTERN.fullmatch(level if level.lower().startswith("e") else "e" + level)
    if m is None:
        raise ValueError(f"{level!r} is not an E74 level")
    st, proj, n, update, nonlin, gate, exp2 = m.groups()
    opts = dict(state="full" if st.lower() == "full" else "diagonal", proj=proj.lower(), n_state=int(n))
    opts.update({k: v.lower() for k, v in (("update", update), ("nonlin", nonlin), ("gate", gate)) if v})
    return opts, 2.0 if exp2 else 1.0


def entry_for(level: str) -> Entry | None:
    """The entry of any E74 level name (patterns included); None if `level` is not E74's."""
    try:
        opts, expansion = level_options(level)
    except ValueError:
        return None
    return _entry(level if level[0] in "eE" else "E" + level, opts, expansion=expansion)


def _registered():
    out = []
    for name, opts in V2.items():
        if has_kernel("full", opts.get("update", "delta"), "no_z"):
            out.append(_entry("E" + name, opts, (name,), grid=name == "74v2"))
    for proj in ("tied_kvq", "tied_kq", "no_z"):
        out.append(_entry(f"E74-full-{proj}-n32", dict(proj=proj)))
    for proj in ("tied_kvq", "tied_kq", "no_z"):
        out.append(_entry(f"E74-diag-{proj}-n32", dict(state="diagonal", proj=proj)))
    for update in ("simple", "ema"):
        out.append(_entry(f"E74-diag-no_z-n32-{update}", dict(state="diagonal", update=update)))
    return tuple(out)


ENTRIES = _registered()
