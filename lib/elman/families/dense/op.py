"""The dense family's shared CUDA cell: one W_h h per step, an elementwise epilogue.

Cell (time-major, `[T, B, D]`):

    v_t = W_x x_t + W_h h_{t-1} + b,   h_t = tanh(v_t),   out_t = h_t * silu(z_t)

E1 feeds it `z` from its split projection; E0 feeds it `z = W_g x + b_g`. The input
projection `W_x x` for all T*B rows and the weight gradients after the loop are single
large GEMMs (torch/cuBLAS); the compiled op owns only the recurrence:

- forward  `(wx, z, W_h, b, h0) -> (out, h_all)` with `h_all[0] = h0`, `h_all[t+1] = h_t`;
- backward `(W_h, h_all, z, d_out, d_hT) -> (dv, dz, dh0)`.

Three paths run the op: `persistent` (bf16; W_h stays in registers for the whole sequence:
of one thread-block cluster at D <= 1024, of a grid of 128 CTAs exchanging through L2 at
D = 2048 and B <= 64; chapter "Kernel engineering"), `steps` (one cuBLAS GEMM
plus one fused elementwise kernel per step, launched from the stream; any size, fp32 and
bf16) and `graph` (the same per-step loop captured once per shape in a CUDA graph and
replayed on static buffers, which removes the launch cost of every step). `path="auto"`
takes the persistent kernel where it supports the size, else `graph`, or `steps` while
the stream is itself being captured. `last_path` says what ran.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core import extension as ops

PATHS = ("auto", "persistent", "graph", "steps")
GRAPH_CACHE_SIZE = 8  # captured (shape, dtype, direction) loops kept per process
GATE_SILU = 0  # epilogue id in lib/csrc/dense_cell.cuh: out = h * silu(z)
last_path: dict[str, str] = {}


def check_inputs(x: torch.Tensor, z: torch.Tensor, h0: torch.Tensor | None) -> None:
    """Shape checks shared by the reference and the CUDA path (clear errors first)."""
    if x.dim() != 3:
        raise ValueError(f"cell input must be [T, B, D], got shape {tuple(x.shape)}")
    if z.shape != x.shape:
        raise ValueError(f"z must have the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
    if h0 is not None and h0.shape != x.shape[1:]:
        raise ValueError(f"h0 must be [B, D] = {tuple(x.shape[1:])}, got {tuple(h0.shape)}")
    if x.shape[0] < 1:
        raise ValueError("the sequence must have at least one step (T >= 1)")


def plan(B: int, D: int, dtype: torch.dtype, path: str = "auto") -> str:
    """Which implementation runs for this size: 'persistent', 'graph' or 'steps'."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    ext = ops.load()
    ok, why = ext.dense_persistent_supported(B, D, dtype == torch.bfloat16)
    if path == "persistent" and not ok:
        raise ValueError(f"the persistent kernel does not take B={B}, D={D}, {dtype}: {why}")
    capturing = torch.cuda.is_current_stream_capturing()
    if path == "graph" and capturing:
        raise ValueError("path='graph' cannot run while the stream is being captured; use 'steps'")
    if path != "auto":
        return path
    return "persistent" if ok else ("steps" if capturing else "graph")


def paths(B: int, D: int, dtype: torch.dtype) -> list[str]:
    """Every implementation that runs this size (the parity suite checks each)."""
    return (["persistent"] if plan(B, D, dtype) == "persistent" else []) + ["graph", "steps"]


_graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}


def _replayed(name: str, args: dict[str, torch.Tensor], outs: dict[str, torch.Tensor]) -> None:
    """Run the per-step op `name` of the extension (dense_forward / dense_backward) from a
    CUDA graph captured once per shape: copy `args` into the graph's static inputs, replay,
    copy its static outputs into `outs`."""
    ext = ops.load()
    key = (name, *(tuple(t.shape) for t in args.values()), args["z"].dtype, args["z"].device)
    if key not in _graphs:
        if len(_graphs) >= GRAPH_CACHE_SIZE:
            _graphs.pop(next(iter(_graphs)))
        static = {k: torch.zeros_like(t) for k, t in {**args, **outs}.items()}

        def call():
            getattr(ext, name)(**static, epilogue=GATE_SILU, persistent=False)
        side = torch.cuda.Stream(device=args["z"].device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()  # warm-up outside the capture (cuBLAS handle and workspace)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        _graphs[key] = (graph, static)
    graph, static = _graphs[key]
    for k, t in args.items():
        static[k].copy_(t)
    if ops.is_poisoned():  # parity runs: show any output element the replay leaves unwritten
        for k in outs:
            static[k].fill_(float("nan"))
    graph.replay()
    for k, t in outs.items():
        t.copy_(static[k])


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it where its data does not start 16-byte aligned (a contiguous view
    at an odd storage offset): the persistent kernels copy their inputs 16 bytes at a time,
    and the binding refuses such a view rather than fault."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _forward_op(chosen: str, wx, z, w_h, b, h0, out, h_all) -> None:
    if chosen == "graph":
        _replayed("dense_forward", dict(wx=wx, z=z, w_h=w_h, b=b, h0=h0), dict(out=out, h_all=h_all))
    else:
        ops.load().dense_forward(wx, z, w_h, b, h0, out, h_all, GATE_SILU, chosen == "persistent")


def _backward_op(chosen: str, w_h, h_all, z, d_out, d_hT, dv, dz, dh0) -> None:
    if chosen == "graph":
        _replayed("dense_backward", dict(w_h=w_h, h_all=h_all, z=z, d_out=d_out, d_hT=d_hT),
                  dict(dv=dv, dz=dz, dh0=dh0))
    else:
        ops.load().dense_backward(w_h, h_all, z, d_out, d_hT, dv, dz, dh0, GATE_SILU,
                                  chosen == "persistent")


class GatedCell(torch.autograd.Function):
    """Autograd over the compiled dense op (x, z, W_x, W_h, b, h0) -> (out, h_T)."""

    @staticmethod
    def forward(ctx, x, z, w_x, w_h, b, h0, path):
        T, B, D = x.shape
        chosen = plan(B, D, x.dtype, path)
        x, z, w_x, w_h, b, h0 = (t.contiguous() for t in (x, z, w_x, w_h, b, h0))
        if chosen == "persistent":
            z = _aligned(z)
        wx = (x.reshape(T * B, D) @ w_x.t()).view(T, B, D)
        out = ops.empty((T, B, D), x)
        h_all = ops.empty((T + 1, B, D), x)
        _forward_op(chosen, wx, z, w_h, b, h0, out, h_all)
        ctx.save_for_backward(x, z, w_x, w_h, h_all)
        ctx.path = chosen
        last_path["forward"] = chosen
        return out, h_all[T]

    @staticmethod
    def backward(ctx, d_out, d_hT):
        x, z, w_x, w_h, h_all = ctx.saved_tensors
        T, B, D = x.shape
        d_out = (torch.zeros_like(x) if d_out is None else d_out).to(x.dtype).contiguous()
        if ctx.path == "persistent":
            d_out = _aligned(d_out)
        d_hT = (torch.zeros_like(h_all[0]) if d_hT is None else d_hT).to(x.dtype).contiguous()
        dv = ops.empty((T, B, D), x)
        dz = ops.empty((T, B, D), x)
        dh0 = ops.empty((B, D), x)
        chosen = "steps" if ctx.path == "graph" and torch.cuda.is_current_stream_capturing() \
            else ctx.path
        _backward_op(chosen, w_h, h_all, z, d_out, d_hT, dv, dz, dh0)
        last_path["backward"] = chosen
        dv2 = dv.view(T * B, D)
        dw_h = dv2.t() @ h_all[:T].reshape(T * B, D)
        dw_x = dv2.t() @ x.view(T * B, D)
        dx = (dv2 @ w_x).view(T, B, D)
        db = dv2.sum(0, dtype=torch.float32).to(x.dtype)  # fp32 sum, no fp32 copy of dv
        return dx, dz, dw_x, dw_h, db, dh0, None


def gated_cell_cuda(x, z, w_x, w_h, b, h0=None, path: str = "auto"):
    """CUDA implementation of the gated cell; same signature as the references."""
    check_inputs(x, z, h0)
    for name, t in (("x", x), ("z", z), ("W_x", w_x), ("W_h", w_h), ("b", b)):
        if not t.is_cuda:
            raise ValueError(f"backend='cuda' needs CUDA tensors; {name} is on {t.device}")
    if h0 is None:
        h0 = x.new_zeros(x.shape[1:])
    return GatedCell.apply(x, z, w_x, w_h, b, h0, path)
