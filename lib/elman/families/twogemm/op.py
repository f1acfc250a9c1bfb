"""The two-GEMM family's CUDA op: two dependent matrix products per step.

Two cells, time-major `[T, B, D]`:

- low-rank (`lowrank_cell`, E4, E5, E66, E67lr): per step `p = V h_{t-1}` (r wide),
  `q = U p` (D wide), then one fused elementwise stage of mode `tanh_gate`, `gated_tanh` or
  `gated_alpha` (stages.py gives the math). Backward per step: one fused stage, then
  `dp = d_pre U` and `g += dp V`; after the loop dU, dV are single GEMMs over all steps.
- tape (`tape_cell`, E23): per step `hw = W_h w_{t-1}`, the fused read stage (softmax read of
  the N-slot tape, tanh update, output gate), `u = W_wr w_t`, the fused write stage
  (replacement write into the tape, in place). The forward keeps one tape and a checkpoint
  every K = ceil(sqrt(T)) steps; the backward recomputes each segment's K tapes from its
  checkpoint by the write stage alone (u for all steps is one GEMM over the saved w), so
  memory is (T/K + K) tapes, not the T + 1 of the whole history.

GEMMs are torch/cuBLAS (`torch.mm` into preallocated buffers); the fused stages are the
kernels of lib/csrc/twogemm. Paths: `persistent` (bf16; one launch runs the whole sequence
on a thread-block cluster whose CTAs own slices of the state and hold their weight slices in
registers as tensor-core fragments, exchanging by st.async into every peer with no cluster
barrier a step. Low-rank: 64- or 128-row slices of U and V, only the r-wide partial sums of
V h and of d_pre U cross the cluster; D a multiple of 8 up to 2048, r up to 256 (rank tiles in
registers), r up to 320 with the four rank tiles past 256 in shared memory where the cluster
fits (D up to 1408; lib/csrc/twogemm/persistent.cu). E23: 32-row slices of W_h and W_wr, each thread one state
element and its tape column on chip, two exchanges a step (w_t with the N write-score
partials, then the scalar u . w_t from which the next read scores follow as
(1 - beta) W + beta u . w); D <= 512, N <= 32 (lib/csrc/twogemm/tape_persistent.cu); its
backward recomputes each segment's tapes on chip from the checkpoints with the u and beta
the forward stored, D a multiple of 8 (tape_persistent_backward.cu); where the backward does
not take the size the graph loop runs it. schedule.py restates both designs on the CPU),
`steps` (the loop launched from the stream), `graph` (the same loop captured once per shape
in a CUDA graph and replayed on static buffers) and `auto` (the persistent kernel where it
takes the size, else `graph`, or `steps` while the stream is itself being captured).
`path="persistent"` raises where the forward kernel does not take the size. `last_path`
says what ran (forward and backward). Every input goes through elman.core.validate before
the extension is loaded.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Callable

import torch

from ...core import extension as ops
from ...core import validate
from . import stages as torch_stages
from .stages import MODES

PATHS = ("auto", "persistent", "graph", "steps")
DTYPES = (torch.float32, torch.bfloat16)
MAX_SLOTS = 256  # the tape kernels keep one score per slot in shared memory
GRAPH_CACHE_SIZE = 8
last_path: dict[str, str] = {}


def _ext():
    return ops.load("twogemm")


def cuda_stages() -> SimpleNamespace:
    """The fused stages as the compiled kernels (same signatures as stages.py)."""
    ext = _ext()
    return SimpleNamespace(
        lowrank_forward=ext.lowrank_forward, lowrank_backward=ext.lowrank_backward,
        tape_read=ext.tape_read, tape_write=ext.tape_write,
        tape_write_backward=ext.tape_write_backward, tape_read_backward=ext.tape_read_backward)


def supported(B: int, D: int, dtype: torch.dtype, rank: int | None = None,
              slots: int | None = None) -> tuple[bool, str]:
    """Whether the persistent kernel takes this size (and why not): the low-rank cell of rank
    `rank` or the tape cell of `slots` slots."""
    validate.nonempty("(B, D)", (B, D), "B and D")
    bf16 = dtype == torch.bfloat16
    if rank is not None:
        return tuple(_ext().lowrank_persistent_supported(B, D, rank, bf16))
    if slots is not None:
        return tuple(_ext().tape_persistent_supported(B, D, slots, bf16))
    raise ValueError("plan needs the low-rank cell's rank or the tape cell's slot count")


# Which persistent designs `auto` takes: both (tensor cores, weight slices in registers, no
# cluster barrier a step).
AUTO_PERSISTENT = {"lowrank": True, "tape": True}


def plan(path: str, B: int, D: int, dtype: torch.dtype, rank: int | None = None,
         slots: int | None = None) -> str:
    """Which implementation runs: 'persistent', 'graph' or 'steps', for the low-rank cell of
    rank `rank` or the tape cell of `slots` slots."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    ok, why = supported(B, D, dtype, rank, slots)
    size = f"r={rank}" if rank is not None else f"N={slots}"
    if path == "persistent" and not ok:
        raise ValueError(f"the persistent kernel does not take B={B}, D={D}, {size}, {dtype}: "
                         f"{why}; use path='graph' or 'steps'")
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if path == "graph" and capturing:
        raise ValueError("path='graph' cannot run while the stream is being captured; use 'steps'")
    if path != "auto":
        return path
    design = "lowrank" if rank is not None else "tape"
    return "persistent" if ok and AUTO_PERSISTENT[design] else ("steps" if capturing else "graph")


def paths(B: int, D: int, dtype: torch.dtype, rank: int | None = None,
          slots: int | None = None) -> list[str]:
    """Every implementation that runs this size (the parity suite checks each)."""
    return (["persistent"] if supported(B, D, dtype, rank, slots)[0] else []) + ["graph", "steps"]


def checkpoint_interval(T: int) -> int:
    """K of the tape backward: ceil(sqrt(T)), which minimises T/K + K stored tapes."""
    return max(1, math.ceil(math.sqrt(T)))


# ---- CUDA graphs of whole loops --------------------------------------------------------------
_graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict, dict]] = {}


def _replayed(key: tuple, loop: Callable[..., None], args: dict, outs: dict) -> None:
    """Run `loop(**args, **outs)` from a CUDA graph captured once per `key`: copy `args`
    into the graph's static inputs, replay, copy its static outputs into `outs`."""
    if key not in _graphs:
        if len(_graphs) >= GRAPH_CACHE_SIZE:
            _graphs.pop(next(iter(_graphs)))
        s_args = {k: None if v is None else v.clone() for k, v in args.items()}
        s_outs = {k: torch.zeros_like(v) for k, v in outs.items()}
        side = torch.cuda.Stream(device=next(iter(outs.values())).device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            loop(**{k: None if v is None else v.clone() for k, v in s_args.items()},
                 **{k: torch.zeros_like(v) for k, v in s_outs.items()})  # warm-up (cuBLAS)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loop(**s_args, **s_outs)
        _graphs[key] = (graph, s_args, s_outs)
    graph, s_args, s_outs = _graphs[key]
    for k, v in args.items():
        if v is not None:
            s_args[k].copy_(v)
    if ops.is_poisoned():  # parity runs: show any output element the replay leaves unwritten
        for v in s_outs.values():
            v.fill_(float("nan"))
    graph.replay()
    for k, v in outs.items():
        v.copy_(s_outs[k])


def _key(direction: str, tag, tensors: dict) -> tuple:
    return (direction, tag, *((k, None if v is None else (tuple(v.shape), v.dtype, v.device))
                             for k, v in tensors.items()))


def _run(path: str, direction: str, tag, loop: Callable, args: dict, outs: dict) -> None:
    if path == "graph":
        _replayed(_key(direction, tag, {**args, **outs}), loop, args, outs)
    else:
        loop(**args, **outs)


# ---- low-rank loops -----------------------------------------------------------------------------
def lowrank_forward_loop(st, mode: int, a, c, u, v, b, h0, out, h_all, p_all, aux) -> None:
    """Forward on preallocated buffers: h_all [T+1, B, D] (h_all[0] = h0), p_all [T, B, r]
    (V h_{t-1}, kept for dU), aux [T, B, D] (modes 1, 2)."""
    T = a.shape[0]
    h_all[0].copy_(h0)
    q = torch.empty_like(h0)
    for t in range(T):
        torch.mm(h_all[t], v.t(), out=p_all[t])
        torch.mm(p_all[t], u.t(), out=q)
        st.lowrank_forward(mode, a[t], c[t], q, b, h_all[t], h_all[t + 1], out[t],
                           None if aux is None else aux[t])


def lowrank_backward_loop(st, mode: int, c, u, v, h_all, aux, d_out, d_hT, d_pre, d_c, dp_all, dh0) -> None:
    """Backward on preallocated buffers: d_pre [T, B, D], d_c [T, B, D], dp_all [T, B, r]
    (d_pre U per step, kept for dV), dh0 [B, D]."""
    T = d_out.shape[0]
    g = d_hT.clone()
    for t in range(T - 1, -1, -1):
        st.lowrank_backward(mode, d_out[t], c[t], h_all[t], h_all[t + 1],
                            None if aux is None else aux[t], g, d_pre[t], d_c[t], g)
        torch.mm(d_pre[t], u, out=dp_all[t])
        g.addmm_(dp_all[t], v)
    dh0.copy_(g)


class LowRankCell(torch.autograd.Function):
    """(a, c, U, V, b, h0) -> (out, h_T) with pre = a + U V h + b (stages.py)."""

    @staticmethod
    def forward(ctx, st, mode, path, a, c, u, v, b, h0):
        T, B, D = a.shape
        r = u.shape[1]
        a, c, u, v, b, h0 = (validate.contiguous(t) for t in (a, c, u, v, b, h0))
        out = ops.empty((T, B, D), a)
        h_all = ops.empty((T + 1, B, D), a)
        p_all = ops.empty((T, B, r), a)
        aux = ops.empty((T, B, D), a) if mode else None  # v (gated_tanh) or alpha (gated_alpha)
        args = dict(a=a, c=c, u=u, v=v, b=b, h0=h0)
        outs = dict(out=out, h_all=h_all, p_all=p_all, **({"aux": aux} if mode else {}))

        def loop(**kw):
            lowrank_forward_loop(st, mode, **{"aux": None, **kw})
        if path == "persistent":
            _ext().lowrank_persistent_forward(mode, a, c, u, v, b, h0, out, h_all, p_all, aux)
        else:
            _run(path, "lowrank_forward", mode, loop, args, outs)
        ctx.save_for_backward(c, u, v, h_all, p_all, aux)
        ctx.st, ctx.mode, ctx.path = st, mode, path
        last_path["forward"] = path
        return out, h_all[T]

    @staticmethod
    def backward(ctx, d_out, d_hT):
        c, u, v, h_all, p_all, aux = ctx.saved_tensors
        T, B, D = c.shape
        r = u.shape[1]
        d_out = (torch.zeros_like(c) if d_out is None else d_out).to(c.dtype).contiguous()
        d_hT = (torch.zeros_like(h_all[0]) if d_hT is None else d_hT).to(c.dtype).contiguous()
        d_pre, d_c = ops.empty((T, B, D), c), ops.empty((T, B, D), c)
        dp_all, dh0 = ops.empty((T, B, r), c), ops.empty((B, D), c)
        path = "steps" if ctx.path == "graph" and torch.cuda.is_current_stream_capturing() else ctx.path
        mode, st = ctx.mode, ctx.st
        if path == "persistent":
            _ext().lowrank_persistent_backward(mode, c, u, v, h_all, aux, d_out, d_hT, d_pre, d_c,
                                               dp_all, dh0)
        else:
            _run(path, "lowrank_backward", mode,
                 lambda **kw: lowrank_backward_loop(st, mode, **kw),
                 dict(c=c, u=u, v=v, h_all=h_all, aux=aux, d_out=d_out, d_hT=d_hT),
                 dict(d_pre=d_pre, d_c=d_c, dp_all=dp_all, dh0=dh0))
        last_path["backward"] = path
        dpre2 = d_pre.view(T * B, D)
        du = dpre2.t() @ p_all.view(T * B, r)
        dv = dp_all.view(T * B, r).t() @ h_all[:T].reshape(T * B, D)
        db = dpre2.sum(0, dtype=_state_dtype(c.dtype)).to(c.dtype)
        return None, None, None, d_pre, d_c, du, dv, db, dh0


def validate_lowrank(mode: str, a, c, u, v, b, h0, path: str) -> None:
    """Everything about a low-rank call that needs no GPU (clear errors first)."""
    if mode not in MODES:
        raise ValueError(f"unknown low-rank mode {mode!r}; one of {sorted(MODES)}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    T, B, D = validate.sequence("a", a)
    validate.sequence("U", u, "[D, r]")
    r = u.shape[1]
    validate.size_limit("B * D", B * D)
    validate.shapes({"c": (c, (T, B, D)), "U": (u, (D, r)), "V": (v, (r, D)), "b": (b, (D,)),
                     "h0": (h0, (B, D))})
    tensors = {"a": a, "c": c, "U": u, "V": v, "b": b, "h0": h0}
    validate.dtypes(tensors, DTYPES)
    validate.devices(tensors)


def lowrank_cell(mode: str, a: torch.Tensor, c: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                 b: torch.Tensor, h0: torch.Tensor | None = None, path: str = "auto"):
    """The low-rank cell on the GPU: returns (out [T, B, D], h_T [B, D]), differentiable in
    a, c, U [D, r], V [r, D], b and h0. Inputs are validated before the extension loads."""
    validate_lowrank(mode, a, c, u, v, b, h0, path)
    T, B, D = a.shape
    chosen = plan(path, B, D, a.dtype, u.shape[1])
    if h0 is None:
        h0 = a.new_zeros(a.shape[1:])
    return LowRankCell.apply(cuda_stages(), MODES[mode], chosen, a, c, u, v, b, h0)


def lowrank_emulated(mode: str, a, c, u, v, b, h0):
    """The low-rank op's loops with the stages in PyTorch (any device and dtype): the CPU
    check of the schedule and the hand-derived gradients."""
    return LowRankCell.apply(torch_stages, MODES[mode], "steps", a, c, u, v, b, h0)


# ---- tape loops ----------------------------------------------------------------------------------
def tape_forward_loop(st, K: int, wx, z, w_h, w_wr, b, h0, tape0, out, w_all, tape_T, ckpt) -> None:
    """Forward on preallocated buffers: w_all [T+1, B, D], tape_T [B, N, D] (the working
    tape, updated in place), ckpt [ceil(T/K), B, N, D] (the tape before steps 0, K, 2K, ...)."""
    T = wx.shape[0]
    w_all[0].copy_(h0)
    tape_T.copy_(tape0)
    hw, u = torch.empty_like(h0), torch.empty_like(h0)
    for t in range(T):
        if t % K == 0:
            ckpt[t // K].copy_(tape_T)
        torch.mm(w_all[t], w_h.t(), out=hw)
        st.tape_read(wx[t], z[t], hw, b, tape_T, w_all[t], w_all[t + 1], out[t])
        torch.mm(w_all[t + 1], w_wr.t(), out=u)
        st.tape_write(tape_T, w_all[t + 1], u, tape_T)


def tape_backward_loop(st, K: int, z, w_h, w_wr, w_all, ckpt, d_out, d_hT, d_tapeT,
                       d_pre, d_u, d_z, dh0, d_tape0) -> None:
    """Backward on preallocated buffers: recomputes each segment's tapes from its checkpoint,
    then runs the two backward stages per step. d_tape0 (fp32 or wider) carries dL/dM."""
    T = d_out.shape[0]
    u_all = (w_all[1:].reshape(-1, w_all.shape[-1]) @ w_wr.t()).view(d_out.shape)
    seg = torch.empty((K, *ckpt.shape[1:]), dtype=ckpt.dtype, device=ckpt.device)
    g, gw = d_hT.clone(), torch.empty_like(d_hT)
    d_tape0.copy_(d_tapeT)
    for start in range((T - 1) // K * K, -1, -K):
        end = min(T, start + K)
        seg[0].copy_(ckpt[start // K])
        for j in range(1, end - start):
            st.tape_write(seg[j - 1], w_all[start + j], u_all[start + j - 1], seg[j])
        for i in range(end - 1, start - 1, -1):
            m = seg[i - start]
            st.tape_write_backward(m, d_tape0, w_all[i + 1], u_all[i], d_out[i], z[i], g,
                                   gw, d_u[i], d_z[i])
            gw.addmm_(d_u[i], w_wr)
            st.tape_read_backward(m, d_tape0, w_all[i], w_all[i + 1], gw, d_pre[i], g)
            g.addmm_(d_pre[i], w_h)
    dh0.copy_(g)


def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def tape_persistent_backward_interval(T: int, B: int, D: int, N: int, dtype: torch.dtype) -> int:
    """K of the persistent backward (the largest K <= ceil(sqrt(T)) whose segment of tapes fits
    on chip), or 0 where the persistent backward does not take this size."""
    ext = _ext()
    K = int(ext.tape_persistent_interval(T, D, N))
    if K < 1 or not ext.tape_persistent_backward_supported(B, D, N, K, dtype == torch.bfloat16)[0]:
        return 0
    return K


class TapeCell(torch.autograd.Function):
    """(x, z, W_x, W_h, W_wr, b, h0, tape0) -> (out, w_T, tape_T) of E23's step."""

    @staticmethod
    def forward(ctx, st, path, x, z, w_x, w_h, w_wr, b, h0, tape0):
        T, B, D = x.shape
        N = tape0.shape[1]
        x, z, w_x, w_h, w_wr, b, h0, tape0 = (validate.contiguous(t)
                                             for t in (x, z, w_x, w_h, w_wr, b, h0, tape0))
        K_bwd = tape_persistent_backward_interval(T, B, D, N, x.dtype) if path == "persistent" else 0
        K = K_bwd or checkpoint_interval(T)
        wx = (x.reshape(T * B, D) @ w_x.t()).view(T, B, D)
        out, w_all = ops.empty((T, B, D), x), ops.empty((T + 1, B, D), x)
        tape_T = ops.empty((B, N, D), x)
        ckpt = ops.empty(((T + K - 1) // K, B, N, D), x)
        saved = ()
        if path == "persistent":
            if K_bwd:  # what the persistent backward reads: u_t, alpha_t, beta_t
                saved = (ops.empty((T, B, D), x), ops.empty((T, B, N), x, torch.float32),
                         ops.empty((T, B, N), x, torch.float32))
            _ext().tape_persistent_forward(wx, z, w_h, w_wr, b, h0, tape0, out, w_all, tape_T,
                                           ckpt, K, *(saved or (None, None, None)))
        else:
            _run(path, "tape_forward", K, lambda **kw: tape_forward_loop(st, K, **kw),
                 dict(wx=wx, z=z, w_h=w_h, w_wr=w_wr, b=b, h0=h0, tape0=tape0),
                 dict(out=out, w_all=w_all, tape_T=tape_T, ckpt=ckpt))
        ctx.save_for_backward(x, z, w_x, w_h, w_wr, w_all, ckpt, *saved)
        ctx.st, ctx.path, ctx.K, ctx.persistent_backward = st, path, K, bool(saved)
        last_path["forward"] = path
        return out, w_all[T], tape_T

    @staticmethod
    def backward(ctx, d_out, d_hT, d_tapeT):
        x, z, w_x, w_h, w_wr, w_all, ckpt, *saved = ctx.saved_tensors
        T, B, D = x.shape
        dt = x.dtype
        d_out = (torch.zeros_like(x) if d_out is None else d_out).to(dt).contiguous()
        d_hT = (torch.zeros_like(w_all[0]) if d_hT is None else d_hT).to(dt).contiguous()
        sd = _state_dtype(dt)
        d_tapeT = (torch.zeros(ckpt.shape[1:], dtype=sd, device=x.device) if d_tapeT is None
                   else d_tapeT.to(sd).contiguous())
        d_pre, d_u, d_z = (ops.empty((T, B, D), x) for _ in range(3))
        dh0 = ops.empty((B, D), x)
        d_tape0 = ops.empty(tuple(ckpt.shape[1:]), x, sd)
        st, K = ctx.st, ctx.K
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if ctx.persistent_backward:
            path = "persistent"
        elif ctx.path == "persistent":  # the forward ran persistent; its backward does not take the size
            path = "steps" if capturing else "graph"
        else:
            path = "steps" if ctx.path == "graph" and capturing else ctx.path
        if path == "persistent":  # the kernel copies z and d_out in 16-byte rows
            u_all, alpha_all, beta_all = saved
            _ext().tape_persistent_backward(validate.aligned(z), w_h, w_wr, w_all, u_all, alpha_all,
                                            beta_all, ckpt, validate.aligned(d_out), d_hT, d_tapeT,
                                            d_pre, d_u, d_z, dh0, d_tape0, K)
        else:
            _run(path, "tape_backward", K, lambda **kw: tape_backward_loop(st, K, **kw),
                 dict(z=z, w_h=w_h, w_wr=w_wr, w_all=w_all, ckpt=ckpt, d_out=d_out, d_hT=d_hT,
                      d_tapeT=d_tapeT),
                 dict(d_pre=d_pre, d_u=d_u, d_z=d_z, dh0=dh0, d_tape0=d_tape0))
        last_path["backward"] = path
        dp2 = d_pre.view(T * B, D)
        dw_h = dp2.t() @ w_all[:T].reshape(T * B, D)
        dw_wr = d_u.view(T * B, D).t() @ w_all[1:].reshape(T * B, D)
        dw_x = dp2.t() @ x.view(T * B, D)
        dx = (dp2 @ w_x).view(T, B, D)
        db = dp2.sum(0, dtype=sd).to(dt)
        return None, None, dx, d_z, dw_x, dw_h, dw_wr, db, dh0, d_tape0.to(dt)


def validate_tape(x, z, w_x, w_h, w_wr, b, h0, tape0, path: str) -> None:
    """Everything about a tape call that needs no GPU (clear errors first): shapes, the slot
    count the kernels take (1 <= N <= MAX_SLOTS), dtypes, devices."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    T, B, D = validate.sequence("x", x)
    validate.sequence("tape0", tape0, "[B, N, D]")
    N = tape0.shape[1]
    if N > MAX_SLOTS:
        raise ValueError(f"the tape kernels do not take N = {N} slots (unsupported); they take "
                         f"1 <= N <= {MAX_SLOTS}")
    validate.size_limit("B * N * D", B * N * D)
    validate.shapes({"z": (z, (T, B, D)), "W_x": (w_x, (D, D)), "W_h": (w_h, (D, D)),
                     "W_wr": (w_wr, (D, D)), "b": (b, (D,)), "h0": (h0, (B, D)),
                     "tape0": (tape0, (B, N, D))})
    tensors = {"x": x, "z": z, "W_x": w_x, "W_h": w_h, "W_wr": w_wr, "b": b, "h0": h0, "tape0": tape0}
    validate.dtypes(tensors, DTYPES)
    validate.devices(tensors)


def tape_cell(x, z, w_x, w_h, w_wr, b, h0, tape0, path: str = "auto"):
    """E23's cell on the GPU: returns (out [T, B, D], w_T [B, D], tape_T [B, N, D]),
    differentiable in every input. h0 and tape0 are required (the layer passes zeros)."""
    validate_tape(x, z, w_x, w_h, w_wr, b, h0, tape0, path)
    T, B, D = x.shape
    chosen = plan(path, B, D, x.dtype, slots=tape0.shape[1])
    return TapeCell.apply(cuda_stages(), chosen, x, z, w_x, w_h, w_wr, b, h0, tape0)


def tape_emulated(x, z, w_x, w_h, w_wr, b, h0, tape0):
    """The tape op's loops and checkpoint/recompute schedule with the stages in PyTorch."""
    return TapeCell.apply(torch_stages, "steps", x, z, w_x, w_h, w_wr, b, h0, tape0)
