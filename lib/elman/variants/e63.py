"""E63 a/b/c/d, the nonlinear delta. Chapter: book/chapters/e63_nonlinear_delta.ipynb.

    x_t = silu(W_in y_t)                                                      (Template P)
    v_t = tanh(W_h h_{t-1} + W_x x_t + b)               the candidate reads the state
    63a:  alpha_t = sigmoid(W_alpha x_t + b_alpha),     h_t = alpha_t h_{t-1} + (1 - alpha_t) v_t
    63b:  + beta_t = sigmoid(W_beta x_t + b_beta),      h_t = alpha_t h_{t-1} + beta_t v_t
    63c:  63b with alpha_t = sigmoid(W_alpha x_t + U_alpha h_{t-1} + b_alpha),
                   beta_t  = sigmoid(W_beta x_t + U_beta h_{t-1} + b_beta)
    63d:  h_t = h_{t-1} + alpha_t v_t                   (additive, b_alpha = 0)
    c_t = h_t * silu(h_t),  output W_out c_t

Initialisation: W_x, W_alpha, W_beta Xavier; W_h orthogonal x 0.5 (63d: x 0.3); U_alpha,
U_beta orthogonal; b = 0, b_beta = 0, b_alpha = 2 (sigmoid(2) = 0.88: keep the state by
default; 63d: 0). No spectral normalisation (the specification lists no radius for E63).

The CUDA cell is the dense family's nonlinear-delta op (families/dense/delta.py): the input
side [W_x; W_alpha; (W_beta)] x + biases is one GEMM for all steps; the recurrence runs on the
dense family's persistent kernels for 63a, 63b, 63d in bf16 at the sizes the family's
predicate takes (families/dense/op.persistent_size) and otherwise per step: one GEMM with
[W_h; (U_alpha; U_beta)] and one fused elementwise kernel (graph and steps paths; every size,
fp32 and bf16). 63c has no persistent path (delta.NO_PERSISTENT_63C says why).
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from ..core import validate
from ..core.entry import ParityCase, Tolerance
from ..core.layer import RecurrentLayer, check_backend
from ..families.dense import delta, inputs

W_H_SCALE = {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.3}
B_ALPHA = {"a": 2.0, "b": 2.0, "c": 2.0, "d": 0.0}


def delta_reference(mode, x, w_x, w_h, b, w_a, b_a, w_b=None, b_b=None, u_a=None, u_b=None,
                    h0=None):
    """The definition of every mode: a sequential loop over time-major [T, B, D] tensors."""
    delta.check_mode(mode)
    h = x.new_zeros(x.shape[1:]) if h0 is None else h0
    outs = []
    for t in range(x.shape[0]):
        v = torch.tanh(h @ w_h.t() + x[t] @ w_x.t() + b)
        alpha = torch.sigmoid(x[t] @ w_a.t() + b_a + (h @ u_a.t() if mode == "c" else 0))
        if mode == "a":
            h = alpha * h + (1 - alpha) * v
        elif mode == "d":
            h = h + alpha * v
        else:
            beta = torch.sigmoid(x[t] @ w_b.t() + b_b + (h @ u_b.t() if mode == "c" else 0))
            h = alpha * h + beta * v
        outs.append(h * F.silu(h))
    return torch.stack(outs), h


def reference(x, w_x, w_h, b, w_a, b_a, h0=None):
    """E63a (complementary): h = alpha h + (1 - alpha) tanh(W_h h + W_x x + b)."""
    return delta_reference("a", x, w_x, w_h, b, w_a, b_a, h0=h0)


def reference_b(x, w_x, w_h, b, w_a, b_a, w_b, b_b, h0=None):
    """E63b (independent write gate): h = alpha h + beta v."""
    return delta_reference("b", x, w_x, w_h, b, w_a, b_a, w_b, b_b, h0=h0)


def reference_c(x, w_x, w_h, b, w_a, b_a, w_b, b_b, u_a, u_b, h0=None):
    """E63c: E63b with state-dependent gates (U_alpha h, U_beta h)."""
    return delta_reference("c", x, w_x, w_h, b, w_a, b_a, w_b, b_b, u_a, u_b, h0=h0)


def reference_d(x, w_x, w_h, b, w_a, b_a, h0=None):
    """E63d (additive): h = h + alpha v."""
    return delta_reference("d", x, w_x, w_h, b, w_a, b_a, h0=h0)


def delta_cell(mode, x, w_x, w_h, b, w_a, b_a, w_b=None, b_b=None, u_a=None, u_b=None, h0=None,
               backend: str = "cuda", path: str = "auto"):
    """Any mode's cell on [T, B, D]: returns (c [T, B, D], h_T [B, D]). The CUDA backend stacks
    the input weights for one GEMM over all T*B rows and the recurrent ones into W_rec."""
    check_backend(backend)
    if backend == "reference":
        return delta_reference(mode, x, w_x, w_h, b, w_a, b_a, w_b, b_b, u_a, u_b, h0)
    delta.check_mode(mode)
    delta.check_path(path, mode)
    three = delta.CHANNELS[mode] == 3
    named = {"x": x, "W_x": w_x, "W_h": w_h, "b": b, "W_alpha": w_a, "b_alpha": b_a, "h0": h0}
    named.update({"W_beta": w_b, "b_beta": b_b} if three else {})
    named.update({"U_alpha": u_a, "U_beta": u_b} if mode == "c" else {})
    T, B, D = validate.sequence("x", x)
    square = {n: (t, (D, D)) for n, t in named.items() if n[0] in "WU"}
    validate.shapes({**square, **{n: (t, (D,)) for n, t in named.items() if n[0] == "b"},
                     "h0": (h0, (B, D))})
    validate.dtypes(named, delta.DTYPES)
    validate.devices(named)
    w_in = torch.cat([w_x, w_a] + ([w_b] if three else []))
    b_in = torch.cat([b, b_a] + ([b_b] if three else []))
    w_rec = torch.cat([w_h, u_a, u_b]) if mode == "c" else w_h
    pre = torch.addmm(b_in, x.reshape(T * B, D), w_in.t()).view(T, B, -1)
    return delta.cell(mode, pre, w_rec, h0, path)


def cell(x, w_x, w_h, b, w_a, b_a, h0=None, backend: str = "cuda", path: str = "auto"):
    """E63a's cell."""
    return delta_cell("a", x, w_x, w_h, b, w_a, b_a, h0=h0, backend=backend, path=path)


def cell_b(x, w_x, w_h, b, w_a, b_a, w_b, b_b, h0=None, backend: str = "cuda", path: str = "auto"):
    """E63b's cell."""
    return delta_cell("b", x, w_x, w_h, b, w_a, b_a, w_b, b_b, h0=h0, backend=backend, path=path)


def cell_c(x, w_x, w_h, b, w_a, b_a, w_b, b_b, u_a, u_b, h0=None, backend: str = "cuda",
           path: str = "auto"):
    """E63c's cell."""
    return delta_cell("c", x, w_x, w_h, b, w_a, b_a, w_b, b_b, u_a, u_b, h0=h0, backend=backend,
                      path=path)


def cell_d(x, w_x, w_h, b, w_a, b_a, h0=None, backend: str = "cuda", path: str = "auto"):
    """E63d's cell."""
    return delta_cell("d", x, w_x, w_h, b, w_a, b_a, h0=h0, backend=backend, path=path)


def flow_references() -> dict:
    """References for the chapter's gradient-flow measurement, on the dense family's inputs
    (`compare.gradient_flow`): each mode with its layer's initial gate bias added to the drawn
    b_alpha (sigmoid(2) = 0.88 keeps the state in a, b, c), and the ablation of E63a without
    the state in the candidate (v = tanh(W_x x + b): a gated blend whose only path through time
    is alpha, E61's shape with a tanh candidate)."""
    def shifted(mode):
        def ref(x, w_x, w_h, b, w_a, b_a, w_b=None, b_b=None, u_a=None, u_b=None, h0=None):
            return delta_reference(mode, x, w_x, w_h, b, w_a, b_a + B_ALPHA[mode], w_b, b_b, u_a, u_b, h0)
        names = {"a": reference, "b": reference_b, "c": reference_c, "d": reference_d}
        ref.__signature__ = inspect.signature(names[mode])
        return ref

    def without_state(x, w_x, b, w_a, b_a, h0=None):
        return delta_reference("a", x, w_x, torch.zeros_like(w_x), b, w_a, b_a + B_ALPHA["a"], h0=h0)
    return {**{f"E63{'' if m == 'a' else m}": shifted(m) for m in "abcd"},
            "E63a without W_h h": without_state}


class E63(RecurrentLayer):
    """E63 layer on Template P: `forward(y [B, T, d], h0=None) -> (out, h_T [B, D])`. Its
    cell parameters: W_x, W_h, b, W_alpha, b_alpha (63b/63c: W_beta, b_beta; 63c: U_alpha,
    U_beta). The subclasses E63b, E63c, E63d set `mode`."""

    template, paths = "P", delta.PATHS
    mode = "a"

    def build(self, D: int):
        mode = self.mode
        self.w_x = nn.Parameter(torch.empty(D, D))
        self.w_h = nn.Parameter(torch.empty(D, D))
        nn.init.orthogonal_(self.w_h)
        with torch.no_grad():
            self.w_h.mul_(W_H_SCALE[mode])
        self.b = nn.Parameter(torch.zeros(D))
        self.w_a = nn.Parameter(torch.empty(D, D))
        self.b_a = nn.Parameter(torch.full((D,), B_ALPHA[mode]))
        xavier = [self.w_x, self.w_a]
        if delta.CHANNELS[mode] == 3:
            self.w_b = nn.Parameter(torch.empty(D, D))
            self.b_b = nn.Parameter(torch.zeros(D))
            xavier.append(self.w_b)
        if mode == "c":
            self.u_a = nn.Parameter(torch.empty(D, D))
            self.u_b = nn.Parameter(torch.empty(D, D))
            nn.init.orthogonal_(self.u_a)
            nn.init.orthogonal_(self.u_b)
        return tuple(xavier)

    def weights(self, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        """The cell's weights in the compute dtype, in the order of the mode's reference."""
        names = ["w_x", "w_h", "b", "w_a", "b_a"]
        if delta.CHANNELS[self.mode] == 3:
            names += ["w_b", "b_b"]
        if self.mode == "c":
            names += ["u_a", "u_b"]
        return tuple(getattr(self, n).to(dt) for n in names)

    def cell(self, x, z, h0):
        ws = dict(zip(("w_x", "w_h", "b", "w_a", "b_a", "w_b", "b_b", "u_a", "u_b"),
                      self.weights(x.dtype)))
        return delta_cell(self.mode, x, **ws, h0=h0, backend=self.backend, path=self.path)


class E63b(E63):
    mode = "b"


class E63c(E63):
    mode = "c"


class E63d(E63):
    mode = "d"


def layer_params(dim: int, expansion: float = 1.0, mode: str = "a") -> int:
    """P_layer: W_in and W_out (2 d D); W_x, W_h, W_alpha (3 D^2); b, b_alpha (2 D); 63b/63c
    add W_beta and b_beta (D^2 + D); 63c adds U_alpha and U_beta (2 D^2)."""
    D = int(dim * expansion)
    three = delta.CHANNELS[mode] == 3
    return 2 * dim * D + (3 + three + 2 * (mode == "c")) * D * D + (2 + three) * D


def _parity(reference, cell, mode):
    def cases(shape, dtype, device, generator):
        kw = inputs.reference_inputs(reference, shape, device, generator)
        return [ParityCase(kw, lambda p=p, **a: cell(**a, backend="cuda", path=p), reference,
                                  ("out", "h_T"), "cuda:" + p)
                for p in delta.paths(mode, shape.B, shape.D, dtype)]
    return cases


_TITLE = "Nonlinear delta: gated blend of h and tanh(W_h h + W_x x + b), output h * silu(h)"
_CHAPTER = "book/chapters/e63_nonlinear_delta.ipynb"

# E63d's state is a running sum that no gate contracts, and its gradients grow backwards through
# time (chapter, gradient flow): exact arithmetic on the bf16-rounded parity inputs already
# differs from the fp64 result by more than the family's bf16 tolerance at T = 64
# (tests/test_e63.py measures it), so its bf16 tolerance is wider.
TOLERANCE_63D = {"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(2e-2, 8e-2)}

ENTRIES = tuple(
    inputs.entry(name=name, aliases=aliases, layer=layer, reference=ref, cell=fn, epilogue=None,
                 title=f"{_TITLE} ({note})", chapter=_CHAPTER, cuda_op="elman_dense.forward/backward (delta_* epilogues) or delta_forward/backward",
                 layer_params=lambda dim, expansion=1.0, m=mode: layer_params(dim, expansion, m),
                 parity=_parity(ref, fn, mode), **({"tolerance": TOLERANCE_63D} if mode == "d" else {}))
    for name, aliases, layer, ref, fn, mode, note in (
        ("E63", ("63", "63a", "E63a"), E63, reference, cell, "a", "complementary gates"),
        ("E63b", ("63b",), E63b, reference_b, cell_b, "b", "independent write gate"),
        ("E63c", ("63c",), E63c, reference_c, cell_c, "c", "h-dependent gates"),
        ("E63d", ("63d",), E63d, reference_d, cell_d, "d", "additive"),
    ))
