"""The dense family's CUDA op: one W_h h per step and an elementwise epilogue.

Cell (time-major, `[T, B, D]`), for an epilogue of the table in lib/csrc/dense/epilogues.cuh
with k gate inputs g_1..g_k (E0/E1's "tanh_silu_gate": k = 1, h = tanh(v), out = h * silu(z)):

    v_t = W_x x_t + W_h h_{t-1} + b,   h_t = act(v_t),   out_t = gate(h_t, g_1..g_k)

`W_x` may be None (wx = x, as E39) and `b` may be None (no bias). The input projection
`W_x x` for all T*B rows and the weight gradients after the loop are single large GEMMs
(torch/cuBLAS); the compiled op owns only the recurrence:

- forward  `(wx, gates, W_h, b, h0) -> (out, h_all)` with `h_all[0] = h0`, `h_all[t+1] = h_t`;
- backward `(W_h, h_all, gates, d_out, d_hT) -> (dv, d_gates, dh0)`.

Three paths run the op: `persistent` (bf16; W_h stays on chip for the whole sequence: in
the registers of one thread-block cluster at D = 256, 512, 768, 1024 and any B, in the
registers and shared memory of a 16-CTA cluster per 8 batch columns at D = 1280 and any B
(the forward per 12 where that takes fewer waves of clusters: `WIDE_COLUMNS_ENV`),
in a grid of 4 D / 64 CTAs exchanging through L2 at the other multiples of 128 up to 2048 and
B <= 64; the set is `persistent_size`; chapter "Kernel engineering"), `steps` (one cuBLAS GEMM plus one fused
elementwise kernel per step, launched from the stream; any size, fp32 and bf16) and `graph`
(the same per-step loop captured once per shape in a CUDA graph and replayed on static
buffers, which removes the launch cost of every step). `path="auto"` takes the persistent
kernel where it supports the size, else `graph`, or `steps` while the stream is itself being
captured. `last_path` says what ran. Every input goes through elman.core.validate first.
"""
from __future__ import annotations

import torch

from ...core import extension as ops
from ...core import validate

PATHS = ("auto", "persistent", "graph", "steps")
RAW_PATHS = ("persistent", "graph", "steps")
DTYPES = (torch.float32, torch.bfloat16)
GRAPH_CACHE_SIZE = 8  # captured (epilogue, shape, dtype, direction) loops kept per process
last_path: dict[str, str] = {}


def _ext():
    return ops.load("dense")


def epilogues() -> dict[str, dict[str, int]]:
    """{name: {"id": int, "gates": int}} of the compiled epilogue table."""
    return dict(_ext().epilogues())


def epilogue_id(name: str) -> int:
    table = epilogues()
    if name not in table:
        raise ValueError(f"unknown dense epilogue {name!r}; the table has {sorted(table)}")
    return table[name]["id"]


def _gate_count(name: str) -> int:
    table = epilogues()
    if name not in table:
        raise ValueError(f"unknown dense epilogue {name!r}; the table has {sorted(table)}")
    return table[name]["gates"]


def check_inputs(x: torch.Tensor, z: torch.Tensor | None = None, h0: torch.Tensor | None = None) -> None:
    """Shape checks shared by the references and the CUDA path (clear errors first): x is
    [T, B, D] with no empty dimension, the gate z (if given) has its shape, h0 is [B, D]."""
    T, B, D = validate.sequence("x", x)
    validate.shapes({"z": (z, (T, B, D)), "h0": (h0, (B, D))})


def validate_cell(x, gates, w_x, w_h, b, h0, path: str) -> None:
    """Everything about a cell call that needs no GPU: path, ranks, empty dimensions, every
    tensor's exact shape, dtypes (float32 or bfloat16, all equal), then devices (all CUDA,
    one device)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    T, B, D = validate.sequence("x", x)
    validate.size_limit("B * D", B * D)
    if not isinstance(gates, (tuple, list)):
        raise TypeError(f"gates must be a tuple of tensors, got {type(gates).__name__}")
    named = {f"gates[{i}]": g for i, g in enumerate(gates)}
    validate.shapes({**{n: (g, (T, B, D)) for n, g in named.items()},
                     "W_x": (w_x, (D, D)), "W_h": (w_h, (D, D)), "b": (b, (D,)), "h0": (h0, (B, D))})
    tensors = {"x": x, **named, "W_x": w_x, "W_h": w_h, "b": b, "h0": h0}
    validate.dtypes(tensors, DTYPES)
    validate.devices(tensors)


CLUSTER_WIDTHS = (256, 512, 768, 1024)  # the cluster design's D: any B
WIDE_WIDTHS = (1280,)                    # the wide cluster design's D: any B
# The wide forward's batch columns per cluster, 8 or 12, forced for side-by-side timing by this
# environment variable (read at every plan); unset, the forward takes 12 where that needs fewer
# waves of clusters (on an H100, 7 clusters at once: every B > 56 but 85-112), else 8. The
# backward always takes 8.
WIDE_COLUMNS_ENV = "ELMAN_WIDE_COLUMNS"
GRID_MAX_BATCH = 64                      # the grid design's largest B (every other D)
MAX_WIDTH = 2048


def persistent_design(D: int) -> str:
    """The persistent design that takes width D (of the supported set): 'cluster', 'wide'
    (a 16-CTA cluster per 8 or 12 batch columns, W_h split between registers and shared memory;
    D = 1536 does not fit one: lib/csrc/dense/wide.cuh) or 'grid'."""
    return "cluster" if D in CLUSTER_WIDTHS else "wide" if D in WIDE_WIDTHS else "grid"


def persistent_size(B: int, D: int) -> tuple[bool, str]:
    """(ok, reason): whether the persistent kernels take this B and D, the one statement of
    the supported set (bf16 on sm_90 besides): D a multiple of 128 from 256 to 2048; at
    D = 256, 512, 768, 1024 (cluster design) and 1280 (wide design) any B, at the other widths
    (grid design) B <= 64; B * D below 2^31. The compiled plans agree
    (tests/test_widths_gpu.py)."""
    if B < 1 or D < 1:
        return False, "B and D must be at least 1"
    if D % 128 != 0 or not 256 <= D <= MAX_WIDTH:
        return False, f"D must be a multiple of 128 from 256 to {MAX_WIDTH}, got {D}"
    if B * D >= 2 ** 31:
        return False, f"B * D must be below 2^31, got {B * D}"
    if persistent_design(D) == "grid" and B > GRID_MAX_BATCH:
        return False, (f"at D = {D} (the grid design) B must be <= {GRID_MAX_BATCH}, got {B}; "
                       f"D in {CLUSTER_WIDTHS + WIDE_WIDTHS} take any B")
    return True, ""


def plan(B: int, D: int, dtype: torch.dtype, path: str = "auto",
         epilogue: str = "tanh_silu_gate") -> str:
    """Which implementation runs for this size: 'persistent', 'graph' or 'steps'. The size
    test is `persistent_size`; where it passes, the extension also checks dtype, device and
    occupancy."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    validate.nonempty("(B, D)", (B, D), "B and D")
    ok, why = persistent_size(B, D)
    if ok:
        ok, why = _ext().persistent_supported(B, D, dtype == torch.bfloat16, epilogue_id(epilogue))
    if path == "persistent" and not ok:
        raise ValueError(f"the persistent kernel does not take B={B}, D={D}, {dtype}: {why}")
    capturing = torch.cuda.is_current_stream_capturing()
    if path == "graph" and capturing:
        raise ValueError("path='graph' cannot run while the stream is being captured; use 'steps'")
    if path != "auto":
        return path
    return "persistent" if ok else ("steps" if capturing else "graph")


def paths(B: int, D: int, dtype: torch.dtype, epilogue: str = "tanh_silu_gate") -> list[str]:
    """Every implementation that runs this size (the parity suite checks each)."""
    persistent = plan(B, D, dtype, epilogue=epilogue) == "persistent"
    return (["persistent"] if persistent else []) + ["graph", "steps"]


# ---- the raw op on preallocated buffers ---------------------------------------------------
_graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict]] = {}


def _static_like(v):
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return [torch.zeros_like(t) for t in v]
    return torch.zeros_like(v)


def _pairs(static: dict, given: dict):
    for k, v in given.items():
        if isinstance(v, (list, tuple)):
            yield from zip(static[k], v)
        elif v is not None:
            yield static[k], v


def replay(key: tuple, call, args: dict, outs: dict) -> None:
    """Run `call(**static)` from a CUDA graph captured once per `key`: copy `args` into the
    graph's static inputs, replay, copy its static outputs into `outs`. Values may be tensors,
    lists of tensors (gates) or None (no bias); `key` must name every shape and the dtype."""
    if key not in _graphs:
        if len(_graphs) >= GRAPH_CACHE_SIZE:
            _graphs.pop(next(iter(_graphs)))
        static = {k: _static_like(v) for k, v in {**args, **outs}.items()}
        like = next(v for v in args.values() if isinstance(v, torch.Tensor))
        side = torch.cuda.Stream(device=like.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call(**static)  # warm-up outside the capture (cuBLAS handle and workspace)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call(**static)
        _graphs[key] = (graph, static)
    graph, static = _graphs[key]
    for dst, src in _pairs(static, args):
        dst.copy_(src)
    if ops.is_poisoned():  # parity runs: show any output element the replay leaves unwritten
        for dst, _ in _pairs(static, outs):
            dst.fill_(float("nan"))
    graph.replay()
    for src, dst in _pairs(static, outs):
        dst.copy_(src)


def _replayed(direction: str, eid: int, args: dict, outs: dict) -> None:
    """The per-step op (`forward` or `backward` of the extension) from a CUDA graph captured
    once per epilogue and shape (`replay`)."""
    like = args["w_h"]

    def sig(v):
        if v is None:
            return None
        return tuple(tuple(t.shape) for t in v) if isinstance(v, (list, tuple)) else tuple(v.shape)
    key = (direction, eid, *(sig(v) for v in args.values()), like.dtype, like.device)
    replay(key, lambda **static: getattr(_ext(), direction)(eid, **static, persistent=False),
           args, outs)


def forward_into(path: str, epilogue: str, wx, gates, w_h, b, h0, out, h_all) -> None:
    """The raw forward on preallocated buffers (`path` in persistent, graph, steps)."""
    if path not in RAW_PATHS:
        raise ValueError(f"path must be one of {RAW_PATHS}, got {path!r}")
    eid, gates = epilogue_id(epilogue), list(gates)
    if path == "graph":
        _replayed("forward", eid, dict(wx=wx, gates=gates, w_h=w_h, b=b, h0=h0),
                  dict(out=out, h_all=h_all))
    else:
        _ext().forward(eid, wx, gates, w_h, b, h0, out, h_all, path == "persistent")


def backward_into(path: str, epilogue: str, w_h, h_all, gates, d_out, d_hT, dv, d_gates, dh0) -> None:
    """The raw backward on preallocated buffers (`path` in persistent, graph, steps)."""
    if path not in RAW_PATHS:
        raise ValueError(f"path must be one of {RAW_PATHS}, got {path!r}")
    eid, gates, d_gates = epilogue_id(epilogue), list(gates), list(d_gates)
    if path == "graph":
        _replayed("backward", eid, dict(w_h=w_h, h_all=h_all, gates=gates, d_out=d_out, d_hT=d_hT),
                  dict(dv=dv, d_gates=d_gates, dh0=dh0))
    else:
        _ext().backward(eid, w_h, h_all, gates, d_out, d_hT, dv, d_gates, dh0,
                        path == "persistent")


# ---- autograd -------------------------------------------------------------------------------
class DenseCell(torch.autograd.Function):
    """Autograd over the compiled dense op (x, W_x, W_h, b, h0, *gates) -> (out, h_T)."""

    @staticmethod
    def forward(ctx, epilogue, path, x, w_x, w_h, b, h0, *gates):
        T, B, D = x.shape
        chosen = plan(B, D, x.dtype, path, epilogue)
        x, w_x, w_h, b, h0 = (validate.contiguous(t) for t in (x, w_x, w_h, b, h0))
        gates = [validate.contiguous(g) for g in gates]
        if chosen == "persistent":  # its kernels copy the staged inputs 16 bytes at a time
            gates = [validate.aligned(g) for g in gates]
        wx = x if w_x is None else (x.reshape(T * B, D) @ w_x.t()).view(T, B, D)
        if chosen == "persistent":
            wx = validate.aligned(wx)
        out = ops.empty((T, B, D), x)
        h_all = ops.empty((T + 1, B, D), x)
        forward_into(chosen, epilogue, wx, gates, w_h, b, h0, out, h_all)
        ctx.save_for_backward(x, w_x, w_h, h_all, *gates)
        ctx.path, ctx.epilogue, ctx.has_b = chosen, epilogue, b is not None
        last_path["forward"] = chosen
        return out, h_all[T]

    @staticmethod
    def backward(ctx, d_out, d_hT):
        x, w_x, w_h, h_all, *gates = ctx.saved_tensors
        T, B, D = x.shape
        d_out = (torch.zeros_like(x) if d_out is None else d_out).to(x.dtype).contiguous()
        if ctx.path == "persistent":
            d_out = validate.aligned(d_out)
        d_hT = (torch.zeros_like(h_all[0]) if d_hT is None else d_hT).to(x.dtype).contiguous()
        dv = ops.empty((T, B, D), x)
        d_gates = [ops.empty((T, B, D), x) for _ in gates]
        dh0 = ops.empty((B, D), x)
        chosen = "steps" if ctx.path == "graph" and torch.cuda.is_current_stream_capturing() \
            else ctx.path
        backward_into(chosen, ctx.epilogue, w_h, h_all, gates, d_out, d_hT, dv, d_gates, dh0)
        last_path["backward"] = chosen
        dv2 = dv.view(T * B, D)
        dw_h = dv2.t() @ h_all[:T].reshape(T * B, D)
        if w_x is None:
            dx, dw_x = dv, None
        else:
            dw_x = dv2.t() @ x.view(T * B, D)
            dx = (dv2 @ w_x).view(T, B, D)
        db = dv2.sum(0, dtype=torch.float32).to(x.dtype) if ctx.has_b else None  # no fp32 copy of dv
        return None, None, dx, dw_x, dw_h, db, dh0, *d_gates


def cell(epilogue: str, x: torch.Tensor, gates: tuple, w_x: torch.Tensor | None,
         w_h: torch.Tensor, b: torch.Tensor | None, h0: torch.Tensor | None = None,
         path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The dense cell on the GPU with epilogue `epilogue` (a name of `epilogues()`):
    returns (out [T, B, D], h_T [B, D]), differentiable in x, every gate, W_x, W_h, b and h0.
    Inputs are validated before the extension is loaded; unsupported input raises, never
    falls back."""
    validate_cell(x, gates, w_x, w_h, b, h0, path)
    expected = _gate_count(epilogue)
    if len(gates) != expected:
        raise ValueError(f"epilogue {epilogue!r} takes {expected} gate input(s), got {len(gates)}")
    if h0 is None:
        h0 = x.new_zeros(x.shape[1:])
    return DenseCell.apply(epilogue, path, x, w_x, w_h, b, h0, *gates)
