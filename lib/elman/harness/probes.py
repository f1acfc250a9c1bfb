"""Probes of the development extension (`extension.load("dev")`): what a persistent time
step is built from and where it spends its time.

- `primitive_records`: the per-operation cost of the synchronisation primitives a step
  pays (launches, grid and cluster barriers, flags, DSMEM, all-gathers, a small GEMM).
- `clock_records`: the SM clock a kernel runs at, by the kind of work it does.
- `floor_records`: what a kernel's floor is computed from (the matrix family's `floor`): a
  device-to-device copy's bandwidth (`copy_record`), tanh.approx and FMA issue rates
  (`throughput_records`), the SM clock.
- `trace_record`: CTA 0's clock at the phase boundaries of every persistent forward step.
"""
from __future__ import annotations

import torch

from ..core import extension, records
from ..core.entry import Entry, Shape
from ..core.timing import copy_bandwidth, timeit, warm_up
from ..families.dense import inputs, op
from ..families.dense.bench import T_DEFAULT, gate_count

# the phases of a persistent forward step, between the six clock reads per step that
# lib/csrc's traced dense forward takes (records keep them by name, in this order)
TRACE_PHASES = ("wait for state", "multiply", "inputs + partials", "epilogue", "send")
ALLGATHER_METHODS = ("st_async", "bulk", "multicast")  # the dev extension's allgather methods
CLOCK_WORK = ("fma", "mma", "mma_bursts")  # the dev extension's clock_probe work kinds
CLOCK_SMS = (16, 32, 128)


def primitive_records(iters: int = 2000) -> list[dict]:
    """Per-operation cost of the primitives a persistent time step is built from."""
    ext = extension.load("dev")
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


def clock_records() -> list[dict]:
    """The SM clock a kernel runs at, by the kind of work it does: clock64 against the GPU's
    nanosecond timer (%globaltimer) in each of `sms` CTAs of 512 threads, one per SM, for
    about a millisecond: FMAs alone, mma.sync back to back, or mma.sync in short bursts every
    2 us. Median, min and max over the CTAs of the third launch. nvidia-smi's SM clock does
    not show the difference (it reads its nominal clock throughout, with no clock-event
    reason), and the ratio inherits the timer's accuracy."""
    ext = extension.load("dev")
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


THROUGHPUT_OPS = ("tanh_approx", "ex2_approx", "fma")


def sm_rates(out: torch.Tensor, per_cta: float) -> torch.Tensor:
    """Per SM, the instructions its CTAs ran over the span of its clock from the first CTA's
    start to the last CTA's end; `out` holds (SM, start, end) per CTA, `per_cta` the
    instructions of one CTA."""
    sm, start, end = out.view(-1, 3).cpu().double().unbind(1)
    rates = []
    for s in sm.unique():
        on = sm == s
        rates.append(on.sum().item() * per_cta / (end[on].max() - start[on].min()).item())
    return torch.tensor(rates, dtype=torch.float64)


def throughput_records(iters: int = 4096) -> list[dict]:
    """Issue rate of one instruction kind per SM per clock (tanh.approx.f32, ex2.approx.f32,
    fp32 FMA): 4 CTAs of 256 threads an SM, each thread 8 independent chains of `iters`
    instructions; per SM the instructions of its CTAs over its clock's span from the first
    start to the last end (however the scheduler placed and overlapped the CTAs), the median
    over the SMs. What a nonlinear recurrence's elementwise work can cost at best."""
    ext = extension.load("dev")
    warm_up()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, threads = 4 * sms, 256
    out = torch.zeros(3 * blocks, dtype=torch.int64, device="cuda")
    sink = torch.zeros(1, device="cuda")
    recs = []
    for k, name in enumerate(THROUGHPUT_OPS):
        for _ in range(3):  # the last launch counts
            ext.throughput(k, blocks, threads, iters, out, sink)
        torch.cuda.synchronize()
        rates = sm_rates(out, threads * 8 * iters)
        recs.append(records.make("bench", "primitive", name, {"measure": "throughput", "op": name,
                                                             "blocks": blocks, "threads": threads},
                                 {"per_clock_per_sm": rates.median().item(), "min": rates.min().item(),
                                  "max": rates.max().item(), "sms": len(rates)}))
    return recs


def trace_record(entry: Entry, B: int, D: int, T: int = T_DEFAULT) -> dict | None:
    """Where a persistent forward step of the entry's epilogue spends its time: CTA 0's
    clock at six boundaries of every step, as median nanoseconds per named phase; None
    where the persistent kernel does not take the size."""
    if op.plan(B, D, torch.bfloat16) != "persistent":
        return None
    ext = extension.load("dev")
    g = torch.Generator(device="cuda").manual_seed(1234)
    s = {k: v.detach().to(torch.bfloat16) for k, v in
         inputs.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g).items()}
    gates = tuple(s["z"] if i == 0 else torch.randn_like(s["z"]) for i in range(gate_count(entry.epilogue)))
    out, h_all = torch.empty_like(s["x"]), s["x"].new_empty(T + 1, B, D)
    trace = torch.zeros(T * 6 + 4, dtype=torch.int64, device="cuda")
    for _ in range(3):
        ext.dense_forward_traced(op.epilogue_id(entry.epilogue), s["x"], gates, s["w_h"], s["b"],
                                 s["h0"], out, h_all, trace)
    torch.cuda.synchronize()
    tr = trace.cpu()
    clocks = tr[: T * 6].view(T, 6)[T // 8:]  # steady state: skip the first steps
    c0, g0, c1, g1 = tr[T * 6:].tolist()
    ghz = (c1 - c0) / (g1 - g0)
    phases = (clocks[:, 1:] - clocks[:, :-1]).double().median(dim=0).values / ghz
    step = (clocks[1:, 0] - clocks[:-1, 0]).double().median().item() / ghz
    return records.make("bench", entry.name, "cuda:persistent",
                        {"measure": "trace", **Shape(T, B, D).params(), "dtype": "bfloat16"},
                        {"sm_clock_ghz": ghz, "step_ns": step,
                         "phase_ns": dict(zip(TRACE_PHASES, phases.tolist()))})


def copy_record() -> dict:
    """Measure 'copy': `core.timing.copy_bandwidth` as a record (gb_per_s counts bytes read and
    written)."""
    copy = copy_bandwidth()
    return records.make("bench", "primitive", "copy", {"measure": "copy", "bytes": copy["bytes"]},
                        {"ms": copy["ms"], "gb_per_s": copy["gbs"]})


def floor_records(parts: tuple[str, ...] = ("copy", "throughput", "clock")) -> list[dict]:
    """The floor's primitives (`parts` of them): copy bandwidth, tanh.approx and FMA issue
    rates, the SM clock."""
    out = []
    if "copy" in parts:
        out.append(copy_record())
    if "throughput" in parts:
        out += throughput_records()
    if "clock" in parts:
        out += clock_records()
    return out
