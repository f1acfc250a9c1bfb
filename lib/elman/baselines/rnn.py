"""gru / lstm: torch.nn.GRU / torch.nn.LSTM (cuDNN). Chapter: book/chapters/baselines.ipynb.

The layer: x_t = W_in y_t (W_in in R^{D x d}, N(0, 0.02)), one cuDNN RNN of width
D = int(d * expansion), out_t = W_out h_t (W_out in R^{d x D}, zero at init). Every
recurrent and input weight block (D x D per gate) is orthogonal, biases 0. The cells are
cuDNN's, gate order as PyTorch stores them:

GRU (r, z, n):   r = sigma(W_r x + b_r + U_r h + c_r),  z = sigma(W_z x + b_z + U_z h + c_z)
                 n = tanh(W_n x + b_n + r * (U_n h + c_n)),  h' = (1 - z) * n + z * h
                 (the reset gate multiplies U_n h + c_n, not h: cuDNN's form)
LSTM (i, f, g, o): i, f, o = sigma(W x + b + U h + c),  g = tanh(W_g x + b_g + U_g h + c_g)
                 c' = f * c + i * g,  h' = o * tanh(c')

`rnn_dtype` ("float16" | "bfloat16" | "float32" | None) is the dtype the cuDNN RNN runs in
regardless of the surrounding autocast (None: the autocast dtype, else the input's);
weights stay fp32 and are cast per call as autocast casts them. fp16 is the dtype in which
PyTorch may pick cuDNN's persistent algorithm; bf16 always runs the standard one. The
registry lists one level per cell with dtypes ("float16", "bfloat16"), which `elman
bench` times separately: two precisions of one model, not two models.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from ..core.entry import Entry, ParityCase, Shape, Tolerance, shapes
from .common import DTYPES, autocast_dtype, check_backend, check_sequence, check_tensors, inner_width

GATES = {"gru": 3, "lstm": 4}


def gru_reference(x, w_ih, w_hh, b_ih, b_hh, h0):
    """GRU over time-major x [T, B, D] with h0 [B, D]: returns (h [T, B, D], h_T)."""
    h, outs = h0, []
    for t in range(x.shape[0]):
        xr, xz, xn = (x[t] @ w_ih.t() + b_ih).chunk(3, dim=-1)
        hr, hz, hn = (h @ w_hh.t() + b_hh).chunk(3, dim=-1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        outs.append(h)
    return torch.stack(outs), h


def lstm_reference(x, w_ih, w_hh, b_ih, b_hh, h0, c0):
    """LSTM over time-major x [T, B, D]: returns (h [T, B, D], h_T, c_T)."""
    h, c, outs = h0, c0, []
    for t in range(x.shape[0]):
        i, f, g, o = (x[t] @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs), h, c


@contextlib.contextmanager
def _exact_fp32(on: bool):
    """cuDNN may run fp32 RNNs on TF32 tensor cores (torch.backends.cudnn.allow_tf32, on by
    default); an fp32 run here is fp32."""
    prev = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = prev and not on
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = prev


def _cudnn(module: nn.RNNBase, x, w_ih, w_hh, b_ih, b_hh, h0, c0=None):
    """cuDNN's RNN (the structure of `module`) with explicit weights, in x's dtype, outside
    autocast: returns (h [T, B, D], h_T[, c_T]). The weights are cast per call, so cuDNN
    packs them into its flat buffer per call (the warning that says so is expected). The
    inputs are checked first (cuDNN takes one dtype, a CUDA device and no empty size)."""
    lstm = isinstance(module, nn.LSTM)
    level = "lstm" if lstm else "gru"
    sizes = check_tensors(level, {"x": "t b i", "w_ih": "gd i", "w_hh": "gd d", "b_ih": "gd",
                                  "b_hh": "gd", "h0": "b d", "c0": "b d"},
                          dict(x=x, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh, h0=h0, c0=c0),
                          same_dtype=("x", "w_ih", "w_hh", "b_ih", "b_hh", "h0", "c0"),
                          cuda=False, dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64))
    if sizes["gd"] != GATES[level] * sizes["d"] or (lstm and c0 is None):
        raise ValueError(f"{level}: w_ih, w_hh, b_ih, b_hh must have {GATES[level]} x {sizes['d']} rows "
                         f"(got {sizes['gd']}){'; the LSTM needs c0' if lstm and c0 is None else ''}")
    weights = {"weight_ih_l0": w_ih, "weight_hh_l0": w_hh, "bias_ih_l0": b_ih, "bias_hh_l0": b_hh}
    hx = (h0[None], c0[None]) if lstm else h0[None]
    with torch.autocast(x.device.type, enabled=False), _exact_fp32(x.dtype == torch.float32), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="RNN module weights are not part of single")
        out, state = torch.func.functional_call(module, weights, (x, hx))
    return (out, state[0][0], state[1][0]) if lstm else (out, state[0])


class CuDNNRNN(nn.Module):
    """gru / lstm layer: `forward(y [B, T, d], state=None) -> (out [B, T, d], state)`;
    state is h [B, D] (gru) or (h, c) (lstm)."""

    cell = "gru"

    @property
    def impl(self) -> str:
        """What `backend="cuda"` runs, for records."""
        return f"cudnn:{self.cell}"

    def __init__(self, dim: int, expansion: float = 1.0, backend: str = "cuda",
                 rnn_dtype: str | torch.dtype | None = None):
        super().__init__()
        check_backend(backend)
        inner_width(dim, expansion)
        if isinstance(rnn_dtype, str):
            if rnn_dtype not in DTYPES:
                raise ValueError(f"rnn_dtype must be one of {tuple(DTYPES)} or None, got {rnn_dtype!r}")
            rnn_dtype = DTYPES[rnn_dtype]
        self.backend, self.rnn_dtype = backend, rnn_dtype
        self.dim, self.inner = dim, int(dim * expansion)
        D = self.inner
        self.w_in = nn.Parameter(torch.empty(D, dim))
        self.w_out = nn.Parameter(torch.zeros(dim, D))
        self.rnn = (nn.GRU if self.cell == "gru" else nn.LSTM)(D, D)
        nn.init.normal_(self.w_in, std=0.02)
        with torch.no_grad():
            for w in (self.rnn.weight_ih_l0, self.rnn.weight_hh_l0):
                for block in w.view(GATES[self.cell], D, D):
                    nn.init.orthogonal_(block)
            self.rnn.bias_ih_l0.zero_()
            self.rnn.bias_hh_l0.zero_()

    def _weights(self, dtype):
        r = self.rnn
        return [p.to(dtype) for p in (r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0)]

    def forward(self, y: torch.Tensor, state=None):
        check_sequence(self.cell, y, self.dim)
        if self.backend == "cuda" and y.device.type != "cuda":
            raise RuntimeError(f"{self.cell} with backend='cuda' runs cuDNN, which needs CUDA "
                               "tensors; use backend='reference' on this machine")
        dt = autocast_dtype(y)
        x = (y.to(dt) @ self.w_in.to(dt).t()).transpose(0, 1)        # [T, B, D]
        B, D = x.shape[1], self.inner
        if state is None:
            state = x.new_zeros(B, D) if self.cell == "gru" else (x.new_zeros(B, D), x.new_zeros(B, D))
        if self.backend == "reference":
            ct = torch.promote_types(dt, torch.float32)
            hs = (state.to(ct),) if self.cell == "gru" else tuple(s.to(ct) for s in state)
            ref = gru_reference if self.cell == "gru" else lstm_reference
            h, *final = ref(x.to(ct), *self._weights(ct), *hs)
        else:
            rt = self.rnn_dtype or dt
            hs = (state.to(rt),) if self.cell == "gru" else tuple(s.to(rt) for s in state)
            h, *final = _cudnn(self.rnn, x.to(rt), *self._weights(rt), *hs)
        out = (h.to(dt) @ self.w_out.to(dt).t()).transpose(0, 1)
        return out, final[0] if self.cell == "gru" else tuple(final)


class GRU(CuDNNRNN):
    cell = "gru"


class LSTM(CuDNNRNN):
    cell = "lstm"


def layer_params(cell: str):
    def count(dim: int, expansion: float = 1.0) -> int:
        D, G = int(dim * expansion), GATES[cell]
        return 2 * dim * D + 2 * G * D * D + 2 * G * D
    count.__doc__ = f"{cell}: W_in, W_out (2dD) + cuDNN's {GATES[cell]} gates x (W, U, b, c)."
    return count


def parity_builder(cell: str):
    def parity(shape: Shape, dtype, device, generator) -> list[ParityCase]:
        T, B, D = shape.T, shape.B, shape.D
        G = GATES[cell]
        kw = dict(device=device, dtype=torch.float64, generator=generator)
        a = D ** -0.5
        inputs = {"x": torch.randn(T, B, D, **kw),
                  "w_ih": a * torch.randn(G * D, D, **kw), "w_hh": a * torch.randn(G * D, D, **kw),
                  "b_ih": 0.1 * torch.randn(G * D, **kw), "b_hh": 0.1 * torch.randn(G * D, **kw),
                  "h0": torch.rand(B, D, **kw) - 0.5}
        if cell == "lstm":
            inputs["c0"] = torch.rand(B, D, **kw) - 0.5
        inputs = {n: t.requires_grad_() for n, t in inputs.items()}
        outputs = ("out", "h_T") if cell == "gru" else ("out", "h_T", "c_T")
        ref = gru_reference if cell == "gru" else lstm_reference
        module = (nn.GRU if cell == "gru" else nn.LSTM)(D, D, device="meta")
        return [ParityCase(inputs, lambda **kw: _cudnn(module, **kw), ref, outputs, f"cudnn:{cell}")]
    return parity


# B = T = 1; T = 33 at a width that is no multiple of 32; T = 512 at D = 512 (these cells
# contract: with fp16 or bf16 rounding of the state, emulated on the CPU, the relative error
# at T = 512 equals that at T = 33)
_SHAPES = shapes((1, 1, 32), (33, 3, 100), (512, 4, 512))
ENTRIES = tuple(
    Entry(
        name=_cell, kind="baseline", aliases=(f"cudnn-{_cell}",), layer=_cls, title=_title,
        chapter="book/chapters/baselines.ipynb",
        layer_params=layer_params(_cell), parity=parity_builder(_cell), test_shapes=_SHAPES,
        tolerance={"float32": Tolerance(1e-5, 1e-5), "float16": Tolerance(5e-3, 1e-2),
                   "bfloat16": Tolerance(3e-2, 5e-2)},
        dtypes=("float16", "bfloat16"),
        notes="rnn_dtype sets the cuDNN dtype (fp16: persistent algorithm possible; bf16: "
              "standard); W_in N(0, 0.02), W_out zero, gate blocks orthogonal, biases 0",
    )
    for _cell, _cls, _title in (("gru", GRU, "GRU (cuDNN, torch.nn.GRU)"),
                                ("lstm", LSTM, "LSTM (cuDNN, torch.nn.LSTM)")))
