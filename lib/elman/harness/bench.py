"""`elman bench`: kernel and layer benchmarks, with the baselines measured in the same run.

Method (DESIGN.md "Benchmarks"): CUDA events around each repetition, warm-up first, the
median of many repetitions with p20/p80, inputs rotated over enough sets that the L2
cache does not serve them, random data (never zeros). Every op is timed only after its
parity passed in the same run (`ensure_parity`).

Measures, for each (B, D) at T = 512, bf16:
- `cell`: the recurrence alone on precomputed input projections, forward and forward +
  backward (the op's own gradients); `per_step_us` = forward / T. Implementations:
  `cuda:persistent`, `cuda:steps` (cuBLAS per step from a stream), `cuda:steps+graph`
  (the same captured in a CUDA graph), `torch:eager` (a PyTorch loop), `cudnn:fp16` and
  `cudnn:bf16` (`torch.nn.RNN(tanh)`, whose input GEMM is inside its time).
- `recurrent_layer`: E1's cell with its input GEMM W_x x and every gradient, as cuDNN's
  RNN layer counts one (the issue's "one layer forward+backward"), beside cuDNN fp16/bf16.
  In `cell` and `recurrent_layer` every implementation returns its gradients
  (`torch.autograd.grad`) instead of adding them into the inputs' `.grad`: inside a network
  the input is an activation, and the accumulation (three passes over [T, B, D] for x and
  again for z) is not part of a layer's work. Until session 7 both sides paid it.
- `layer`: one registered layer (variant or baseline) at width D, forward and forward +
  backward under bf16 autocast with fp32 weights, tokens/s and peak memory.
- `primitive` (`--primitives`): the synchronisation costs a time step pays.
"""
from __future__ import annotations

import inspect
import statistics
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import registry
from ..core import extension as ops, records
from ..families.dense import inputs, op as dense
from . import parity

TRACE_PHASES = ("wait for state", "multiply", "inputs + partials", "epilogue", "send")

T_DEFAULT = 512
SHAPES_B = (4, 16, 64)
SHAPES_D = (512, 1024, 2048)


def timeit(fn: Callable[[int], None], reps: int = 30, warmup: int = 5, rotate: int = 1) -> dict:
    """Median / p20 / p80 milliseconds of fn(i) over `reps` calls, i cycling over `rotate`
    input sets, each call between its own pair of CUDA events."""
    for i in range(warmup):
        fn(i % rotate)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i % rotate)
        ends[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    q = statistics.quantiles(ms, n=5) if len(ms) >= 5 else [ms[0]] * 4
    return {"median": statistics.median(ms), "p20": q[0], "p80": q[3], "reps": reps}


def rotation(bytes_per_set: int, l2_bytes: int | None = None) -> int:
    """How many input sets to rotate so that together they exceed twice the L2 cache."""
    l2 = l2_bytes or torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(64, -(-2 * l2 // max(1, bytes_per_set))))


# ---- parity gate ------------------------------------------------------------------------
_PASSED: dict[tuple[str, str], bool] = {}


def ensure_parity(entry: registry.Entry, dtype: str = "bfloat16") -> dict[str, bool]:
    """{impl: passed} for the entry in this run: read from this run's records, or checked
    now (and recorded) if the run has none."""
    recs = [r for r in records.read([records.run_dir()], kind="parity")
            if r["variant"] == entry.name and r["params"]["dtype"] == dtype]
    if not recs and entry.parity is not None:
        recs = parity.check_entry(entry, [dtype])
        records.write(recs)
    status: dict[str, bool] = {}
    for r in recs:
        status[r["impl"]] = status.get(r["impl"], True) and r["metrics"]["passed"]
    return status


# ---- the recurrence alone ---------------------------------------------------------------
def _cell_inputs(T, B, D, n, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(1234)
    sets = []
    for _ in range(n):
        t = inputs.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g)
        t = {k: v.detach().to(dtype) for k, v in t.items()}
        t["wx"] = t.pop("x")
        t["d_out"] = torch.randn(T, B, D, device="cuda", dtype=dtype, generator=g)
        t["d_hT"] = torch.randn(B, D, device="cuda", dtype=dtype, generator=g)
        sets.append(t)
    return sets


def _op_fns(sets, persistent: bool):
    ext = ops.load()
    T, B, D = sets[0]["wx"].shape
    like = sets[0]["wx"]
    out, h_all = torch.empty_like(like), like.new_empty(T + 1, B, D)
    dv, dz, dh0 = torch.empty_like(like), torch.empty_like(like), like.new_empty(B, D)

    def fwd(i):
        s = sets[i]
        ext.dense_forward(s["wx"], s["z"], s["w_h"], s["b"], s["h0"], out, h_all, dense.GATE_SILU,
                          persistent)

    def fwdbwd(i):
        fwd(i)
        s = sets[i]
        ext.dense_backward(s["w_h"], h_all, s["z"], s["d_out"], s["d_hT"], dv, dz, dh0,
                           dense.GATE_SILU, persistent)
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


def _eager_fns(sets):
    def run(s):
        h, outs = s["h0"], []
        for t in range(s["wx"].shape[0]):
            h = torch.tanh(s["wx"][t] + h @ s["w_h"].t() + s["b"])
            outs.append(h * F.silu(s["z"][t]))
        return torch.stack(outs), h

    def fwd(i):
        with torch.no_grad():
            run(sets[i])

    def fwdbwd(i):
        s = {k: (v.requires_grad_() if k in ("wx", "z", "w_h", "b", "h0") else v)
             for k, v in sets[i].items()}
        out, h = run(s)
        torch.autograd.grad((out, h), [s[k] for k in ("wx", "z", "w_h", "b", "h0")],
                            (s["d_out"], s["d_hT"]))
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


def cell_records(B: int, D: int, T: int = T_DEFAULT, reps: int = 30, quick: bool = False,
                 impls: tuple[str, ...] | None = None, gate: dict[str, bool] | None = None) -> list[dict]:
    """Time every implementation of the E1/E0 recurrence at one shape."""
    per_set = 5 * T * B * D * 2
    n = 2 if quick else rotation(per_set)
    sets = _cell_inputs(T, B, D, n)
    persistent_ok = dense.plan(B, D, torch.bfloat16) == "persistent"
    fns: dict[str, tuple] = {}
    if persistent_ok:
        fns["cuda:persistent"] = _op_fns(sets, True)
    fns["cuda:steps"] = _op_fns(sets, False)
    f, fb = _op_fns(sets, False)
    fns["cuda:steps+graph"] = (_graphed(f, n), _graphed(fb, n))
    fns["torch:eager"] = _eager_fns(sets)
    fns["cudnn:fp16"] = _cudnn_fns(T, B, D, n, torch.float16)
    fns["cudnn:bf16"] = _cudnn_fns(T, B, D, n, torch.bfloat16)
    out = []
    for impl, (fwd, fwdbwd) in fns.items():
        if impls and impl not in impls:
            continue
        if gate is not None and impl.startswith("cuda:") and not gate.get(impl.split("+")[0], False):
            print(f"bench: skipping {impl} at B={B} D={D}: no passing parity in this run")
            continue
        slow = impl in ("torch:eager",) or (impl == "cudnn:bf16" and D >= 1024)
        r = max(5, reps // 4) if slow else reps
        tf = timeit(fwd, r, 3, n)
        tfb = timeit(fwdbwd, r, 3, n)
        out.append(records.make("bench", "E1", impl,
                                {"measure": "cell", "B": B, "T": T, "D": D, "dtype": "bfloat16"},
                                {"fwd_ms": tf, "fwdbwd_ms": tfb,
                                 "per_step_us": 1000 * tf["median"] / T,
                                 "per_step_fwdbwd_us": 1000 * tfb["median"] / T}))
    del sets, fns
    torch.cuda.empty_cache()
    return out


def recurrent_layer_records(B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False) -> list[dict]:
    """E1's recurrent layer as cuDNN's RNN layer counts one: the input GEMM W_x x inside,
    every gradient (x, z, W_x, W_h, b, h0) in the backward; next to cuDNN's fp16 and bf16
    `nn.RNN(tanh)` timed the same way. Measure `recurrent_layer`."""
    per_set = 6 * T * B * D * 2
    n = 2 if quick else rotation(per_set)
    g = torch.Generator(device="cuda").manual_seed(4321)
    sets = []
    for _ in range(n):
        t = inputs.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g)
        sets.append({k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in t.items()})
    grad = torch.randn(T, B, D, device="cuda", dtype=torch.bfloat16, generator=g)

    def fwd(i):
        with torch.no_grad():
            dense.gated_cell_cuda(**sets[i])

    def fwdbwd(i):
        out, _ = dense.gated_cell_cuda(**sets[i])
        torch.autograd.grad(out, list(sets[i].values()), grad)
    fns = {"cuda:" + dense.plan(B, D, torch.bfloat16): (fwd, fwdbwd),
           "cudnn:fp16": _cudnn_fns(T, B, D, n, torch.float16),
           "cudnn:bf16": _cudnn_fns(T, B, D, n, torch.bfloat16)}
    out = []
    for impl, (f, fb) in fns.items():
        r = max(5, reps // 4) if impl == "cudnn:bf16" and D >= 1024 else reps
        tf, tfb = timeit(f, r, 3, n), timeit(fb, r, 3, n)
        out.append(records.make("bench", "E1", impl,
                                {"measure": "recurrent_layer", "B": B, "T": T, "D": D,
                                 "dtype": "bfloat16"},
                                {"fwd_ms": tf, "fwdbwd_ms": tfb,
                                 "tokens_per_s": B * T / (tfb["median"] / 1000)}))
    del sets, fns
    torch.cuda.empty_cache()
    return out


# ---- whole layers ---------------------------------------------------------------------
def layer_record(entry: registry.Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 20,
                 dtype: str = "bfloat16", quick: bool = False, impl: str | None = None,
                 **options) -> dict:
    """Forward and forward+backward of one layer of width D, fp32 weights under autocast
    (or, for entries that run in a fixed dtype such as cuDNN fp16, in that dtype)."""
    torch.manual_seed(0)
    dt = parity.DTYPES[dtype]
    if "rnn_dtype" in inspect.signature(entry.layer).parameters:
        options = {"rnn_dtype": dtype, **options}  # cuDNN baselines run in a fixed dtype
    layer = entry.layer(D, 1.0, backend="cuda", **options).cuda()
    n = 2 if quick else rotation(T * B * D * 2 * 2)
    g = torch.Generator(device="cuda").manual_seed(7)
    ys = [torch.randn(B, T, D, device="cuda", generator=g).requires_grad_() for _ in range(n)]
    grad = torch.randn(B, T, D, device="cuda", dtype=dt, generator=g)
    autocast = torch.autocast("cuda", dtype=dt)

    def fwd(i):
        with torch.no_grad(), autocast:
            layer(ys[i])

    def fwdbwd(i):
        with autocast:
            out, _ = layer(ys[i])
        out.backward(grad.to(out.dtype))

    tf = timeit(fwd, reps, 3, n)
    fwdbwd(0)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwdbwd(1 % n)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    tfb = timeit(fwdbwd, reps, 3, n)
    params = sum(p.numel() for p in layer.parameters())
    # a baseline layer may say which library path ran (fla-gdn: who computed chunk_bwd_dqkwg)
    ran = impl or ("cuda:" + dense.last_path.get("forward", "?") if entry.kind == "variant"
                   else getattr(layer, "impl", f"{entry.name}:{dtype}"))
    return records.make("bench", entry.name, ran,
                        {"measure": "layer", "B": B, "T": T, "D": D, "dtype": dtype, "expansion": 1.0,
                         "layer_params": params, **options},
                        {"fwd_ms": tf, "fwdbwd_ms": tfb,
                         "tokens_per_s": B * T / (tfb["median"] / 1000), "peak_mem_mb": peak})


# ---- primitives -------------------------------------------------------------------------
def warm_up(seconds: float = 0.5) -> None:
    """Keep the GPU busy for a moment so that its clocks leave the idle state."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > 1000 * seconds:
            return


ALLGATHER_METHODS = ("st_async", "bulk", "multicast")  # lib/csrc/primitives.cu allgather_kernel


def primitive_records(iters: int = 2000) -> list[dict]:
    """Per-operation cost of the primitives a persistent time step is built from."""
    ext = ops.load()
    warm_up()
    flags = torch.zeros(64, dtype=torch.int32, device="cuda")
    results: dict[str, float] = {}

    def per_iter(launch, n=iters):
        def once(k):
            flags.zero_()
            launch(k)
        t_n = timeit(lambda i: once(n), 10, 2)["median"]
        t_0 = timeit(lambda i: once(0), 10, 2)["median"]
        return 1000 * (t_n - t_0) / n  # us

    results["launch_from_stream_us"] = 1000 * timeit(lambda i: ext.empty(), 200, 20)["median"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(100):
            ext.empty()
    results["kernel_in_graph_us"] = 1000 * timeit(lambda i: g.replay(), 50, 5)["median"] / 100
    results["grid_sync_cg_us"] = per_iter(lambda k: ext.grid_sync(k, True, flags))
    results["grid_barrier_atomic_us"] = per_iter(lambda k: ext.grid_sync(k, False, flags))
    results["l2_flag_one_way_us"] = per_iter(lambda k: ext.flag_pingpong(k, flags)) / 2
    for c in (2, 8, 16):
        results[f"cluster_barrier_{c}_us"] = per_iter(lambda k, c=c: ext.cluster_sync(c, k))
    results["dsmem_one_way_us"] = per_iter(lambda k: ext.dsmem_pingpong(k)) / 2
    # The state exchange alone, as the persistent kernels do it (st.async) and two
    # alternatives: C CTAs, each sending a slice of 64 rows x 8 or 16 columns (bf16).
    scratch = torch.empty(2 * 16 * 2048, dtype=torch.uint8, device="cuda")
    for method, how in enumerate(ALLGATHER_METHODS):
        for c in (8, 16):
            for nbytes in (1024, 2048):
                results[f"allgather_{how}_{c}x{nbytes}B_us"] = per_iter(
                    lambda k, m=method, c=c, b=nbytes: ext.allgather(m, c, b, k, scratch))
    a = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    g2 = torch.cuda.CUDAGraph()
    torch.mm(a, w)
    with torch.cuda.graph(g2):
        for _ in range(100):
            torch.mm(a, w)
    results["cublas_gemm_4x512x512_in_graph_us"] = 1000 * timeit(lambda i: g2.replay(), 50, 5)["median"] / 100
    return [records.make("bench", "primitive", name, {"measure": "primitive", "iters": iters},
                         {"us": value}) for name, value in results.items()]


CLOCK_WORK = ("fma", "mma", "mma_bursts")  # lib/csrc/primitives.cu clock_probe_kernel
CLOCK_SMS = (16, 32, 128)


def clock_records() -> list[dict]:
    """The SM clock a kernel runs at, by the kind of work it does: clock64 against the GPU's
    nanosecond timer (%globaltimer) in each of `sms` CTAs of 512 threads, one per SM, for
    about a millisecond: FMAs alone, mma.sync back to back, or mma.sync in short bursts every
    2 us (see lib/csrc/primitives.cu). Median, min and max over the CTAs of the third launch.
    nvidia-smi's SM clock does not show the difference (it read 1980 MHz throughout, with no
    clock-event reason, in run dev-s8a), and the ratio inherits the timer's accuracy."""
    ext = ops.load()
    warm_up()
    rounds = {"fma": 4000, "mma": 1000, "mma_bursts": 500}
    out = []
    for sms in CLOCK_SMS:
        for w, work in enumerate(CLOCK_WORK):
            t = torch.zeros(2 * sms, dtype=torch.int64, device="cuda")
            for _ in range(3):
                ext.clock_probe(w, sms, rounds[work], t)
            torch.cuda.synchronize()
            cycles, ns = t.view(sms, 2).double().unbind(1)
            ghz = (cycles / ns).sort().values
            out.append(records.make("bench", "primitive", f"sm_clock_{work}",
                                    {"measure": "clock", "work": work, "sms": sms},
                                    {"ghz": ghz.median().item(), "min_ghz": ghz[0].item(),
                                     "max_ghz": ghz[-1].item(), "ms": ns.median().item() / 1e6}))
    return out


def trace_record(B: int, D: int, T: int = T_DEFAULT) -> dict:
    """Where a persistent forward step spends its time: CTA 0's clock at six boundaries of
    every step (see lib/csrc/dense_persistent.cu), as median nanoseconds per phase."""
    ext = ops.load()
    s = _cell_inputs(T, B, D, 1)[0]
    out, h_all = torch.empty_like(s["wx"]), s["wx"].new_empty(T + 1, B, D)
    trace = torch.zeros(T * 6 + 4, dtype=torch.int64, device="cuda")
    for _ in range(3):
        ext.dense_forward(s["wx"], s["z"], s["w_h"], s["b"], s["h0"], out, h_all, dense.GATE_SILU,
                          True, trace)
    torch.cuda.synchronize()
    tr = trace.cpu()
    clocks = tr[: T * 6].view(T, 6)[T // 8:]  # steady state: skip the first steps
    c0, g0, c1, g1 = tr[T * 6:].tolist()
    ghz = (c1 - c0) / (g1 - g0)
    phases = (clocks[:, 1:] - clocks[:, :-1]).double().median(dim=0).values / ghz
    step = (clocks[1:, 0] - clocks[:-1, 0]).double().median().item() / ghz
    return records.make("bench", "E1", "cuda:persistent",
                        {"measure": "trace", "B": B, "T": T, "D": D, "dtype": "bfloat16"},
                        {"sm_clock_ghz": ghz, "step_ns": step,
                         "phase_ns": dict(zip(TRACE_PHASES, phases.tolist()))})


# ---- command --------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--B", type=int, nargs="*", default=list(SHAPES_B))
    p.add_argument("--D", type=int, nargs="*", default=list(SHAPES_D))
    p.add_argument("--T", type=int, default=T_DEFAULT)
    p.add_argument("--levels", nargs="*", help="layers to time (default: every variant and baseline)")
    p.add_argument("--no-cell", action="store_true", help="skip the recurrence-only comparison")
    p.add_argument("--no-layers", action="store_true", help="skip whole-layer timings")
    p.add_argument("--primitives", action="store_true", help="also time the synchronisation primitives")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="few repetitions, two input sets")


def main(args) -> int:
    if not torch.cuda.is_available():
        print("elman bench: no CUDA device; benchmarks run on a GPU only")
        return 2
    reps = 5 if args.quick else args.reps
    recs: list[dict] = []
    if args.primitives:
        recs += primitive_records(200 if args.quick else 2000) + clock_records()
        recs += [trace_record(B, D, args.T) for D in args.D for B in args.B
                 if dense.plan(B, D, torch.bfloat16) == "persistent"]
        records.write(recs)
    warm_up()
    gate = ensure_parity(registry.get("E1"))
    shapes = [(B, D) for D in args.D for B in args.B]
    if not args.no_cell:
        for B, D in tqdm(shapes, desc="cell"):
            new = cell_records(B, D, args.T, reps, args.quick, gate=gate)
            if gate.get("cuda:" + dense.plan(B, D, torch.bfloat16)):
                new += recurrent_layer_records(B, D, args.T, reps, args.quick)
            records.write(new)
            recs += new
    if not args.no_layers:
        entries = [registry.get(l) for l in args.levels] if args.levels else registry.entries()
        for e in tqdm(entries, desc="layers"):
            for dt in [d for d in e.dtypes if d != "float32"] or ["bfloat16"]:
                status = ensure_parity(e, dt) if e.parity is not None else {}
                if e.parity is not None and (not status or not all(status.values())):
                    print(f"bench: skipping {e.name} {dt}: parity did not pass in this run ({status})")
                    continue
                for B, D in shapes:
                    try:
                        new = layer_record(e, B, D, args.T, max(5, reps // 2), dt, args.quick)
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        print(f"bench: {e.name} B={B} D={D} {dt}: out of memory, not recorded")
                        continue
                    except RuntimeError as exc:  # a library that refuses a size: say so, go on
                        print(f"bench: {e.name} B={B} D={D} {dt}: {exc}".splitlines()[0])
                        continue
                    records.write(new)
                    recs.append(new)
    print(summary(recs))
    print(f"records: {records.run_dir() / 'records.jsonl'}")
    return 0


def summary(recs: list[dict]) -> str:
    lines = []
    for r in recs:
        p, m = r["params"], r["metrics"]
        if p["measure"] == "primitive":
            lines.append(f"primitive {r['impl']:<36} {m['us']:8.3f} us")
        elif p["measure"] == "clock":
            lines.append(f"clock {p['work']:<10} on {p['sms']:>3} SMs  {m['ghz']:.3f} GHz "
                         f"(min {m['min_ghz']:.3f}, max {m['max_ghz']:.3f})")
        elif p["measure"] == "trace":
            phases = "  ".join(f"{k} {v:6.0f}" for k, v in m["phase_ns"].items())
            lines.append(f"trace B={p['B']:<3} D={p['D']:<5} step {m['step_ns']:6.0f} ns at "
                         f"{m['sm_clock_ghz']:.2f} GHz: {phases}")
        elif p["measure"] == "recurrent_layer":
            lines.append(f"rnn   {r['impl']:<18} B={p['B']:<3} D={p['D']:<5} "
                         f"fwd {m['fwd_ms']['median']:8.3f} ms  fwd+bwd {m['fwdbwd_ms']['median']:8.3f} ms")
        elif p["measure"] == "cell":
            lines.append(f"cell  {r['impl']:<18} B={p['B']:<3} D={p['D']:<5} "
                         f"{m['per_step_us']:8.2f} us/step  fwd+bwd {m['fwdbwd_ms']['median']:8.3f} ms")
        else:
            lines.append(f"layer {r['variant']:<8} {r['impl']:<18} {p['dtype']:<8} B={p['B']:<3} D={p['D']:<5} "
                         f"fwd {m['fwd_ms']['median']:8.3f} ms  fwd+bwd {m['fwdbwd_ms']['median']:8.3f} ms  "
                         f"{m['tokens_per_s']:12.0f} tok/s")
    return "\n".join(lines)
