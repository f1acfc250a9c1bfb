"""What the single-state matrix variants (E70-E74) share: the Template P layer around one n x n
memory (x = silu(W_in y), a cell over x, out = W_out c), a spectrally normalised rectangular
projection (E70), the self-gate o * silu(o), and random core inputs for their references.

The layer's state is [B, n, n], value-first: S[i, j] with row i over values and column j over
keys, as the specification writes these variants (the kernels run its transpose, key-first).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...core.entry import Entry, ParityCase, Shape
from ...core.layer import CausalConv, autocast_dtype, check_backend, check_sequence, inner_width
from ...core.spectral import RecurrentWeight
from . import inputs
from .layer import check_parameters, remember_shapes
from .reference import l2_normalize

BACKENDS = ("cuda", "reference", "schedule")  # 'schedule': the CUDA op's schedule in PyTorch


def check_cell_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def self_gate(o: torch.Tensor) -> torch.Tensor:
    return o * F.silu(o)


class SpectralNormed(RecurrentWeight):
    """A rows x cols Xavier matrix returned as W * rho / sigma(W) (`RecurrentWeight`'s spectral
    normalisation: three power iterations on a persistent fp32 buffer u of length rows, gradient
    through W), or W itself when not `enabled`."""

    def __init__(self, rows: int, cols: int, radius: float, enabled: bool = True):
        super().__init__(1, "spectral_norm" if enabled else "none", radius)
        self.weight = nn.Parameter(torch.empty(rows, cols))
        nn.init.xavier_uniform_(self.weight)
        if enabled:
            self.register_buffer("u", F.normalize(torch.randn(rows, dtype=torch.float32), dim=0))


def xavier(rows: int, cols: int) -> nn.Parameter:
    w = nn.Parameter(torch.empty(rows, cols))
    nn.init.xavier_uniform_(w)
    return w


class SingleStateLayer(nn.Module):
    """`forward(y [B, T, dim], h0=None [B, n, n]) -> (out [B, T, dim], S_T [B, n, n])`.

    Subclasses create their projections in `build(D)` and implement
    `cell(x [T, B, D], S0 [B, n, n] (float32 or float64)) -> (c [T, B, n], S_T)`."""

    name = "matrix"

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda", n_state: int = 64,
                 use_conv: bool = False, d_conv: int = 4, **options):
        super().__init__()
        check_backend(backend)
        if not isinstance(n_state, int) or n_state < 1:
            raise ValueError(f"n_state must be a positive integer, got {n_state!r}")
        D = inner_width(dim, expansion)
        self.dim, self.D, self.n, self.backend = dim, D, n_state, backend
        self.w_in = xavier(D, dim)
        self.conv = CausalConv(D, d_conv) if use_conv else None
        self.build(D, **options)
        self.w_out = xavier(dim, self.out_width())
        remember_shapes(self)

    def build(self, D: int, **options) -> None:
        raise NotImplementedError

    def out_width(self) -> int:
        return self.n

    def state_shape(self, B: int) -> tuple[int, ...]:
        return (B, self.n, self.n)

    def cell(self, x: torch.Tensor, S0: torch.Tensor):
        raise NotImplementedError

    def project(self, x: torch.Tensor, w: torch.Tensor | nn.Module) -> torch.Tensor:
        weight = w() if isinstance(w, nn.Module) else w
        return x @ weight.to(x.dtype).t()

    def forward(self, y: torch.Tensor, h0: torch.Tensor | None = None):
        check_sequence(self.name, y, self.dim)
        check_parameters(self)
        B = y.shape[0]
        if h0 is not None and tuple(h0.shape) != self.state_shape(B):
            raise ValueError(f"h0 must be {list(self.state_shape(B))} [B, ...state], got {list(h0.shape)}")
        dt = autocast_dtype(y)
        a = y.transpose(0, 1).to(dt) @ self.w_in.to(dt).t()          # [T, B, D]
        x = F.silu(self.conv(a) if self.conv is not None else a)
        acc = torch.promote_types(dt, torch.float32)
        S0 = y.new_zeros(self.state_shape(B), dtype=acc) if h0 is None else h0.to(acc)
        c, S = self.cell(x, S0)
        return (c.to(dt) @ self.w_out.to(dt).t()).transpose(0, 1), S


def head(t: torch.Tensor) -> torch.Tensor:
    """[T, B, n] -> [T, B, 1, n] (the core references carry a head dimension)."""
    return t.unsqueeze(2)


def unhead(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(2)


def core_inputs(spec: dict[str, str], T: int, B: int, H: int, n: int, v: int, device,
                generator) -> dict[str, torch.Tensor]:
    """Fresh fp64 leaves by kind: 'unit' L2-normalised N(0, 1) [T, B, H, n]; 'key' N(0, 1)
    [T, B, H, n] / sqrt(n); 'value' N(0, 1) [T, B, H, v]; 'open' U(0.5, 1) [T, B, H, v];
    'open_n' U(0.5, 1) [T, B, H, n]; 'pre' N(0, 1) [T, B, H, v]; 'mod' U(-1, 1) [T, B, H, n];
    'param' U(-0.5, 0.5) [H, v]; 'scalar' U(0.5, 0.95) [H] rounded to bf16; 'state' U(-0.5, 0.5) [B, H, v, n];
    'diag_state' U(-0.5, 0.5) [B, H, n]."""
    kw = dict(device=device, dtype=torch.float64, generator=generator)
    make = {
        "unit": lambda: l2_normalize(torch.randn(T, B, H, n, **kw)),
        "key": lambda: torch.randn(T, B, H, n, **kw) / n ** 0.5,
        "value": lambda: torch.randn(T, B, H, v, **kw),
        "open": lambda: 0.5 + 0.5 * torch.rand(T, B, H, v, **kw),
        "open_n": lambda: 0.5 + 0.5 * torch.rand(T, B, H, n, **kw),
        "pre": lambda: torch.randn(T, B, H, v, **kw),
        "mod": lambda: 2 * torch.rand(T, B, H, n, **kw) - 1,
        "param": lambda: torch.rand(H, v, **kw) - 0.5,
        # on the bf16 grid: one decay shared by every step would otherwise carry its bf16 rounding
        # T times into the comparison (a property of the input cast, not of a kernel)
        "scalar": lambda: (0.5 + 0.45 * torch.rand(H, **kw)).to(torch.bfloat16).to(torch.float64),
        "state": lambda: torch.rand(B, H, v, n, **kw) - 0.5,
        "diag_state": lambda: torch.rand(B, H, n, **kw) - 0.5,
    }
    return {name: make[kind]().requires_grad_() for name, kind in spec.items()}


def with_inputs(spec: dict[str, str]):
    """Attach `make_inputs(T, B, H, n, v, device, generator)` and the time-major names to a
    reference (read by the matrix family's inputs.reference_inputs and time_major)."""
    def attach(fn):
        fn.make_inputs = lambda T, B, H, n, v, device, generator: core_inputs(spec, T, B, H, n, v, device, generator)
        fn.per_step = tuple(name for name, kind in spec.items() if kind not in ("param", "scalar", "state", "diag_state"))
        return fn
    return attach


def normalized(k: torch.Tensor) -> torch.Tensor:
    return l2_normalize(k)


def cell_cases(reference, cell, shape: Shape, device, generator, impl: str = "cuda:core") -> list[ParityCase]:
    """The core on the CUDA op against the reference (one thread layout: the gated kernels have one)."""
    kw = inputs.reference_inputs(reference, shape, device, generator)
    return [ParityCase(kw, cell, reference, ("o", "S_T"), impl)]


def entry(*, reference, cell, layer, layer_cases=None, test_shapes, **fields) -> Entry:
    """The registry entry of a single-state matrix variant: its core on the CUDA op (`cell(**inputs)`,
    fp32 and bf16) and its layer on backend 'cuda' against 'reference' (fp32) for every
    (label, factory) of `layer_cases(shape)`."""
    cases = layer_cases or (lambda shape: [("", layer)])

    def parity(shape: Shape, dtype, device, generator) -> list[ParityCase]:
        first = test_shapes[0]
        shape = Shape(shape.T, shape.B, shape.D, shape.H or first.H, shape.n or first.n, shape.v or first.v)
        out = cell_cases(reference, cell, shape, device, generator)
        if shape.D > 1 and dtype == torch.float32:
            out += [inputs.layer_case(f, shape, device, generator, label) for label, f in cases(shape)]
        return out

    defaults = dict(family="matrix", kind="variant", test_shapes=test_shapes, tolerance=inputs.TOLERANCE,
                    cuda_op="elman_matrix.gated_forward/gated_backward", parity=parity)
    return Entry(reference=reference, layer=layer, **{**defaults, **fields})


def per_head(name: str, t: torch.Tensor, v: torch.Tensor, columns: bool) -> torch.Tensor:
    """A per-head input ([H] or, with `columns`, [H, v]) broadcast to v's [T, B, H, v], after a
    clear error for a wrong shape."""
    H, vd = v.shape[2], v.shape[3]
    expected = (H, vd) if columns else (H,)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != expected:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be {'[H, v]' if columns else '[H]'} = {list(expected)}, got {got}")
    return (t[None, None] if columns else t[None, None, :, None]).expand(*v.shape)
