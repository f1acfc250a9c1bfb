"""The dense family's cell benchmarks (bf16, random inputs, timed as core.timing times).

- `cell_records`: the recurrence alone on precomputed input projections wx = W_x x, forward
  and forward + backward of the raw op (`op.forward_into` / `op.backward_into`, the op's own
  gradients); `per_step_us` = forward / T. Implementations: `cuda:persistent`, `cuda:steps`
  (cuBLAS per step from a stream), `cuda:steps+graph` (the same captured in a CUDA graph),
  `torch:eager` (a sequential PyTorch loop of the same step and epilogue), `cudnn:fp16` and
  `cudnn:bf16` (`torch.nn.RNN(tanh)`, the family's library baseline, whose input GEMM is
  inside its time).
- `recurrent_layer_records`: the op with its input GEMM W_x x and every gradient, as
  cuDNN's RNN layer counts one, beside cuDNN fp16/bf16. The op's operands follow the
  entry's reference: no W_x (E38, E39: wx = x) or no bias (E39) where its reference has
  none, one tensor as W_x and W_h where it takes a tied `w` (E37, E42); E56's `w_xh` runs as
  its two halves, which is E1's op.

In both, every implementation returns its gradients (`torch.autograd.grad`) instead of
adding them into the inputs' `.grad`: inside a network the input is an activation, and the
accumulation (three passes over each [T, B, D] input) is not part of a layer's work.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, rotation, timeit
from . import inputs, op


def _tanh_silu_gate(v: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.tanh(v)
    return h, h * F.silu(z)


def _tanh_self_gate(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.tanh(v)
    return h, h * F.silu(h)


def _linear_self_gate(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return v, v * F.silu(v)


# The epilogues in PyTorch, by the op's epilogue name: (v_t, *gates_t) -> (h_t, out_t).
STEPS = {"tanh_silu_gate": _tanh_silu_gate, "tanh_self_gate": _tanh_self_gate,
         "linear_self_gate": _linear_self_gate}


def gate_count(epilogue: str) -> int:
    """How many per-step [T, B, D] inputs the op's epilogue takes."""
    gates = op.epilogues()[epilogue]["gates"]
    return gates if isinstance(gates, int) else len(gates)


def has_cell(entry: Entry) -> bool:
    """Whether the entry's cell runs the dense op (so the cell benchmark applies)."""
    return entry.family == "dense" and entry.epilogue is not None


def _params(measure: str, B: int, D: int, T: int) -> dict:
    return {"measure": measure, **Shape(T, B, D).params(), "dtype": "bfloat16"}


def _cell_inputs(epilogue: str, T: int, B: int, D: int, n: int, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(1234)
    count = gate_count(epilogue)
    sets = []
    for _ in range(n):
        t = inputs.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g)
        t = {name: v.detach().to(dtype) for name, v in t.items()}
        t["wx"] = t.pop("x")
        t["gates"] = (t.pop("z"), *(torch.randn(T, B, D, device="cuda", dtype=dtype, generator=g)
                                    for _ in range(count - 1)))[:count]
        t["d_out"] = torch.randn(T, B, D, device="cuda", dtype=dtype, generator=g)
        t["d_hT"] = torch.randn(B, D, device="cuda", dtype=dtype, generator=g)
        sets.append(t)
    return sets


def _op_fns(epilogue: str, sets, path: str):
    T, B, D = sets[0]["wx"].shape
    like = sets[0]["wx"]
    out, h_all = torch.empty_like(like), like.new_empty(T + 1, B, D)
    dv, dh0 = torch.empty_like(like), like.new_empty(B, D)
    d_gates = tuple(torch.empty_like(like) for _ in sets[0]["gates"])

    def fwd(i):
        s = sets[i]
        op.forward_into(path, epilogue, s["wx"], s["gates"], s["w_h"], s["b"], s["h0"], out, h_all)

    def fwdbwd(i):
        fwd(i)
        s = sets[i]
        op.backward_into(path, epilogue, s["w_h"], h_all, s["gates"], s["d_out"], s["d_hT"], dv,
                         d_gates, dh0)
    return fwd, fwdbwd


def _graphed(fn, n):
    """One CUDA graph per input set, capturing fn(i)."""
    graphs = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(n):
            fn(i)  # warm-up outside capture (cuBLAS handles, workspaces)
    torch.cuda.current_stream().wait_stream(stream)
    for i in range(n):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(i)
        graphs.append(g)
    return lambda i: graphs[i].replay()


def _eager_fns(epilogue: str, sets):
    step = STEPS[epilogue]

    def run(wx, gates, w_h, b, h0):
        h, outs = h0, []
        for t in range(wx.shape[0]):
            h, out = step(wx[t] + h @ w_h.t() + b, *(g[t] for g in gates))
            outs.append(out)
        return torch.stack(outs), h

    def fwd(i):
        s = sets[i]
        with torch.no_grad():
            run(s["wx"], s["gates"], s["w_h"], s["b"], s["h0"])

    def fwdbwd(i):
        s = sets[i]
        leaves = [t.detach().requires_grad_() for t in (s["wx"], *s["gates"], s["w_h"], s["b"], s["h0"])]
        wx, gates, (w_h, b, h0) = leaves[0], leaves[1:-3], leaves[-3:]
        out, h = run(wx, gates, w_h, b, h0)
        torch.autograd.grad((out, h), leaves, (s["d_out"], s["d_hT"]))
    return fwd, fwdbwd


def _cudnn_fns(T, B, D, n, dtype):
    rnn = torch.nn.RNN(D, D, nonlinearity="tanh").cuda().to(dtype)
    g = torch.Generator(device="cuda").manual_seed(99)
    xs = [torch.randn(T, B, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
          for _ in range(n)]
    h0 = torch.randn(1, B, D, device="cuda", dtype=dtype, generator=g)
    grad = torch.randn(T, B, D, device="cuda", dtype=dtype, generator=g)

    def fwd(i):
        with torch.no_grad():
            rnn(xs[i], h0)

    def fwdbwd(i):
        out, _ = rnn(xs[i], h0)
        torch.autograd.grad(out, [xs[i], *rnn.parameters()], grad)
    return fwd, fwdbwd


def _slow(impl: str, D: int) -> bool:
    """The implementations timed with a quarter of the repetitions (seconds per call)."""
    return impl == "torch:eager" or (impl == "cudnn:bf16" and D >= 1024)


def cell_record(entry: Entry, impl: str, fwd, fwdbwd, B: int, D: int, T: int, reps: int,
                n: int) -> dict:
    """One "cell" record: `fwd(i)` and `fwdbwd(i)` over `n` input sets timed `reps` times."""
    tf, tfb = timeit(fwd, reps, 3, n), timeit(fwdbwd, reps, 3, n)
    return records.make("bench", entry.name, impl, _params("cell", B, D, T),
                        {"fwd_ms": tf, "fwdbwd_ms": tfb, "per_step_us": 1000 * tf["median"] / T,
                         "per_step_fwdbwd_us": 1000 * tfb["median"] / T})


def cell_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                 quick: bool = False, impls: tuple[str, ...] | None = None,
                 gate: dict[str, bool] | None = None) -> list[dict]:
    """Time every implementation of the entry's recurrence (its epilogue) at one shape.
    `gate` ({impl: parity passed}) skips the CUDA paths that did not pass in this run."""
    epilogue = entry.epilogue
    per_set = (4 + gate_count(epilogue)) * T * B * D * 2
    n = 2 if quick else rotation(per_set)
    sets = _cell_inputs(epilogue, T, B, D, n)
    fns: dict[str, tuple] = {}
    if op.plan(B, D, torch.bfloat16, epilogue=epilogue) == "persistent":
        fns["cuda:persistent"] = _op_fns(epilogue, sets, "persistent")
    fns["cuda:steps"] = _op_fns(epilogue, sets, "steps")
    f, fb = _op_fns(epilogue, sets, "steps")
    fns["cuda:steps+graph"] = (_graphed(f, n), _graphed(fb, n))
    fns["torch:eager"] = _eager_fns(epilogue, sets)
    fns["cudnn:fp16"] = _cudnn_fns(T, B, D, n, torch.float16)
    fns["cudnn:bf16"] = _cudnn_fns(T, B, D, n, torch.bfloat16)
    out = []
    for impl, (fwd, fwdbwd) in fns.items():
        if impls and impl not in impls:
            continue
        if gate is not None and impl.startswith("cuda:") and not gate.get(impl.split("+")[0], False):
            print(f"bench: skipping {entry.name} {impl} at B={B} D={D}: no passing parity in this run")
            continue
        out.append(cell_record(entry, impl, fwd, fwdbwd, B, D, T,
                               max(5, reps // 4) if _slow(impl, D) else reps, n))
    del sets, fns
    torch.cuda.empty_cache()
    return out


def recurrent_layer_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False, gate: dict[str, bool] | None = None) -> list[dict]:
    """The entry's op as cuDNN's RNN layer counts one: the input GEMM W_x x inside, every
    gradient (x, the gates, W_x, W_h, b, h0) in the backward; next to cuDNN's fp16 and bf16
    `nn.RNN(tanh)` timed the same way. Measure `recurrent_layer`. Nothing is timed when
    `gate` says the path that runs this size did not pass parity in this run."""
    path = "cuda:" + op.plan(B, D, torch.bfloat16, epilogue=entry.epilogue)
    if gate is not None and not gate.get(path, False):
        print(f"bench: skipping {entry.name} recurrent_layer at B={B} D={D}: {path} has no "
              "passing parity in this run")
        return []
    epilogue = entry.epilogue
    count = gate_count(epilogue)
    per_set = (5 + count) * T * B * D * 2
    n = 2 if quick else rotation(per_set)
    g = torch.Generator(device="cuda").manual_seed(4321)
    given = set(inspect.signature(entry.reference).parameters)
    sets = []
    for _ in range(n):
        t = inputs.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g)
        t = {name: v.detach().to(torch.bfloat16).requires_grad_() for name, v in t.items()}
        extra = [torch.randn(T, B, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                 for _ in range(count - 1)]
        w_x = t["w_h"] if "w" in given else (t["w_x"] if given & {"w_x", "w_xh"} else None)
        b = t["b"] if "b" in given else None
        sets.append((t["x"], (t["z"], *extra)[:count], w_x, t["w_h"], b, t["h0"]))
    grad = torch.randn(T, B, D, device="cuda", dtype=torch.bfloat16, generator=g)

    def fwd(i):
        with torch.no_grad():
            op.cell(epilogue, *sets[i])

    def fwdbwd(i):
        x, gates, *rest = sets[i]
        out, _ = op.cell(epilogue, *sets[i])
        leaves = list({id(v): v for v in (x, *gates, *rest) if v is not None}.values())
        torch.autograd.grad(out, leaves, grad)
    fns = {path: (fwd, fwdbwd),
           "cudnn:fp16": _cudnn_fns(T, B, D, n, torch.float16),
           "cudnn:bf16": _cudnn_fns(T, B, D, n, torch.bfloat16)}
    out = []
    for impl, (f, fb) in fns.items():
        r = max(5, reps // 4) if impl == "cudnn:bf16" and D >= 1024 else reps
        tf, tfb = timeit(f, r, 3, n), timeit(fb, r, 3, n)
        out.append(records.make("bench", entry.name, impl, _params("recurrent_layer", B, D, T),
                                {"fwd_ms": tf, "fwdbwd_ms": tfb,
                                 "tokens_per_s": B * T / (tfb["median"] / 1000)}))
    del sets, fns
    torch.cuda.empty_cache()
    return out


def last_impl() -> str:
    """What the op's last forward ran, for a layer record: "cuda:<path>"."""
    return "cuda:" + op.last_path.get("forward", "?")
