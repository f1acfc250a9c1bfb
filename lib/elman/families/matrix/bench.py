"""The matrix family's recurrence benchmark and the floor it stands against (bf16 q, k, v; fp32
decay and state), timed as core.timing times.

- `recurrence_record`: one thread layout (`group`) at one checkpoint interval K: the raw op's
  forward, backward (from the forward's checkpoints) and forward + backward, their ratio, the
  peak memory of one forward + backward, and the bytes each direction must move
  (`traffic_bytes`). Params carry the layout and K.
- the floor's primitives (measures 'copy', 'throughput', 'clock') are measured by
  elman.harness.probes.floor_records on the same GPU: a device-to-device copy's bandwidth, the
  issue rates of tanh.approx and FP32 FMA per SM and clock, the SM clock under FMA work.
- `floor`: per direction, the time its bytes take at the copy bandwidth and the time its tanh
  and FMA-pipe instructions take at the measured rates; the largest bounds any kernel
  (`floor_table`; `standing_table` puts every timed layout against it).
- `chapter_records`: the E88 and E75 chapters' runs: every layout at every K, the primitives,
  and the whole layer at every K (and on the fastest recurrence's layout) beside the baselines,
  each record written when it is measured
  and skipped where the run already holds it (`record_key`), so a rerun resumes.

`elman bench` times the cell of the CELL_LEVELS (`cell_records`, every layout at K = 16); at the
seed study's 480M shape that is `elman bench --levels E88h83n32 fla-gdn mamba2 --B 16 --D 1920
--T 512`, which also times the whole layers beside each other.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, rotation, timeit
from . import inputs, op


# Every matrix level's core runs the same op; these stand for the family in `elman bench` (the
# generic E88 and E75 levels and the seed study's 480M E88 geometry), which keeps the run short.
CELL_LEVELS = ("E88", "E88h83n32", "E75", "E75h4n32")

# FP32-pipe instructions a state element costs a step (the step's math, schedule.py): forward, the
# read-out S^T k, the update alpha S + k delta^T (a multiply and an FMA) and the output S^T q;
# backward, the recompute (read-out and update: 3) and the walk (dS += q do^T, dq, 1 - S^2 and its
# product, d decay, d delta, dk's two sums, dS_{t-1}'s multiply and FMA: 10).
FMA_OPS = {"fwd": 4, "bwd": 13}
# tanh.approx a state element a step: the forward's, and the backward's recompute of each state
# once (a schedule that keeps a whole chunk on chip; fewer slots recompute more).
TANH_PASSES = {"fwd": 1, "bwd": 1}
BOUNDS = ("memory", "tanh", "fma")


def has_cell(entry: Entry) -> bool:
    return entry.family == "matrix" and entry.name in CELL_LEVELS


def last_impl() -> str:
    return "cuda:matrix"


def impl_name(group: int, n: int, v: int, slots: int = 0) -> str:
    """'cuda:matrix:warp', 'cuda:matrix:ring', 'cuda:matrix:tiled' (each with ':slots<s>' where the
    backward's slots were set) or 'cuda:matrix:G4' (four threads a value column), the default
    resolved."""
    name = op.layout_name(n, v, group)
    return f"cuda:matrix:{name}" + (f":slots{slots}" if slots and name != "G4" else "")


def layouts(n: int, v: int) -> list[int]:
    """The explicit layouts (`group`) that run at (n, v): the warp kernels and their cp.async ring
    where they fit, the tiled kernels, the column groups. The default is one of them."""
    return [g for g in op.layouts(n, v) if g != 0]


def geometry(entry: Entry, D: int) -> tuple[int, int, int, str]:
    """(H, n, v, decay kind) of the entry's layer at width D (built on the meta device)."""
    with torch.device("meta"):
        layer = entry.layer(D, 1.0, backend="reference")
    H, n = layer.H, layer.n
    return H, n, getattr(layer, "v", n), getattr(entry.reference, "decay_kind", "scalar")


def memory_bytes(T: int, B: int, H: int, n: int, v: int, column: bool, K: int = op.CHECKPOINT,
                 dtype_bytes: int = 2) -> dict[str, int]:
    """Bytes of what the recurrence keeps in global memory: q, k, v and the decay ('inputs'), o
    ('outputs'), one state a head ('state'), the ceil(T / K) checkpoints (fp32 states, from the
    forward to the backward) and the column groups' backward scratch (K + 1 states a head)."""
    heads, state = B * H, B * H * n * v * 4
    return {"inputs": T * heads * ((2 * n + v) * dtype_bytes + 4 * (v if column else 1)),
            "outputs": T * heads * v * dtype_bytes, "state": state,
            "checkpoints": op.checkpoints(T, K) * state, "scratch": (min(K, T) + 1) * state}


def traffic_bytes(T: int, B: int, H: int, n: int, v: int, column: bool, K: int = op.CHECKPOINT,
                  dtype_bytes: int = 2) -> dict[str, int]:
    """Bytes the recurrence cannot avoid moving. Forward: reads q, k, v, the decay and h0, writes
    o, S_T and the checkpoints. Backward: reads q, k, v, the decay, d_o, d S_T and the
    checkpoints, writes dq, dk, dv, d decay and dh0. The states between checkpoints stay on
    chip."""
    m = memory_bytes(T, B, H, n, v, column, K, dtype_bytes)
    fixed = m["checkpoints"] + 2 * m["state"]
    return {"fwd_bytes": m["inputs"] + m["outputs"] + fixed, "bwd_bytes": 2 * m["inputs"] + m["outputs"] + fixed,
            "ckpt_bytes": m["checkpoints"]}


def _sets(T, B, H, n, v, decay, count, dtype):
    g = torch.Generator(device="cuda").manual_seed(1234)
    names = ("q", "k", "v", "decay", "h0")
    out = []
    for _ in range(count):
        kw = inputs.random_inputs(T, B, H, n, v, names, "cuda", g, decay)
        s = {k: t.detach().to(dtype if k in ("q", "k", "v") else torch.float32).contiguous()
             for k, t in kw.items()}
        s["d_o"] = torch.randn(T, B, H, v, device="cuda", dtype=dtype, generator=g)
        s["d_ST"] = torch.randn(B, H, n, v, device="cuda", generator=g)
        out.append(s)
    return out


def input_sets(entry: Entry, B: int, D: int, T: int = T_DEFAULT, quick: bool = False) -> list[dict]:
    """Random bf16 inputs of the entry's core at (B, D), as many sets as keep the L2 from serving
    them."""
    H, n, v, decay = geometry(entry, D)
    moved = traffic_bytes(T, B, H, n, v, decay == "column")
    return _sets(T, B, H, n, v, decay, 2 if quick else rotation(moved["bwd_bytes"]), torch.bfloat16)


def recurrence_record(level: str, sets: list[dict], D: int, K: int, group: int, slots: int = 0,
                      reps: int = 30) -> dict:
    """Measure 'recurrence' of one layout at checkpoint interval K on `input_sets` (the level's
    at width D)."""
    step, n_sets = "tanh", len(sets)
    T, B, H, n = sets[0]["k"].shape
    v = sets[0]["v"].shape[-1]
    moved = traffic_bytes(T, B, H, n, v, sets[0]["decay"].dim() == 4, K)

    def fwd(i):
        s = sets[i]
        return op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)[2]

    ckpts = [fwd(i) for i in range(n_sets)]

    def bwd(i, ck=None):
        s = sets[i]
        op.backward(s["q"], s["k"], s["v"], s["decay"], None, ckpts[i] if ck is None else ck, s["d_o"], s["d_ST"],
                    step, K, group, slots)

    tf, tb = timeit(fwd, reps, 3, n_sets), timeit(bwd, reps, 3, n_sets)
    tfb = timeit(lambda i: bwd(i, fwd(i)), reps, 3, n_sets)
    del ckpts
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    bwd(0, fwd(0))
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    params = {"measure": "recurrence", **Shape(T, B, D, H, n, v).params(), "K": K, "group": group, "slots": slots,
              "layout": op.layout_name(n, v, group), "dtype": "bfloat16"}
    return records.make("bench", level, impl_name(group, n, v, slots), params,
                        {"fwd_ms": tf, "bwd_ms": tb, "fwdbwd_ms": tfb,
                         "bwd_over_fwd": tb["median"] / tf["median"],
                         "per_step_us": 1000 * tf["median"] / T, "peak_mem_mb": peak, **moved})


def _core_passed(entry: Entry, gate: dict[str, bool] | None) -> bool:
    core = [ok for impl, ok in (gate or {}).items() if impl.startswith("cuda:core")]
    if gate is not None and not (core and all(core)):
        print(f"bench: skipping {entry.name} recurrence: the core has no passing parity in this run")
        return False
    return True


def _kernel_takes(entry: Entry, D: int) -> bool:
    H, n, v, _ = geometry(entry, D)
    if not op.supported(n, v):
        print(f"bench: skipping {entry.name} at D={D}: n={n}, v={v} has no kernel")
        return False
    return True


def cell_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                 quick: bool = False, gate: dict[str, bool] | None = None,
                 K: int = op.CHECKPOINT) -> list[dict]:
    """Measure 'recurrence' at batch B, the entry's heads and state at width D, every layout."""
    if not (_core_passed(entry, gate) and _kernel_takes(entry, D)):
        return []
    sets = input_sets(entry, B, D, T, quick)
    n, v = sets[0]["k"].shape[-1], sets[0]["v"].shape[-1]
    out = [recurrence_record(entry.name, sets, D, K, group, 0, reps) for group in layouts(n, v)]
    del sets
    torch.cuda.empty_cache()
    return out


def recurrent_layer_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False, gate: dict[str, bool] | None = None) -> list[dict]:
    """None: a matrix variant's whole layer is timed by `elman bench`'s layer records."""
    return []


# ---- the floor ----------------------------------------------------------------------------
def primitives(recs: list[dict]) -> dict[str, float] | None:
    """The measured primitives among `recs` (one run's): copy GB/s (read + write), tanh.approx
    and FMA a clock per SM, the SM clock (GHz) under FMA work on the most SMs probed, the SMs;
    None where one is missing."""
    copy = [r for r in recs if r["params"].get("measure") == "copy"]
    rate = {r["params"]["op"]: r["metrics"]["per_clock_per_sm"] for r in recs
            if r["params"].get("measure") == "throughput"}
    clock = [r for r in recs if r["params"].get("measure") == "clock" and r["params"].get("work") == "fma"]
    if not copy or not clock or "tanh_approx" not in rate or "fma" not in rate:
        return None
    c = max(clock, key=lambda r: r["params"]["sms"])
    return {"gb_per_s": copy[-1]["metrics"]["gb_per_s"], "tanh": rate["tanh_approx"], "fma": rate["fma"],
            "ghz": c["metrics"]["ghz"], "sms": c["env"]["sm_count"]}


def floor(rec: dict, prims: dict[str, float]) -> dict[str, dict[str, float]]:
    """Milliseconds each resource alone needs for a recurrence record's work, per direction:
    {"fwd" | "bwd": {"memory", "tanh", "fma"}}. memory: the direction's bytes at the copy
    bandwidth; tanh and fma: TANH_PASSES and FMA_OPS a state element a step at the measured rates
    and clock."""
    p, m = rec["params"], rec["metrics"]
    elements = p["T"] * p["B"] * p["H"] * p["n"] * p["v"]
    per_ms = prims["sms"] * prims["ghz"] * 1e6  # SM clocks a millisecond, all SMs
    return {d: {"memory": m[f"{d}_bytes"] / prims["gb_per_s"] / 1e6,
                "tanh": TANH_PASSES[d] * elements / (prims["tanh"] * per_ms),
                "fma": FMA_OPS[d] * elements / (prims["fma"] * per_ms)} for d in ("fwd", "bwd")}


def _bound(parts: dict[str, float]) -> tuple[str, float]:
    name = max(BOUNDS, key=lambda b: parts[b])
    return name, parts[name]


def primitive_lines(recs: list[dict]) -> str:
    """The measured primitives as a sentence, or what is missing."""
    prims = primitives(recs)
    if prims is None:
        return "- No primitive records (copy, throughput, clock) in this run: the floor cannot be stated."
    return (f"- Measured on this GPU ({prims['sms']} SMs): a device-to-device copy moves "
            f"{prims['gb_per_s']:,.0f} GB/s (read + write); tanh.approx issues {prims['tanh']:.1f} and FP32 "
            f"FMA {prims['fma']:.1f} a clock per SM; the SM clock under FMA work is {prims['ghz']:.2f} GHz.")


def _recurrences(recs: list[dict], level: str | None = None, B: int | None = None, D: int | None = None) -> list[dict]:
    return [r for r in recs if r["params"].get("measure") == "recurrence"
            and (level is None or r["variant"] == level)
            and (B is None or (r["params"]["B"], r["params"]["D"]) == (B, D))]


def _fastest(rows: list[dict], metric: str = "fwdbwd_ms") -> dict | None:
    return min(rows, key=lambda r: r["metrics"][metric]["median"], default=None)


def _layout(r: dict) -> str:
    """'warp, K = 8': a recurrence or layer record's layout and checkpoint interval."""
    p = r["params"]
    parts = r["impl"].split(":")  # cuda:matrix:<layout>[:slots<s> | :K<k>]
    name = p.get("layout") or (parts[2] if len(parts) > 2 else r["impl"])
    return f"{name}, K = {p.get('K', p.get('checkpoint', op.CHECKPOINT))}"


def floor_table(recs: list[dict], level: str | None = None) -> str:
    """The floor of each shape and K the level's recurrence was timed at, per direction: the
    bytes it must move and the milliseconds memory, tanh and FMA each need alone; the largest is
    the floor. (The floor depends on the work, not on the layout.)"""
    prims = primitives(recs)
    if prims is None:
        return primitive_lines(recs)
    shapes = {}
    for r in _recurrences(recs, level):
        p = r["params"]
        shapes.setdefault((r["variant"], p["T"], p["B"], p["H"], p["n"], p["v"], p["K"]), r)
    lines = ["| level | B | H | n | v | K | direction | MB moved | memory (ms) | tanh (ms) | FMA (ms) | floor (ms) |",
             "|---" * 12 + "|"]
    for (name, T, B, H, n, v, K), r in sorted(shapes.items()):
        f = floor(r, prims)
        for d, label in (("fwd", "forward"), ("bwd", "backward")):
            c = f[d]
            lines.append(f"| {name} | {B} | {H} | {n} | {v} | {K} | {label} | {r['metrics'][f'{d}_bytes'] / 1e6:,.0f} "
                         f"| {c['memory']:.3f} | {c['tanh']:.3f} | {c['fma']:.3f} | {_bound(c)[1]:.3f} ({_bound(c)[0]}) |")
    return "\n".join(lines)


def standing_table(recs: list[dict], level: str | None = None) -> str:
    """Where each timed layout stands against the floor of its work: measured / floor per
    direction and for forward + backward, and the forward's time a step (every warp or CTA
    takes one step of its head in that time)."""
    prims = primitives(recs)
    if prims is None:
        return primitive_lines(recs)
    lines = ["| level | layout | K | forward (ms) | x floor | backward (ms) | x floor | fwd + bwd x floor "
             "| forward step (ns) |", "|---" * 9 + "|"]
    for r in sorted(_recurrences(recs, level), key=lambda r: (r["variant"], r["metrics"]["fwdbwd_ms"]["median"])):
        f, m = floor(r, prims), r["metrics"]
        ff, fb = _bound(f["fwd"])[1], _bound(f["bwd"])[1]
        tf, tb = m["fwd_ms"]["median"], m["bwd_ms"]["median"]
        lines.append(f"| {r['variant']} | {_layout(r).split(',')[0]} | {r['params']['K']} | {tf:.3f} | {tf / ff:.1f} "
                     f"| {tb:.3f} | {tb / fb:.1f} | {m['fwdbwd_ms']['median'] / (ff + fb):.1f} "
                     f"| {1e6 * tf / r['params']['T']:.0f} |")
    return "\n".join(lines)


# ---- tables and plots for the chapters (markdown, from records) ----------------------------
def recurrence_table(recs: list[dict]) -> str:
    """One row per 'recurrence' record: times, backward / forward, peak memory, and the
    bandwidth the unavoidable bytes imply at the measured times."""
    lines = ["| level | implementation | B | H | n | v | K | forward (ms) | backward (ms) | bwd / fwd "
             "| fwd + bwd (ms) | peak memory (MB) | fwd GB/s | bwd GB/s |", "|---" * 14 + "|"]
    for r in _recurrences(recs):
        p, m = r["params"], r["metrics"]
        f, b = m["fwd_ms"]["median"], m["bwd_ms"]["median"]
        lines.append(f"| {r['variant']} | {r['impl']} | {p['B']} | {p['H']} | {p['n']} | {p['v']} | {p['K']} | {f:.3f} "
                     f"| {b:.3f} | {m['bwd_over_fwd']:.2f} | {m['fwdbwd_ms']['median']:.3f} "
                     f"| {m['peak_mem_mb']:.0f} | {m['fwd_bytes'] / f / 1e6:.0f} | {m['bwd_bytes'] / b / 1e6:.0f} |")
    return "\n".join(lines)


def plot(recs: list[dict], level: str, B: int, D: int, title: str = ""):
    """Forward and backward (ms) of every layout and K at one shape, with each direction's floor
    where the run holds the primitives (black ticks); None without records."""
    rows = sorted(_recurrences(recs, level, B, D), key=lambda r: r["metrics"]["fwdbwd_ms"]["median"])
    if not rows:
        return None
    import matplotlib.pyplot as plt

    prims = primitives(recs)
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rows)), 3.4))
    for d, shift, label in (("fwd", -0.2, "forward"), ("bwd", 0.2, "backward")):
        ax.bar([i + shift for i in x], [r["metrics"][f"{d}_ms"]["median"] for r in rows], 0.4, label=label)
        if prims is not None:
            ax.scatter([i + shift for i in x], [_bound(floor(r, prims)[d])[1] for r in rows], marker="_", s=300,
                       color="black", label=f"{label} floor")
    ax.set_xticks(list(x), [_layout(r) for r in rows], rotation=30, ha="right")
    ax.set_ylabel("ms (median)")
    ax.set_title(title or f"{level} recurrence, B = {B}, d = {D}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _layers(recs: list[dict], B: int, D: int) -> dict[str, dict]:
    """The fastest layer record (forward + backward) of each level at (B, D)."""
    out: dict[str, dict] = {}
    for r in recs:
        p = r["params"]
        if p.get("measure") == "layer" and (p["B"], p["D"]) == (B, D):
            old = out.get(r["variant"])
            if old is None or r["metrics"]["fwdbwd_ms"]["median"] < old["metrics"]["fwdbwd_ms"]["median"]:
                out[r["variant"]] = r
    return out


def target_table(recs: list[dict], level: str, B: int, D: int, beside: tuple[str, ...] = ("fla-gdn", "mamba2")) -> str:
    """The issue's target table at one shape: the fastest recurrence (forward + backward) of the
    level, its fastest whole layer and the layers beside it."""
    rec = _fastest(_recurrences(recs, level, B, D))
    layers = _layers(recs, B, D)
    lines = ["| measure | layout | forward (ms) | backward (ms) | bwd / fwd | fwd + bwd (ms) | peak memory (MB) |",
             "|---|---|---|---|---|---|---|"]
    if rec is not None:
        m = rec["metrics"]
        lines.append(f"| {level} recurrence | {_layout(rec)} | {m['fwd_ms']['median']:.3f} | {m['bwd_ms']['median']:.3f} "
                     f"| {m['bwd_over_fwd']:.2f} | {m['fwdbwd_ms']['median']:.3f} | {m['peak_mem_mb']:.0f} |")
    for name in (level, *beside):
        if name in layers:
            r = layers[name]
            m = r["metrics"]
            how = _layout(r) if name == level else r["impl"]
            lines.append(f"| {name} layer | {how} | {m['fwd_ms']['median']:.3f} | — | — | {m['fwdbwd_ms']['median']:.3f} "
                         f"| {m['peak_mem_mb']:.0f} |")
    return "\n".join(lines) if len(lines) > 2 else f"- No records of {level} at B = {B}, D = {D}: no target table."


def target_lines(recs: list[dict], level: str, B: int, D: int, bwd_over_fwd: float = 1.5,
                 fwdbwd_ms: float = 0.5, beside: tuple[str, ...] = ("fla-gdn", "mamba2")) -> str:
    """The issue's targets at one shape, each stated as met or not from the records: the fastest
    recurrence's ratio and forward + backward, where it stands against the floor, and the whole
    layer (its fastest K) against each level beside it."""
    mine = _recurrences(recs, level, B, D)
    rec = _fastest(mine)
    if rec is None:
        return f"- No recurrence record of {level} at B = {B}, D = {D}: the targets cannot be stated."
    m, p = rec["metrics"], rec["params"]
    ratio, total = m["bwd_over_fwd"], m["fwdbwd_ms"]["median"]
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    out = [f"- Fastest forward + backward: {rec['impl']} at K = {p['K']} (of {len(mine)} layouts and intervals timed).",
           f"- Recurrence backward / forward at B = {B}, H = {p['H']}, n = {p['n']}, v = {p['v']}: "
           f"{ratio:.2f} (target <= {bwd_over_fwd}: {met(ratio <= bwd_over_fwd)}).",
           f"- Recurrence forward + backward: {total:.3f} ms (target <= {fwdbwd_ms} ms: {met(total <= fwdbwd_ms)})."]
    prims = primitives(recs)
    if prims is not None:
        f = floor(rec, prims)
        (nf, ff), (nb, fb) = _bound(f["fwd"]), _bound(f["bwd"])
        out.append(f"- Floor of that layout's work: forward {ff:.3f} ms ({nf}), backward {fb:.3f} ms ({nb}); "
                   f"measured {m['fwd_ms']['median'] / ff:.1f}x and {m['bwd_ms']['median'] / fb:.1f}x of it.")
    layers = _layers(recs, B, D)
    if level in layers:
        ours = layers[level]
        t = ours["metrics"]["fwdbwd_ms"]["median"]
        for other in (o for o in beside if o in layers):
            theirs = layers[other]["metrics"]
            tt = theirs["fwdbwd_ms"]["median"]
            goal = f"; target faster than {other}: {met(t < tt)}" if other == beside[0] else ""
            out.append(f"- Whole layer forward + backward ({_layout(ours)}): {level} {t:.2f} ms, {other} {tt:.2f} ms "
                       f"({other} / {level} = {tt / t:.2f}{goal}); peak memory {ours['metrics']['peak_mem_mb']:.0f} MB "
                       f"vs {theirs['peak_mem_mb']:.0f} MB.")
    return "\n".join(out)


# ---- the chapters' runs ------------------------------------------------------------------------
def fastest(recs: list[dict], variant: str, B: int, D: int, T: int) -> tuple[int, int] | None:
    """(K, layout) of the level's fastest recurrence forward + backward among `recs` at the shape;
    None if none is recorded."""
    r = _fastest([r for r in _recurrences(recs, variant, B, D) if r["params"]["T"] == T])
    return None if r is None else (r["params"]["K"], r["params"].get("group", 0))


def record_key(r: dict) -> tuple:
    """What a record measured, as `chapter_records` plans it: a recurrence by level, shape, K and
    layout; a layer by level, shape and checkpoint interval; a primitive by its measure."""
    p = r["params"]
    m = p.get("measure")
    if m == "recurrence":
        return (m, r["variant"], p["T"], p["B"], p["D"], p["K"], p.get("group", 0), p.get("slots", 0))
    if m == "layer":
        return (m, r["variant"], p["T"], p["B"], p["D"], p.get("checkpoint"), p.get("group", 0))
    return (m,)


def chapter_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, Ks: tuple[int, ...] = (op.CHECKPOINT,),
                    beside: tuple[Entry, ...] = (), quick: bool = False, gate: dict[str, bool] | None = None,
                    reps: int = 30, *, layer_record: Callable[..., dict],
                    primitive_records: Callable[[tuple[str, ...]], list[dict]]) -> list[dict]:
    """A chapter's benchmark run into the current run folder: the entry's recurrence on every
    layout at every K, the floor's primitives, the entry's whole layer at every K (with the default
    layout, and also at the fastest recurrence's K and layout where that layout is another) and each entry
    of `beside` at its default. The harness gives `layer_record(entry, B, D, T, quick=, **options)`
    (a whole layer) and `primitive_records(parts)` (the floor's primitives: 'copy', 'throughput',
    'clock'). Each record is written as soon as it is measured; what the run already holds is
    not measured again. Returns the new records."""
    run = records.run_dir()
    done = {record_key(r) for r in records.read([run], kind="bench")}
    new: list[dict] = []

    def keep(recs: list[dict]) -> None:
        records.write(recs, run)
        new.extend(recs)
        done.update(record_key(r) for r in recs)

    reps = 5 if quick else reps
    ok = _core_passed(entry, gate) and _kernel_takes(entry, D)
    H, n, v, _ = geometry(entry, D)
    todo = [(K, g) for K in Ks for g in layouts(n, v)
            if ("recurrence", entry.name, T, B, D, K, g, 0) not in done] if ok else []
    if todo:
        sets = input_sets(entry, B, D, T, quick)
        for K, g in todo:
            keep([recurrence_record(entry.name, sets, D, K, g, 0, reps)])
        del sets
        torch.cuda.empty_cache()
    missing = tuple(m for m in ("copy", "throughput", "clock") if (m,) not in done)
    if missing:
        try:
            keep(primitive_records(missing))
        except (RuntimeError, ImportError) as exc:  # the development extension did not build
            print(f"primitives: {exc}".splitlines()[0])
    layers = [(entry, K, 0) for K in Ks] if ok and (gate is None or all(gate.values())) else []
    best = fastest(records.read([run], kind="bench"), entry.name, B, D, T)
    if layers and best is not None and op.layout_name(n, v, best[1]) != op.layout_name(n, v):
        layers.append((entry, *best))  # the layer also on the fastest recurrence's layout
    layers += [(e, None, 0) for e in beside]
    for e, K, g in layers:
        if ("layer", e.name, T, B, D, K, g) in done:
            continue
        opts = {} if K is None else {"checkpoint": K, "impl": f"cuda:matrix:{op.layout_name(n, v, g)}:K{K}"}
        if g:
            opts["group"] = g
        try:
            keep([layer_record(e, B, D, T, quick=quick, **opts)])
        except (RuntimeError, ImportError, ValueError) as exc:  # a baseline library missing or refusing
            torch.cuda.empty_cache()
            print(f"{e.name}: {exc}".splitlines()[0])
    return new
